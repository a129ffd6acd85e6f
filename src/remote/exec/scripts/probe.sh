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
exit 0
