# tree REL: "N paths" (base64 of NUL-ended paths under REL, relative to it), then one stat
# line per path. Symlink targets are asked for afterwards (stat).
at "$1"
follow
[ -e "$P" ] || fail ENOENT "$1"
[ -d "$P" ] || fail ENOTDIR "$1"
# mktemp: a name nobody in the sandbox could have planted a symlink at.
T=$(mktemp) || fail EIO "mktemp failed"
trap 'rm -f -- "$T"' EXIT
cd -- "$P" || fail EACCES "$1"
# What find cannot enter (no permission, gone meanwhile) is left out, as from a listing.
find . -mindepth 1 -print0 >"$T" 2>/dev/null
if [ -s "$T" ]; then
  st=$(xargs -0 stat -c "$SF" -- <"$T") || fail EAGAIN "changed while listed"
fi
ok
printf 'N '
base64 <"$T" | tr -d '\n'
echo
[ -s "$T" ] && printf '%s\n' "$st"
exit 0
