# Extended attributes, a final symlink not followed: OP REL [NAME [VALUE FLAG]].
op=$1
at "$2"
parent_ok
[ -e "$P" ] || [ -L "$P" ] || fail ENOENT "$2"
command -v getfattr >/dev/null 2>&1 && command -v setfattr >/dev/null 2>&1 ||
  fail EOPNOTSUPP "extended attributes: no getfattr/setfattr in the sandbox"
run() { o=$("$@" 2>&1) || fail SYS "$o"; }
has() { getfattr -h --absolute-names -n "$1" -- "$P" >/dev/null 2>&1; }
case $op in
get)
  o=$(getfattr -h --absolute-names --only-values -n "$3" -- "$P" 2>&1 >/dev/null) || fail SYS "$o"
  ok
  printf 'V '
  getfattr -h --absolute-names --only-values -n "$3" -- "$P" 2>/dev/null | base64 | tr -d '\n'
  echo
  ;;
list)
  o=$(getfattr -h --absolute-names -m - -- "$P" 2>&1 >/dev/null) || fail SYS "$o"
  ok
  getfattr -h --absolute-names -m - -- "$P" 2>/dev/null | while IFS= read -r n; do
    case $n in '' | '# file: '*) continue ;; esac
    printf 'X '
    printf '%s' "$n" | base64 | tr -d '\n'
    echo
  done
  ;;
set)
  case $5 in
  create) has "$3" && fail EEXIST "$2: attribute $3" ;;
  replace) has "$3" || fail ENODATA "$2: attribute $3" ;;
  esac
  # setfattr takes "0s" (an empty base64 value) as no value at all.
  if [ -z "$4" ]; then v=''; else v=0s$4; fi
  run setfattr -h -n "$3" -v "$v" -- "$P"
  ok
  ;;
remove)
  run setfattr -h -x "$3" -- "$P"
  ok
  ;;
*) fail EINVAL "unknown operation $op" ;;
esac
