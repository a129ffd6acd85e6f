#!/usr/bin/env bash
# Build sbxfs as one static executable (glibc linked in with crt-static: no musl toolchain is
# needed), the binary that runs in a sandbox with no libc at all (the agent deployed over ssh).
# Its own --target-dir, so these RUSTFLAGS never invalidate the normal build. Prints the path.
#   scripts/build-static.sh            # debug profile, no debug info (fast; what the tests use)
#   scripts/build-static.sh --release  # optimised and stripped ([profile.release] strip = true)
set -euo pipefail
cd "$(dirname "$0")/.."
target=x86_64-unknown-linux-gnu
profile=debug
args=()
if [ "${1:-}" = "--release" ]; then
  profile=release
  args+=(--release)
fi
CARGO_INCREMENTAL=0 RUSTFLAGS="-C target-feature=+crt-static -C debuginfo=0" \
  cargo build --quiet --bin sbxfs --target "$target" --target-dir target/static "${args[@]}" >&2
bin="$PWD/target/static/$target/$profile/sbxfs"
if ! file -L "$bin" | grep -Eq 'statically linked|static-pie linked'; then
  echo "build-static: $bin is not static: $(file -L "$bin")" >&2
  exit 1
fi
echo "$bin"
