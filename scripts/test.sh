#!/usr/bin/env bash
# The whole test suite: install what it needs, then formatting, lints and every test (the vector
# suites print how many cases each implementation passed).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo fmt --check
cargo clippy --all-targets -- -D warnings
cargo test -- --show-output
