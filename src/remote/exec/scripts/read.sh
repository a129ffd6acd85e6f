# read REL OFFSET LEN: the version fields (stat line, followed) and the bytes in base64.
at "$1"
follow
[ -e "$P" ] || fail ENOENT "$1"
[ -d "$P" ] && fail EISDIR "$1"
[ -f "$P" ] || fail EINVAL "$1: not a regular file"
a=$(stat -L -c "$SF" -- "$P" 2>&1) || fail SYS "$a"
d=$(tail -c +"$(($2 + 1))" -- "$P" 2>/dev/null | head -c "$3" | base64 | tr -d '\n') || fail SYS "$P: Input/output error"
b=$(stat -L -c "$SF" -- "$P" 2>&1) || fail SYS "$b"
[ "$a" = "$b" ] || fail EAGAIN "changed while read"
ok
printf 'S %s\nD %s\n' "$a" "$d"
