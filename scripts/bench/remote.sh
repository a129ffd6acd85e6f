#!/usr/bin/env bash
# Queries at a distance: sbxfs and sshfs (Debian sshfs + openssh-server on 127.0.0.1), each
# behind the project's delaying proxy (5 ms each way, bytes counted): `sbxfs grep` in the mount
# vs `rg`/`grep -r` over either mount on a 3,000-file tree, and `sbxfs scan` vs `sed -n` for
# lines near the end of a 200 MB log. Prints a Markdown table. Installs sshfs/openssh-server.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v sshfs >/dev/null && [ -x /usr/sbin/sshd ] || {
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq sshfs openssh-server >/dev/null
}
cargo test --release -q --test integration -- --ignored --nocapture bench_remote:: 2>&1 | grep -E '^(\||Tree|sbxfs|$)'
