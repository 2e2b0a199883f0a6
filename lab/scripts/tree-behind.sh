#!/usr/bin/env bash
# The tree of the metadata benchmark (TAR_FILES files, default 10,000) extracted with `tar xf`,
# flushed with `sync -f` and removed with `rm -rf`, side by side in alternating rounds on:
# bindfs over tmpfs (a libfuse passthrough file system), rmemfs with the defaults (write-behind),
# and rmemfs with `-o no_write_behind` (both rmemfs mounts on one memory server). Prints one
# line per target and round, seconds; then the write-behind mount's `stats` line.
#
#   lab/scripts/tree-behind.sh            # ROUNDS=3
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh
ROUNDS=${ROUNDS:-3}
ensure_packages tar:tar bc:bc bindfs:bindfs
check_prereqs mount serve stats || exit 2
lib_init treebehind
mkdir -p target/bench-meta
tar=$(tree_tar "$(cd target/bench-meta && pwd)" "${TAR_FILES:-10000}")
start_server 4G
mkdir -p "$BASE/bindfs-src" "$BASE/bindfs"
mount -t tmpfs -o size=4G tmpfs "$BASE/bindfs-src"
bindfs "$BASE/bindfs-src" "$BASE/bindfs"
mount_fs "$BASE/behind" "$SERVER_ADDR"
mount_fs "$BASE/through" "$SERVER_ADDR" -o no_write_behind
seconds() {
  local t0
  t0=$(date +%s.%N)
  "$@"
  echo "$(date +%s.%N) - $t0" | bc
}
for r in $(seq 1 "$ROUNDS"); do
  for target in bindfs behind through; do
    dir=$BASE/$target
    sync
    echo 3 >/proc/sys/vm/drop_caches
    t_tar=$(seconds tar xf "$tar" -C "$dir")
    t_sync=$(seconds sync -f "$dir")
    t_rm=$(seconds find "$dir" -mindepth 1 -delete)
    printf '%-8s round %s: tar xf %.2f s, sync %.3f s, rm -rf %.2f s\n' "$target" "$r" "$t_tar" "$t_sync" "$t_rm"
  done
done
"$BIN" stats "$BASE/behind" | grep '^write-behind'
unmount_fs "$BASE/behind"
unmount_fs "$BASE/through"
umount "$BASE/bindfs"
umount "$BASE/bindfs-src"
