# The supervising shell's part: run the program written to $p.prog (and the secrets in $p.env)
# in a new session, wait for it, stop its leftovers, clean up, report its exit status.
sbxfs_cancelled_before_start() {
  rm -f "$p.cancel" "$p.prog" "$p.env"
  echo "sbxfs: job $j cancelled before it started" >&2
  exit 143
}
[ -e "$p.cancel" ] && sbxfs_cancelled_before_start
if ! command -v setsid >/dev/null 2>&1; then
  rm -f "$p.prog" "$p.env"
  echo "sbxfs: the sandbox has no setsid (util-linux or busybox): commands cannot be supervised" >&2
  exit 125
fi
# The job shell writes its own pid (= its process group, as a session leader) before it checks
# for a cancel marker; a canceller writes the marker before it reads the pid: one of the two
# always sees the other. Secrets are sourced (never exported into this shell's environment
# at exec time) and their file deleted before the program's first line runs.
setsid sh -c '
p=$1
echo $$ > "$p.pgid.new" && mv -f "$p.pgid.new" "$p.pgid" || exit 125
if [ -e "$p.cancel" ]; then exit 143; fi
if [ -e "$p.env" ]; then . "$p.env"; rm -f "$p.env"; fi
sbxfs_prog=$p.prog
unset p
set --
. "$sbxfs_prog"
' sbxfs-job "$p" </dev/null &
child=$!
wait "$child"
code=$?
pg=
if [ -s "$p.pgid" ]; then read -r pg <"$p.pgid"; fi
sbxfs_stop_group "$pg"
rm -f "$p.prog" "$p.env" "$p.pgid" "$p.pgid.new"
if [ -e "$p.cancel" ]; then
  rm -f "$p.cancel"
  echo "sbxfs: job $j cancelled" >&2
fi
exit "$code"
