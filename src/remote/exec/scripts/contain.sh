# contain LITERAL PATHS: which of PATHS (relative to the workspace, one a line) hold the bytes
# of LITERAL, by `grep -F` in the sandbox (only the names cross back). "C " + base64 of the
# names, each ended by a NUL; an empty name (two NULs) means grep failed on a file.
cd "$ROOT" || fail SYS "$ROOT: cannot enter"
ok
printf 'C '
printf '%s\n' "$2" | tr '\n' '\0' | xargs -0 sh -c '
for f do
  [ -n "$f" ] || continue
  grep -q -F -e "$0" -- "$f" 2>/dev/null
  case $? in 0) printf "%s\0" "$f" ;; 1) ;; *) printf "\0\0" ;; esac
done' "$1" | base64 | tr -d '\n'
echo
