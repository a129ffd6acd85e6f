# sbxfs job supervisor (POSIX sh: dash, busybox ash). Runs one program in its own process group
# (setsid), records the group id in a private job directory, stops what the program left behind
# and removes the job's files before it reports the program's exit status.
# Set before this text: j (the job id, hex) and, where the secrets came inline, the env file.
umask 077
sbxfs_jobs() {
  for d in /dev/shm "${TMPDIR:-/tmp}" /tmp; do
    case $d in /*) ;; *) continue ;; esac
    if [ -d "$d" ] && [ -w "$d" ]; then
      root=$d/sbxfs-jobs-$(id -u 2>/dev/null || echo u)
      mkdir -p "$root" 2>/dev/null
      # A directory someone else made (or a symlink to one) is never used for our secrets.
      if [ -d "$root" ] && [ ! -L "$root" ] && [ -O "$root" ] && chmod 700 "$root" 2>/dev/null; then
        return 0
      fi
    fi
  done
  echo "sbxfs: no private job directory (tried /dev/shm, \$TMPDIR, /tmp)" >&2
  exit 125
}
# Stop a whole process group: TERM, up to 2 s for it to go, then KILL.
sbxfs_stop_group() {
  # Never group 0 or 1 (kill -TERM -1 would signal every process we may signal).
  case $1 in '' | *[!0-9]* | 0 | 1) return 0 ;; esac
  kill -TERM -"$1" 2>/dev/null || return 0
  n=0
  while [ "$n" -lt 20 ] && kill -0 -"$1" 2>/dev/null; do
    sleep 0.1 2>/dev/null || sleep 1
    n=$((n + 1))
  done
  kill -KILL -"$1" 2>/dev/null
  return 0
}
# What jobs leave when their supervisor dies with its channel (a dropped ssh, a killed
# `docker exec`), and the markers of cancels that came after their job ended: swept by every
# 16th job, once 10 minutes old, never the files of a job whose process group still runs.
sbxfs_sweep() {
  find "$root" -maxdepth 1 -type f -mmin +10 2>/dev/null | while IFS= read -r f; do
    case $f in
      *.pgid)
        pg=
        read -r pg <"$f" 2>/dev/null
        case $pg in '' | *[!0-9]* | 0 | 1) ;; *) kill -0 -"$pg" 2>/dev/null && continue ;; esac
        b=${f%.pgid}
        rm -f "$b.pgid" "$b.prog" "$b.env" "$b.cancel" "$b.pgid.new"
        ;;
      *.prog | *.env | *.cancel | *.pgid.new) [ -e "${f%.*}.pgid" ] || rm -f "$f" ;;
    esac
  done
}
sbxfs_jobs
case $j in *0) sbxfs_sweep ;; esac
p=$root/$j
