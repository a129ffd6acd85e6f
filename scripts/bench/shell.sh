#!/usr/bin/env bash
# Everyday tools over `shell:` (no network: the sandbox is a local sh), with the agent over the
# shell's stdin/stdout and, with --scripts, the exec-only scripts through one session (`?agent=no`)
# and as a command per operation (`?agent=no&session=no`; minutes; --session: the session only), next to
# the same work on the local disk (each sbxfs cell with its ratio to it). Each row ends when the
# sandbox has everything (`ctl flush`).
# Prints a Markdown table. Usage: scripts/bench/shell.sh [--scripts | --session]
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
cargo build --release -q
bin=$repo/target/release/sbxfs
work=$(mktemp -d /tmp/sbxfs-bench-shell.XXXXXX)
mounts=()
cleanup() {
  for m in "${mounts[@]}"; do fusermount3 -uz "$m" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# 500 files of 100 B–4 KB in 20 directories.
mkdir -p "$work/src/t"
for d in $(seq 1 20); do
  mkdir "$work/src/t/d$d"
  for f in $(seq 1 25); do head -c $((RANDOM % 4000 + 100)) /dev/urandom | base64 > "$work/src/t/d$d/f$f.txt"; done
done
tar -C "$work/src" -cf "$work/t.tar" t

secs() { local s e; s=$(date +%s.%N); "$@" >/dev/null 2>&1; e=$(date +%s.%N); echo "$e - $s" | bc; }
flush() { if [ "$1" != local ]; then "$bin" ctl --mount "$2" flush; fi; }
untar() { tar -xf "$work/t.tar" -C "$2" && flush "$1" "$2"; }
commit() {
  (cd "$2/t" && git init -q . && git add -A && git -c user.email=b@e -c user.name=b commit -qm x \
    && git status --porcelain) && flush "$1" "$2"
}
clone() { git clone -q "$repo" "$2/clone" && flush "$1" "$2"; }
rsync_tree() { rsync -a "$work/src/t/" "$2/r/" && flush "$1" "$2"; }
remove() { rm -rf "$2/t" "$2/r" && flush "$1" "$2"; }
status() { (cd "$2/clone" && git status --porcelain); }

declare -A row
run() { # label dir
  row[untar,$1]=$(secs untar "$1" "$2")
  row[commit,$1]=$(secs commit "$1" "$2")
  row[clone,$1]=$(secs clone "$1" "$2")
  row[status,$1]=$(secs status "$1" "$2")
  row[rsync,$1]=$(secs rsync_tree "$1" "$2")
  row[remove,$1]=$(secs remove "$1" "$2")
}
mount_shell() { # label query
  local ws=$work/ws-$1 mnt=$work/mnt-$1
  mkdir -p "$ws" "$mnt"
  "$bin" mount "shell:$ws$2" "$mnt" --background >/dev/null
  mounts+=("$mnt")
  run "$1" "$mnt"
}

mkdir -p "$work/local"
run local "$work/local"
mount_shell agent ""
labels=(local agent)
case ${1:-} in
--scripts)
  mount_shell session "?agent=no"
  mount_shell per-op "?agent=no&session=no"
  labels+=(session per-op)
  ;;
--session)
  mount_shell session "?agent=no"
  labels+=(session)
  ;;
esac

printf '| workload |'; for l in "${labels[@]}"; do printf ' %s |' "$l"; done; echo
printf '|---|'; for _ in "${labels[@]}"; do printf -- '---|'; done; echo
for w in "untar 500 files:untar" "git init+add+commit+status, 500 files:commit" \
         "git clone of this repository:clone" "git status of the clone:status" \
         "rsync -a of 500 files:rsync" "rm -rf of 1,000 files and their git repository:remove"; do
  printf '| %s |' "${w%%:*}"
  k=${w##*:}
  for l in "${labels[@]}"; do
    if [ "$l" = local ]; then
      printf ' %.2f s |' "${row[$k,$l]}"
    else # and its ratio to the local disk
      printf ' %.2f s (%.0f×) |' "${row[$k,$l]}" "$(echo "${row[$k,$l]} / (${row[$k,local]} + 0.001)" | bc -l)"
    fi
  done
  echo
done
