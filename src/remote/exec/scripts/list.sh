# list REL: "N names" (base64 of NUL-ended names), one stat line per name, then "L target"
# for each symlink among them, in order.
at "$1"
follow
[ -e "$P" ] || fail ENOENT "$1"
[ -d "$P" ] || fail ENOTDIR "$1"
[ -r "$P" ] && [ -x "$P" ] || fail EACCES "$1"
set +f
set -- "$P"/* "$P"/.[!.]* "$P"/..?*
set -f
for f; do
  shift
  if [ -e "$f" ] || [ -L "$f" ]; then set -- "$@" "$f"; fi
done
if [ $# -gt 0 ]; then
  st=$(printf '%s\0' "$@" | xargs -0 stat -c "$SF" --) || fail EAGAIN "changed while listed"
fi
ok
printf 'N '
for f; do printf '%s\0' "${f##*/}"; done | base64 | tr -d '\n'
echo
[ $# -gt 0 ] && printf '%s\n' "$st"
for f; do
  if [ -L "$f" ]; then
    printf 'L '
    readlink -n -- "$f" | base64 | tr -d '\n'
    echo
  fi
done
