# read REL OFFSET LEN: the version fields (stat line, followed) before the read, the bytes as
# they are (no encoding: the output is binary-safe and the caller knows where they end), then
# "E RC STAT": tail's status and the stat line after. The caller compares the two stat lines
# (a file changed during the read is read again).
at "$1"
follow
[ -e "$P" ] || fail ENOENT "$1"
[ -d "$P" ] && fail EISDIR "$1"
[ -f "$P" ] || fail EINVAL "$1: not a regular file"
a=$(stat -L -c "$SF" -- "$P" 2>&1) || fail SYS "$a"
ok
printf 'S %s\n' "$a"
{ __rc=$({ { tail -c +"$(($2 + 1))" -- "$P" 2>/dev/null; echo $? >&3; } | head -c "$3" >&4; } 3>&1); } 4>&1
b=$(stat -L -c "$SF" -- "$P" 2>/dev/null) || b=gone
printf '\nE %s %s\n' "$__rc" "$b"
