#!/usr/bin/env bash
# Build sbxfs and run its queries on a small demo workspace (no configuration needed).
# The workspace is created under ${SBXFS_DEMO_DIR:-/tmp/sbxfs-demo}.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null || { echo "sbxfs needs a Rust toolchain (cargo)" >&2; exit 2; }
cargo build --release -q
sbxfs=$PWD/target/release/sbxfs
ws=${SBXFS_DEMO_DIR:-/tmp/sbxfs-demo}
rm -rf "$ws"; mkdir -p "$ws/src/net" "$ws/docs"
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
printf '# Demo\n\nA workspace for trying sbxfs.\n' >"$ws/docs/README.md"
printf 'target/\n' >"$ws/.gitignore"
mkdir -p "$ws/target" && printf 'TODO ignored build output\n' >"$ws/target/out.txt"
seq 1 100000 | sed 's/^/log line /' >"$ws/app.log"

run() { printf '\n$ %s\n' "$*"; (cd "$ws" && "$@") || true; }
echo "demo workspace: $ws"
run "$sbxfs" grep TODO -C 1
run "$sbxfs" glob '**/*.rs'
run "$sbxfs" fuzzy srvr
run "$sbxfs" scan app.log --start 99998
run "$sbxfs" edit src/main.rs --old 'let port = 8080;' --new 'let port = 9090;'
run "$sbxfs" grep --json port src/main.rs
