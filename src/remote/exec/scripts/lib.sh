# lib.sh: helpers every exec-only program shares (POSIX sh: dash, busybox ash, bash).
# Before this: ROOT (the workspace, canonical), SF (the stat format), VF (the version
# fields' format) and the positional parameters, all decoded from base64 literals.
# Output: anything, then one line __RESULT__, then "ok" and the answer, or "err TOKEN TEXT".

# The marker on a line of its own, whatever was printed before it.
res() { printf '\n__RESULT__\n'; }
ok() { res; echo ok; }
# fail TOKEN TEXT: TOKEN is an errno name, SYS (TEXT is a tool's message ending in the
# strerror text), CONFLICT (TEXT: the current stat line, or "absent") or EAGAIN.
fail() {
  res
  printf 'err %s ' "$1"
  shift
  printf '%s' "$*" | tr '\n' ' '
  echo
  exit 0
}
# at REL: P is REL's absolute path.
at() { if [ -z "$1" ]; then P=$ROOT; else P=$ROOT/$1; fi; }
# canon ABS: R is ABS with every symlink resolved ("" when it cannot be).
canon() {
  R=$(realpath -- "$1" 2>/dev/null && printf x)
  R=${R%?x}
}
# beneath ABS: whether ABS is ROOT or under it.
beneath() {
  case $1 in "$ROOT" | "$ROOT"/*) return 0 ;; esac
  return 1
}
# parent_ok: P's directory resolves inside ROOT (P itself is not followed).
parent_ok() {
  [ "$P" = "$ROOT" ] && return 0
  D=${P%/*}
  [ "$D" = "$ROOT" ] && return 0
  canon "$D"
  [ -n "$R" ] || fail SYS "$D: No such file or directory"
  beneath "$R" || fail EACCES "$D: leads out of the workspace"
  [ -d "$R" ] && return 0
  [ -e "$R" ] && fail ENOTDIR "$D"
  fail ENOENT "$D"
}
# follow: P, with symlinks followed, stays inside ROOT; P becomes where it leads.
follow() {
  parent_ok
  if [ -L "$P" ]; then
    canon "$P"
    [ -n "$R" ] || fail SYS "$P: No such file or directory"
    beneath "$R" || fail EACCES "$P: leads out of the workspace"
    P=$R
  fi
}
# attrs ABS: ABS's stat line (not followed), and its target if a symlink.
attrs() {
  S=$(stat -c "$SF" -- "$1" 2>&1) || fail SYS "$S"
  printf 'S %s\n' "$S"
  if [ -L "$1" ]; then
    printf 'L '
    readlink -n -- "$1" | base64 | tr -d '\n'
    echo
  fi
}
# rename2 FROM TO FLAG: renameat2(2) through python3 (FLAG 1: no replace, 2: exchange), atomic.
rename2() {
  command -v python3 >/dev/null 2>&1 || fail EOPNOTSUPP "rename: no python3 in the sandbox for renameat2"
  o=$(python3 -c '
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b = os.fsencode(sys.argv[1]), os.fsencode(sys.argv[2])
if libc.renameat2(-100, a, -100, b, int(sys.argv[3])) != 0:
    sys.stderr.write("rename: " + os.strerror(ctypes.get_errno()) + "\n")
    sys.exit(1)
' "$1" "$2" "$3" 2>&1) || fail SYS "$o"
}
