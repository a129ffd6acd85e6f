# scan REL START END MAX: scripts/scan.sh (the text in $5) over the file; its output in
# base64 (only the window crosses).
at "$1"
follow
ok
printf 'W '
printf '%s\n' "$5" | sh -s -- "$P" "$2" "$3" "$4" | base64 | tr -d '\n'
echo
