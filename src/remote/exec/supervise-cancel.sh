# The canceller: leave the marker (a job that has not started yet will not), then stop the
# job's process group if it has one.
: >"$p.cancel"
pg=
if [ -s "$p.pgid" ]; then read -r pg <"$p.pgid"; fi
sbxfs_stop_group "$pg"
exit 0
