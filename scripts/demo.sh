#!/usr/bin/env bash
# Build sbxfs, start an agent over a small demo workspace on loopback, and mount it — no
# configuration. The mount stays up until Ctrl-C (which pushes pending writes, unmounts and
# stops the agent). Installs fuse3 (for fusermount3) if missing.
#   scripts/demo.sh            mount at $SBXFS_DEMO_DIR/mnt (default /tmp/sbxfs-demo/mnt) and wait
#   scripts/demo.sh --smoke    mount, run a few commands through it, unmount, exit
set -euo pipefail
cd "$(dirname "$0")/.."
smoke=false
[ "${1:-}" = "--smoke" ] && smoke=true
command -v cargo >/dev/null || { echo "sbxfs needs a Rust toolchain (cargo)" >&2; exit 2; }
if ! command -v fusermount3 >/dev/null; then
  echo "installing fuse3 (fusermount3)"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq && apt-get install -y -qq fuse3 >/dev/null
fi
# The first build takes a few minutes on a small machine: cargo shows its progress.
echo "building sbxfs (release; cargo prints its progress below)" >&2
cargo build --release
sbxfs=$PWD/target/release/sbxfs
demo=${SBXFS_DEMO_DIR:-/tmp/sbxfs-demo}
ws=$demo/workspace mnt=$demo/mnt
fusermount3 -uz "$mnt" 2>/dev/null || true
rm -rf "$ws"; mkdir -p "$ws/src/net" "$ws/docs" "$mnt"
cat >"$ws/src/main.rs" <<'RS'
fn main() {
    // TODO: read the port from the environment
    let port = 8080;
    net::serve(port);
}
RS
cat >"$ws/src/net/server.rs" <<'RS'
pub fn serve(port: u16) {
    // TODO: graceful shutdown
    println!("listening on {port}");
}
RS
printf '# Demo\n\nA workspace served by an sbxfs agent.\n' >"$ws/docs/README.md"
printf 'target/\n' >"$ws/.gitignore"
seq 1 100000 | sed 's/^/log line /' >"$ws/app.log"
head -c 24 /dev/urandom | base64 >"$demo/token"
chmod 600 "$demo/token"

"$sbxfs" agent --root "$ws" --listen 127.0.0.1:0 --token-file "$demo/token" >"$demo/agent.out" 2>"$demo/agent.log" &
agent_pid=$!
mount_pid=
cleanup() {
  [ -n "$mount_pid" ] && kill -TERM "$mount_pid" 2>/dev/null && wait "$mount_pid" 2>/dev/null || true
  fusermount3 -uz "$mnt" 2>/dev/null || true
  kill -TERM "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 50); do grep -q http:// "$demo/agent.out" 2>/dev/null && break; sleep 0.1; done
url=$(grep -o 'http://[0-9.:]*' "$demo/agent.out")
"$sbxfs" mount "$url" "$mnt" --token-file "$demo/token" >"$demo/mount.out" 2>"$demo/mount.log" &
mount_pid=$!
for _ in $(seq 50); do grep -q mounted "$demo/mount.out" 2>/dev/null && break; sleep 0.1; done
grep -q mounted "$demo/mount.out" || { cat "$demo/mount.log" >&2; exit 1; }
echo "agent:  $url serving $ws"
echo "mount:  $mnt"
if $smoke; then
  run() { printf '\n$ %s\n' "$*"; (cd "$mnt" && "$@"); }
  run ls -l
  run cat src/main.rs
  run sh -c 'echo "// edited through the mount" >> src/main.rs'
  run "$sbxfs" ctl flush   # close queued the push; flush waits for it
  run tail -n 1 "$ws/src/main.rs"
  run "$sbxfs" grep TODO
  echo; echo "smoke test passed"
  exit 0
fi
echo "Try: cd $mnt && ls -l && \$EDITOR src/main.rs   (Ctrl-C here to unmount)"
wait "$mount_pid"
