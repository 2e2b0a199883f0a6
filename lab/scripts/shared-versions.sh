#!/usr/bin/env bash
# What a shared volume leaves in Redis's versions (#44, shared format 6: versions trimmed at
# each checkpoint): one client creates N empty files (DIR_FILES to a directory), removes
# them all, then creates N more; after each step (and a pause for the poller's checkpoint)
# the versions Redis keeps (`HLEN` of `vers` and `svers`) and their memory (`MEMORY USAGE`).
# With OLD_BIN (an rmemfs of an older format, e.g. a build of 29be9db) the same runs with it
# first, on a volume of its own, side by side.
#
#   lab/scripts/shared-versions.sh                       # N=60000
#   OLD_BIN=/tmp/old/rmemfs lab/scripts/shared-versions.sh
#
# Needs root and /dev/fuse; installs redis-server if missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh

N=${N:-60000}
DIR_FILES=${DIR_FILES:-1000}
# Seconds the versions kept must stay unchanged to count as settled (the poller checks every
# 100 ms whether a checkpoint is due, then trims).
SETTLE=${SETTLE:-3}
OUT=${OUT:-target/shared-versions}
ensure_packages python3:python3 redis-server:redis-server
check_prereqs mount serve || exit 2
check_bench bars || exit 2
mkdir -p "$OUT"
lib_init sharedversions
start_redis --own-trap
trap 'kill "$REDIS_PID" 2>/dev/null || true; cleanup' EXIT
start_servers 2 2G

# kept VOLUME: "versions bytes head checkpoint floor": the versions Redis keeps for VOLUME
# (exclusive and shared together) and their bytes, the log's head, the newest checkpoint's
# change and the versions' floor.
kept() {
  local k="rmemfs:{$1}:" n=0 b=0 h
  for h in vers svers; do
    n=$((n + $(redis-cli -u "$REDIS_URL" HLEN "$k$h")))
    b=$((b + $(redis-cli -u "$REDIS_URL" MEMORY USAGE "$k$h" | sed 's/^$/0/')))
  done
  local head ckpt floor
  head=$(redis-cli -u "$REDIS_URL" GET "${k}head")
  ckpt=$(redis-cli -u "$REDIS_URL" HGET "${k}ckpt" lsn)
  floor=$(redis-cli -u "$REDIS_URL" GET "${k}vfloor")
  echo "$n" "$b" "${head:-0}" "${ckpt:-0}" "${floor:-0}"
}

# settle VOLUME: waits until the versions kept stop changing (the poller's checkpoint and
# its trim done) for SETTLE seconds in a row, 120 s at most; their count and bytes in n, b.
settle() {
  local last="" same=0 k
  for ((k = 0; k < 120 && same < SETTLE; k++)); do
    sleep 1
    read -r n b head ckpt floor < <(kept "$1")
    if [ "$n" = "$last" ]; then same=$((same + 1)); else same=0; fi
    last=$n
  done
}

rows=$BASE/rows.tsv
: >"$rows"
run() { # LABEL BINARY VOLUME
  local label=$1 vol=$3 mnt=$BASE/m-$3
  BIN=$2 mount_fs "$mnt" "$SERVER_ADDRS" --volume "$vol" --create --meta "$REDIS_URL"
  local step
  for step in "created $N" "removed them" "created $N more"; do
    case $step in
      created*more) fill_empty "$mnt" "$N" "$((2 * N))" "$DIR_FILES" ;;
      created*) fill_empty "$mnt" 0 "$N" "$DIR_FILES" ;;
      removed*) find "$mnt" -mindepth 1 -maxdepth 1 -exec rm -rf {} + ;;
    esac
    settle "$vol"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$label" "$step" "$n" "$b" "$head" "$ckpt" >>"$rows"
  done
  BIN=$2 unmount_fs "$mnt"
}
[ -n "${OLD_BIN:-}" ] && run "old ($(basename "$(dirname "$OLD_BIN")"))" "$OLD_BIN" vold
run "this build" "$BIN" vnew

python3 - "$rows" "$OUT" <<'PY'
import json, os, sys
print(f"{'binary':<22}{'after':<20}{'changes':>9}{'checkpoint':>11}{'versions kept':>15}"
      f"{'Redis bytes':>13}{'B/version':>10}")
for line in open(sys.argv[1]):
    label, step, n, b, head, ckpt = line.rstrip("\n").split("\t")
    n, b = int(n), int(b)
    per = f"{b / n:.0f}" if n else "-"
    print(f"{label:<22}{step:<20}{int(head):>9,}{int(ckpt):>11,}{n:>15,}{b:>13,}{per:>10}")
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
series = list(dict.fromkeys(r[0] for r in rows))
groups = list(dict.fromkeys(r[1] for r in rows))
kib = {(r[0], r[1]): int(r[3]) / 1024 for r in rows}
spec = {"title": "what a shared volume keeps in Redis's versions", "series": series,
        "panels": [{"heading": "versions' memory in Redis", "unit": "KiB", "log": False,
                    "groups": groups,
                    "values": [[kib[(s, g)] for s in series] for g in groups]}]}
json.dump(spec, open(os.path.join(sys.argv[2], "spec.json"), "w"), indent=1)
PY
draw_chart "$OUT/spec.json" "$OUT/chart.svg"
