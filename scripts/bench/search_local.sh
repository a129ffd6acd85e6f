#!/usr/bin/env bash
# Benchmark the search core on local data, side by side with the tools it follows:
#   grep: `sbxfs grep` vs `rg` (parallel, unsorted) and `rg --sort path` (same order as ours)
#         over a tree of >= 50k source files (copies of the cargo registry sources);
#   scan: `sbxfs scan` vs `sed -n` for a 50-line window at the end of a >= 1 GB file, and the
#         peak RSS of each (flat memory is the point of scan).
# Usage: scripts/bench/search_local.sh [WORKDIR]   (default /tmp/sbxfs-bench; reuses its data)
# Prints a Markdown table; figures are medians of RUNS warm runs (default 5).
set -euo pipefail
cd "$(dirname "$0")/../.."
work=${1:-/tmp/sbxfs-bench}
runs=${RUNS:-5}
mkdir -p "$work"
[ -x /usr/bin/time ] || { apt-get update -qq && apt-get install -y -qq time >/dev/null; }
cargo build --release -q
sbxfs=$PWD/target/release/sbxfs

# --- corpus: >= 50k files ---------------------------------------------------------------------
registry=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/ | head -n 1)
tree=$work/tree
if [ ! -f "$tree/.complete" ]; then
  rm -rf "$tree"; mkdir -p "$tree"
  n=0; i=0
  while [ "$n" -lt 50000 ]; do
    i=$((i + 1)); cp -r "$registry" "$tree/copy$i"
    n=$(find "$tree" -type f | wc -l)
  done
  touch "$tree/.complete"
fi
files=$(find "$tree" -type f | wc -l)
bytes=$(du -sb "$tree" | cut -f1)

# --- 1 GB log -----------------------------------------------------------------------------------
log=$work/big.log
if [ ! -f "$log" ] || [ "$(stat -c %s "$log")" -lt 1073741824 ]; then
  python3 - "$log" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    i, size, chunk = 0, 0, []
    while size < 1 << 30:
        for _ in range(100000):
            i += 1
            chunk.append(f"2026-11-29T12:00:00Z INFO request {i} served in {i % 997} ms\n")
        s = "".join(chunk); f.write(s); size += len(s); chunk = []
PY
fi
log_lines=$(wc -l <"$log")
log_bytes=$(stat -c %s "$log")
start=$((log_lines - 49))

# median wall time in seconds of a command (stdout discarded)
median() {
  local times=()
  for _ in $(seq "$runs"); do
    local t0 t1
    t0=$(date +%s.%N); "$@" >/dev/null 2>&1 || true; t1=$(date +%s.%N)
    times+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')")
  done
  printf '%s\n' "${times[@]}" | sort -g | awk '{a[NR]=$1} END {printf "%.3f", a[int((NR+1)/2)]}'
}
# peak RSS in MiB of a command (GNU time's maximum resident set size)
peak_rss() {
  /usr/bin/time -f '%M' -o "$work/rss" "$@" >/dev/null 2>&1 || true
  awk '{printf "%.1f", $1 / 1024}' "$work/rss"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }

pattern='fn [a-z_]+_unchecked'
# warm the page cache once
rg -c "$pattern" "$tree" >/dev/null 2>&1 || true
"$sbxfs" grep "$pattern" "$tree" >/dev/null 2>&1 || true
ours_n=$("$sbxfs" grep "$pattern" "$tree" | wc -l)
rg_n=$(rg --sort path -n "$pattern" "$tree" | wc -l)
t_ours=$(median "$sbxfs" grep "$pattern" "$tree")
t_rg=$(median rg -n --column "$pattern" "$tree")
t_rg_sorted=$(median rg -n --column --sort path "$pattern" "$tree")

t_scan=$(median "$sbxfs" scan "$log" --start "$start" --end "$log_lines")
t_sed=$(median sed -n "${start},${log_lines}p" "$log")
rss_scan=$(peak_rss "$sbxfs" scan "$log" --start "$start" --end "$log_lines")
rss_sed=$(peak_rss sed -n "${start},${log_lines}p" "$log")
rss_scan_small=$(peak_rss "$sbxfs" scan "$sbxfs" --start 1 --end 2)
same=$(cmp -s <("$sbxfs" scan "$log" --start "$start" --end "$log_lines") <(sed -n "${start},${log_lines}p" "$log") && echo yes || echo NO)

cat <<EOF2
### Search core, local ($(nproc) cores, $(date -u +%Y-%m-%d), median of $runs warm runs)

Tree: $files files, $((bytes / 1048576)) MiB (copies of the cargo registry sources). Pattern \`$pattern\`:
sbxfs found $ours_n matching lines, rg $rg_n.

| grep | time (s) | sbxfs ÷ peer |
|---|---|---|
| \`sbxfs grep\` (sorted, deterministic) | $t_ours | |
| \`rg -n --column\` (parallel, unsorted) | $t_rg | $(ratio "$t_ours" "$t_rg")× |
| \`rg -n --column --sort path\` (same order as sbxfs) | $t_rg_sorted | $(ratio "$t_ours" "$t_rg_sorted")× |

File: $((log_bytes / 1048576)) MiB, $log_lines lines; window: the last 50 lines (identical output: $same).

| scan | time (s) | peak RSS (MiB) |
|---|---|---|
| \`sbxfs scan --start $start --end $log_lines\` | $t_scan | $rss_scan |
| \`sed -n '$start,${log_lines}p'\` | $t_sed | $rss_sed |
| \`sbxfs scan\` of a small file (baseline RSS) | | $rss_scan_small |

sbxfs scan ÷ sed: $(ratio "$t_scan" "$t_sed")× time; scan's peak RSS is the same for 1 GB as for a
small file: memory does not grow with the file.
EOF2
