# resolve REL [regular]: where a content operation on REL lands (a final symlink followed,
# inside only); with "regular", it must be a regular file, and its stat line follows (the
# version of what the transport's own download will fetch).
at "$1"
follow
[ -e "$P" ] || fail ENOENT "$1"
if [ "${2:-}" = regular ]; then
  [ -d "$P" ] && fail EISDIR "$1"
  [ -f "$P" ] || fail EINVAL "$1: not a regular file"
  a=$(stat -L -c "$SF" -- "$P" 2>&1) || fail SYS "$a"
fi
ok
printf 'R '
printf '%s' "$P" | base64 | tr -d '\n'
echo
[ "${2:-}" != regular ] || printf 'S %s\n' "$a"
