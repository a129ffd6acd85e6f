#!/bin/sh
# scan.sh FILE START END MAX_BYTES — a window of FILE's lines, for sandboxes that give us only a
# shell. The same rules as sbxfs's Rust `scan` (see src/search/scan.rs), pinned by
# tests/vectors/scan.json:
#   lines split on \n; a trailing \n ends the last line; a UTF-8 BOM at the very start is not
#   part of line 1; lengths are bytes; \r is content; lines are taken whole and greedily while
#   their bytes plus one per joining \n fit MAX_BYTES; only the bytes present at the start count.
# END may be empty for "to the end of the file". Uses only POSIX sh, awk, head -c, wc, dd, od.
# The awk in PATH is used, or $SBX_AWK. Parameters reach awk through the environment, never
# through -v or the program text, so %, \n and backslashes are never interpreted.
#
# Output: a header line
#   OK START_LINE END_LINE TOTAL_LINES TOTAL_BYTES FIRST_LINE_BYTES
# then the selected lines, each followed by \n. On error: one line "ERR TOKEN MESSAGE", exit 2.
LC_ALL=C
export LC_ALL

fail() {
  printf 'ERR %s %s\n' "$1" "$2"
  exit 2
}

[ "$#" -eq 4 ] || fail invalid_args "usage: scan.sh FILE START END MAX_BYTES"
file=$1 start=$2 end=$3 max=$4
case $start in '' | *[!0-9]*) fail invalid_args "start must be a positive integer" ;; esac
case $end in *[!0-9]*) fail invalid_args "end must be an integer or empty" ;; esac
case $max in '' | *[!0-9]*) fail invalid_args "max_bytes must be an integer" ;; esac
[ "$start" -ge 1 ] || fail invalid_args "start line must be 1 or more"
if [ -n "$end" ] && [ "$end" -lt "$start" ]; then
  fail invalid_args "end line is before start line"
fi
[ -e "$file" ] || fail not_found "no such file"
[ -d "$file" ] && fail is_a_directory "is a directory"
[ -r "$file" ] || fail io_error "cannot read"

# The size seen now bounds the whole scan: a growing file cannot extend it.
size=$(wc -c <"$file") || fail io_error "cannot read"
size=$((size + 0))

bom=0
if [ "$size" -ge 3 ]; then
  head3=$(head -c 3 <"$file" | od -An -tx1 | tr -d ' \n')
  [ "$head3" = efbbbf ] && bom=1
fi
if [ "$size" -eq 0 ] || { [ "$bom" -eq 1 ] && [ "$size" -eq 3 ]; }; then
  total_lines=0
else
  newlines=$(head -c "$size" <"$file" | wc -l)
  last=$(dd if="$file" bs=1 skip=$((size - 1)) count=1 2>/dev/null | od -An -tx1 | tr -d ' \n')
  total_lines=$((newlines + 0))
  [ "$last" = 0a ] || total_lines=$((total_lines + 1))
fi

SBX_START=$start SBX_END=$end SBX_MAX=$max SBX_BOM=$bom \
  SBX_TOTAL_LINES=$total_lines SBX_TOTAL_BYTES=$size
export SBX_START SBX_END SBX_MAX SBX_BOM SBX_TOTAL_LINES SBX_TOTAL_BYTES

head -c "$size" <"$file" | ${SBX_AWK:-awk} '
BEGIN {
  start = ENVIRON["SBX_START"] + 0
  hasend = (ENVIRON["SBX_END"] != "")
  endl = ENVIRON["SBX_END"] + 0
  max = ENVIRON["SBX_MAX"] + 0
  total = ENVIRON["SBX_TOTAL_LINES"] + 0
  used = 0; n = 0; closed = 0; first = 0
}
NR > total { exit }
{
  line = $0
  if (NR == 1 && ENVIRON["SBX_BOM"] == "1") line = substr(line, 4)
  if (NR == start) first = length(line)
  if (!closed && NR >= start && (!hasend || NR <= endl)) {
    cost = length(line) + (n > 0 ? 1 : 0)
    if (used + cost <= max) { used += cost; buf[++n] = line } else closed = 1
  }
  if (NR >= start && (closed || (hasend && NR >= endl))) exit
}
END {
  printf "OK %.0f %.0f %s %s %.0f\n", start, start + n - 1, ENVIRON["SBX_TOTAL_LINES"], ENVIRON["SBX_TOTAL_BYTES"], first
  for (i = 1; i <= n; i++) printf "%s\n", buf[i]
}'
