# probe: the workspace's canonical path, who runs the programs, and which tools exist.
canon "$ROOT"
[ -n "$R" ] && [ -e "$R" ] || fail ENOENT "$ROOT"
[ -d "$R" ] || fail ENOTDIR "$ROOT"
ok
printf 'R '
printf '%s' "$R" | base64 | tr -d '\n'
echo
echo "U $(id -u) $(id -g)"
echo "G $(id -G)"
t=$(stat -c '%.9Y' -- "$R" 2>/dev/null)
case $t in *[0-9].[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]) echo "F ns" ;; *) echo "F s" ;; esac
for tool in python3 rg getfattr fallocate; do
  command -v "$tool" >/dev/null 2>&1 && echo "T $tool"
done
# The python the fast stat/list/tree path runs (3.6 or later: os.fsencode, *_ns, dir_fd).
for py in python3 python; do
  if command -v "$py" >/dev/null 2>&1 &&
    "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 6) else 1)' >/dev/null 2>&1; then
    echo "Y $py"
    break
  fi
done
exit 0
