#!/usr/bin/env bash
# The mount at a distance (issue 10): sbxfs and sshfs (Debian sshfs + openssh-server, a private
# sshd on 127.0.0.1 with key auth), each behind the project's delaying proxy (5 ms each way,
# bytes counted), on the issue's workloads: cold and warm `find`, `ls -lR`, `cat` of 256 MiB and
# `git status` (1,000 files); untar 500 files until all are in the sandbox; a 1-byte edit of a
# 64 MiB file until the sandbox shows it; `sbxfs grep`/`scan` against `rg`/`sed` over sshfs;
# mount time. Median of 3, the peers taking turns; prints a Markdown table. Installs
# sshfs/openssh-server when missing. Takes 15-30 minutes (2 busy cores); a smoke run 1-2:
#   scripts/bench/distance.sh                           # the issue's sizes
#   SBXFS_BENCH_QUICK=1 scripts/bench/distance.sh       # small sizes, one run
#   SBXFS_BENCH_RUNS=5 SBXFS_BENCH_DELAY_MS=40 SBXFS_BENCH_MOUNT_ARGS='-o sync_close' \
#     scripts/bench/distance.sh                         # more runs, a farther sandbox, options
#   SBXFS_BENCH_TRANSPORT=ssh scripts/bench/distance.sh          # sbxfs over ssh:// (deployed agent)
#   SBXFS_BENCH_TRANSPORT=ssh-scripts scripts/bench/distance.sh  # sbxfs over ssh://…?agent=no
#   SBXFS_BENCH_TRANSPORT=exec-ssh scripts/bench/distance.sh     # exec: through `ssh sbx sh` (agent on stdio)
#   SBXFS_BENCH_TRANSPORT=exec-ssh-scripts scripts/bench/distance.sh  # the same, ?agent=no
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v sshfs >/dev/null && [ -x /usr/sbin/sshd ] || {
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq sshfs openssh-server >/dev/null
}
cargo test --release -q --test integration -- --ignored --nocapture bench_distance:: 2>&1 |
  grep --line-buffered -E '^(\||Medians|Made by|Workloads|The transport itself|sbxfs transport|sbxfs mounted|PROBLEM|run [0-9]|test result|thread|  |$)'
