# tree REL: "N paths" (base64 of NUL-ended paths under REL, relative to it), then one stat
# line per path. Symlink targets are asked for afterwards (stat).
at "$1"
follow
[ -e "$P" ] || fail ENOENT "$1"
[ -d "$P" ] || fail ENOTDIR "$1"
T=${TMPDIR:-/tmp}/.sbxfs-tree.$$
trap 'rm -f -- "$T"' EXIT
cd -- "$P" || fail EACCES "$1"
find . -mindepth 1 -print0 >"$T" 2>/dev/null || fail EAGAIN "changed while listed"
if [ -s "$T" ]; then
  st=$(xargs -0 stat -c "$SF" -- <"$T") || fail EAGAIN "changed while listed"
fi
ok
printf 'N '
base64 <"$T" | tr -d '\n'
echo
[ -s "$T" ] && printf '%s\n' "$st"
exit 0
