# Namespace operations: OP REL [ARGS]. Each answers "ok" and the path's attributes (attrs),
# or nothing more for unlink, rmdir and rename.
op=$1
shift
at "$1"
parent_ok
exists() { [ -e "$1" ] || [ -L "$1" ]; }
run() { o=$("$@" 2>&1) || fail SYS "$o"; }
case $op in
create)
  # The shells' noclobber lets `>` open an existing non-regular file (a symlink to
  # /dev/null, a fifo): refused first, and the mode set only on the regular file made.
  exists "$P" && fail EEXIST "$1"
  if ! o=$( (umask 077 && set -C && : >"$P") 2>&1); then fail SYS "$o"; fi
  { [ -f "$P" ] && ! [ -L "$P" ]; } || fail EEXIST "$1"
  run chmod "$2" -- "$P"
  ;;
mkdir)
  run mkdir -m "$2" -- "$P"
  # The mode asked for is the mode made, plus the set-group-ID bit a set-group-ID parent
  # passes on (as the kernel gives it).
  m=$2
  if [ -g "${P%/*}" ]; then m=$(printf '%05o' $(( $2 | 02000 ))); fi
  run chmod "$m" -- "$P"
  ;;
mkfifo) run mkfifo -m "$2" -- "$P" ;;
socket)
  command -v python3 >/dev/null 2>&1 || fail EOPNOTSUPP "sockets: no python3 in the sandbox"
  # bind() takes at most 107 bytes of path: bind the name from inside its directory.
  o=$(cd -- "${P%/*}" && python3 -c '
import os, socket, sys
socket.socket(socket.AF_UNIX).bind(os.fsencode("./" + sys.argv[1]))
' "${P##*/}" 2>&1) || fail SYS "$o"
  run chmod "$2" -- "$P"
  ;;
mknod)
  command -v mknod >/dev/null 2>&1 || fail EOPNOTSUPP "mknod: no tool in the sandbox"
  run mknod -m "$2" -- "$P" "$3" "$4" "$5"
  ;;
unlink)
  exists "$P" || fail ENOENT "$1"
  [ -d "$P" ] && ! [ -L "$P" ] && fail EISDIR "$1"
  run rm -f -- "$P"
  ok
  exit 0
  ;;
rmdir)
  exists "$P" || fail ENOENT "$1"
  [ -L "$P" ] && fail ENOTDIR "$1"
  run rmdir -- "$P"
  ok
  exit 0
  ;;
rename)
  F=$P
  at "$2"
  parent_ok
  exists "$F" || fail ENOENT "$1"
  if [ "$F" = "$P" ] || { exists "$P" && [ "$F" -ef "$P" ] && ! [ -L "$F" ] && ! [ -L "$P" ]; }; then
    ok
    exit 0
  fi
  case $P in "$F"/*) fail EINVAL "$2: inside $1" ;; esac
  if [ "$3" = exchange ]; then
    rename2 "$F" "$P" 2
  elif [ "$3" = noreplace ] && command -v python3 >/dev/null 2>&1; then
    rename2 "$F" "$P" 1
  elif [ "$3" = noreplace ]; then
    exists "$P" && fail EEXIST "$2"
    if [ -d "$F" ] && ! [ -L "$F" ]; then
      run mv -f -- "$F" "$P"
    else
      # ln refuses to replace, so no name that appears meanwhile is lost.
      run ln -- "$F" "$P"
      run rm -f -- "$F"
    fi
  else
    if [ -d "$P" ] && ! [ -L "$P" ]; then
      { [ -d "$F" ] && ! [ -L "$F" ]; } || fail EISDIR "$2"
      run rmdir -- "$P"
    elif exists "$P" && [ -d "$F" ] && ! [ -L "$F" ]; then
      fail ENOTDIR "$2"
    fi
    run mv -f -- "$F" "$P"
  fi
  ok
  exit 0
  ;;
link)
  E=$P
  at "$2"
  parent_ok
  exists "$E" || fail ENOENT "$1"
  [ -d "$E" ] && ! [ -L "$E" ] && fail EPERM "$1: a directory"
  exists "$P" && fail EEXIST "$2"
  run ln -- "$E" "$P"
  ;;
symlink)
  exists "$P" && fail EEXIST "$1"
  run ln -s -- "$2" "$P"
  ;;
readlink)
  exists "$P" || fail ENOENT "$1"
  [ -L "$P" ] || fail EINVAL "$1: not a symlink"
  ok
  printf 'L '
  readlink -n -- "$P" | base64 | tr -d '\n'
  echo
  exit 0
  ;;
setattr)
  # setattr REL MODE SIZE ATIME MTIME UID GID (each "" when unchanged)
  exists "$P" || fail ENOENT "$1"
  if [ -n "$2" ] && [ -L "$P" ]; then fail EOPNOTSUPP "$1: the mode of a symlink"; fi
  if [ -n "$6" ] && [ -n "$7" ]; then
    run chown -h -- "$6:$7" "$P"
  elif [ -n "$6" ]; then
    run chown -h -- "$6" "$P"
  elif [ -n "$7" ]; then
    run chgrp -h -- "$7" "$P"
  fi
  [ -z "$2" ] || run chmod "$2" -- "$P"
  if [ -n "$3" ]; then
    [ -L "$P" ] && fail EINVAL "$1: a symlink"
    [ -d "$P" ] && fail EISDIR "$1"
    run truncate -s "$3" -- "$P"
  fi
  # busybox's touch takes whole seconds only: the nanoseconds are lost there.
  [ -z "$4" ] || touch -h -c -a -d "@$4" -- "$P" 2>/dev/null || run touch -h -c -a -d "@${4%.*}" -- "$P"
  [ -z "$5" ] || touch -h -c -m -d "@$5" -- "$P" 2>/dev/null || run touch -h -c -m -d "@${5%.*}" -- "$P"
  ;;
fallocate)
  # fallocate REL OFFSET LEN KEEP(1/0)
  exists "$P" || fail ENOENT "$1"
  follow
  [ -d "$P" ] && fail EISDIR "$1"
  if command -v fallocate >/dev/null 2>&1; then
    if [ "$4" = 1 ]; then
      o=$(fallocate -n -o "$2" -l "$3" -- "$P" 2>&1) || case $o in
      *"invalid option"*) fail EOPNOTSUPP "fallocate: no --keep-size in the sandbox's tool" ;;
      *) fail SYS "$o" ;;
      esac
    else run fallocate -o "$2" -l "$3" -- "$P"; fi
  elif [ "$4" = 1 ]; then
    fail EOPNOTSUPP "fallocate: no tool in the sandbox"
  else
    size=$(stat -L -c %s -- "$P")
    [ "$(($2 + $3))" -le "$size" ] || run truncate -s "$(($2 + $3))" -- "$P"
  fi
  ;;
*) fail EINVAL "unknown operation $op" ;;
esac
ok
attrs "$P"
