# resolve REL: where a content operation on REL lands (a final symlink followed, inside only).
at "$1"
follow
[ -e "$P" ] || fail ENOENT "$1"
ok
printf 'R '
printf '%s' "$P" | base64 | tr -d '\n'
echo
# For a read through the transport's own download: the version of what it will fetch.
if [ "${2:-}" = regular ]; then
  [ -d "$P" ] && fail EISDIR "$1"
  [ -f "$P" ] || fail EINVAL "$1: not a regular file"
  a=$(stat -L -c "$SF" -- "$P" 2>&1) || fail SYS "$a"
  printf 'S %s\n' "$a"
fi
