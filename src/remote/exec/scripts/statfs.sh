# statfs: the workspace's filesystem.
o=$(stat -f -c '%S %b %f %a %c %d %l' -- "$ROOT" 2>&1) || fail SYS "$o"
ok
echo "F $o"
