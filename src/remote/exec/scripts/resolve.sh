# resolve REL: where a content operation on REL lands (a final symlink followed, inside only).
at "$1"
follow
[ -e "$P" ] || fail ENOENT "$1"
ok
printf 'R '
printf '%s' "$P" | base64 | tr -d '\n'
echo
