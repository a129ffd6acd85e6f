#!/usr/bin/env bash
# The whole test suite: install what it needs, then formatting, lints and every test (the vector
# suites print how many cases each implementation passed).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo fmt --check
cargo clippy --all-targets -- -D warnings
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Every test binary runs even when one fails; the closing line prints either way, and the
# script's status is cargo's.
status=0
# stdin: nothing (a grep with no path searches a pipe on stdin, as rg does).
cargo test --no-fail-fast -- --show-output </dev/null 2>&1 | tee "$log" || status=$?
# One closing line for the whole run, summed over every test binary.
awk '/^test result:/ { p += $4; f += $6; s += $8 } END { printf "sbxfs: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
exit "$status"
