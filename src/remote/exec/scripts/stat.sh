# stat REL...: each path's attributes in order (a final symlink not followed), each
# "S statline" [+ "L target"] or "E TOKEN TEXT".
ok
for rel; do
  at "$rel"
  D=${P%/*}
  if [ "$P" != "$ROOT" ] && [ "$D" != "$ROOT" ]; then
    canon "$D"
    if [ -z "$R" ]; then
      o=$(stat -c "$SF" -- "$P" 2>&1) || { printf 'E SYS %s\n' "$o" | tr '\n' ' '; echo; continue; }
    fi
    if ! beneath "$R"; then echo "E EACCES out of the workspace"; continue; fi
  fi
  if o=$(stat -c "$SF" -- "$P" 2>&1); then
    printf 'S %s\n' "$o"
    if [ -L "$P" ]; then
      printf 'L '
      readlink -n -- "$P" | base64 | tr -d '\n'
      echo
    fi
  else
    printf 'E SYS %s' "$o" | tr '\n' ' '
    echo
  fi
done
