#!/usr/bin/env bash
# Agent throughput: ranged reads (direct and through a 5 ms-each-way proxy) against local pread,
# and bytes on the wire for a 1-byte patch commit versus a whole-file commit (256 MiB).
# Prints Markdown tables.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo test --release -q --test integration -- --ignored --nocapture bench_agent:: 2>&1 | grep -E '^(\||$)'
