#!/usr/bin/env bash
# What a shared volume's clients hold, by what they use (#44: memory by use): one client (the
# maker, which keeps the whole table) fills a volume with SIZE empty files (DIR_FILES to a
# directory); a second client joins, lists one directory, reads every file of another and
# makes OWN files in a directory of its own; then, after SETTLE seconds of its poller's
# rounds, the inodes its table holds (`stats`) and its daemon's resident memory; then a
# `find` over everything (its time: what it loads), the same again; then its kernel lets go (`drop_caches`), and the
# same once more. With OLD_BIN (a build whose clients all load the whole namespace in the
# background) the same runs with it first, on a volume of its own: side by side. Prints a row
# per build and step.
#
#   lab/scripts/bench-shared-memory.sh
#   OLD_BIN=/tmp/old/rmemfs SIZE=200000 lab/scripts/bench-shared-memory.sh
#
# Needs root and /dev/fuse; installs redis-server if missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh

SIZE=${SIZE:-200000}
DIR_FILES=${DIR_FILES:-1000}
OWN=${OWN:-1000}
SETTLE=${SETTLE:-10}
ensure_packages python3:python3 bc:bc redis-server:redis-server
check_prereqs mount serve || exit 2
lib_init benchsharedmemory
start_redis --own-trap
trap 'kill "$REDIS_PID" 2>/dev/null || true; cleanup' EXIT

start_servers 2 2G
addrs=$SERVER_ADDRS

rss_of() { awk '/^VmRSS/ {print int($2 / 1024)}' "/proc/$(daemon_pids "$1" | head -1)/status"; }
inodes_of() { # BINARY MOUNT
  "$1" stats --json "$2" | python3 -c 'import json, sys; print(json.load(sys.stdin)["inodes"])'
}
row() { # LABEL STEP BINARY
  printf '%-12s %-34s %10s inodes %6s MiB (maker: %s MiB)\n' "$1" "$2" \
    "$(inodes_of "$3" "$BASE/b-$vol")" "$(rss_of "$BASE/b-$vol")" "$(rss_of "$BASE/a-$vol")"
}
run() { # LABEL BINARY VOLUME
  local label=$1 bin=$2 vol=$3 f
  BIN=$bin mount_fs "$BASE/a-$vol" "$addrs" --volume "$vol" --create --meta "$REDIS_URL"
  fill_empty "$BASE/a-$vol" 0 "$SIZE" "$DIR_FILES"
  # The maker notes its count each second: a client joining reads there that it is large.
  sleep 2
  BIN=$bin mount_fs "$BASE/b-$vol" "$addrs" --volume "$vol" --meta "$REDIS_URL"
  ls "$BASE/b-$vol/d0" >/dev/null
  for f in "$BASE/b-$vol"/d1/*; do cat "$f"; done
  mkdir "$BASE/b-$vol/own"
  python3 -c 'import os, sys
for i in range(int(sys.argv[2])):
    os.close(os.open(f"{sys.argv[1]}/f{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))' \
    "$BASE/b-$vol/own" "$OWN"
  sleep "$SETTLE"
  row "$label" "used 2 directories, $SETTLE s after" "$bin"
  local t0 t1
  t0=$(date +%s.%N)
  find "$BASE/b-$vol" >/dev/null
  t1=$(date +%s.%N)
  row "$label" "after a find over all ($(printf '%.2f' "$(echo "$t1 - $t0" | bc)") s)" "$bin"
  sync
  echo 2 >/proc/sys/vm/drop_caches
  sleep 2
  row "$label" "after its kernel let go" "$bin"
  BIN=$bin unmount_fs "$BASE/b-$vol"
  BIN=$bin unmount_fs "$BASE/a-$vol"
}
echo "# $SIZE files, $DIR_FILES to a directory; the joined client's table and memory" >&2
if [ -n "${OLD_BIN:-}" ]; then
  vol=bmold
  run "old" "$OLD_BIN" "$vol"
fi
vol=bmnew
run "this build" "${BIN:-target/release/rmemfs}" "$vol"
