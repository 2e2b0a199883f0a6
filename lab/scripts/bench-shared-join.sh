#!/usr/bin/env bash
# What a client joining a shared volume pays, by the namespace's size (#44: the join's bound):
# one client fills the volume to each size in SIZES (empty files, DIR_FILES to a directory),
# then a second client mounts it: the time its `mount` takes (the join: the newest
# checkpoint loaded, the log after it replayed, before it serves) and its daemon's resident
# memory once mounted, then it unmounts. Prints a row per size, and the time and memory per
# 1,000 inodes between the smallest and the largest size.
#
#   lab/scripts/bench-shared-join.sh
#   SIZES="10000 50000 100000" lab/scripts/bench-shared-join.sh
#
# Needs root and /dev/fuse; installs redis-server if missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh

SIZES=${SIZES:-10000 50000 100000}
DIR_FILES=${DIR_FILES:-1000}
OUT=${OUT:-target/bench-shared-join}
ensure_packages python3:python3 redis-server:redis-server
check_prereqs mount serve || exit 2
check_bench bars || exit 2
mkdir -p "$OUT"
lib_init benchsharedjoin
start_redis --own-trap
trap 'kill "$REDIS_PID" 2>/dev/null || true; cleanup' EXIT

addrs=""
for _ in 1 2; do
  start_server 1G
  addrs+=${addrs:+,}$SERVER_ADDR
done
mount_fs "$BASE/a" "$addrs" --volume bj --create --meta "$REDIS_URL"

rows=$BASE/rows.tsv
: >"$rows"
have=0
echo "# inodes, join (s), the joined daemon's resident memory (MiB)" >&2
for n in $SIZES; do
  fill_empty "$BASE/a" "$have" "$n" "$DIR_FILES"
  have=$n
  t0=$(date +%s.%N)
  mount_fs "$BASE/b" "$addrs" --volume bj --meta "$REDIS_URL"
  t1=$(date +%s.%N)
  pid=$(daemon_pids "$BASE/b" | head -1)
  rss=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
  seen=$(find "$BASE/b" -type f | wc -l)
  [ "$seen" = "$n" ] || { echo "the joined client lists $seen files, not $n" >&2; exit 1; }
  unmount_fs "$BASE/b"
  join=$(python3 -c "print(f'{$t1 - $t0:.2f}')")
  printf '%s\t%s\t%s\n' "$n" "$join" "$((rss / 1024))" >>"$rows"
  printf '   %8s inodes: join %6s s, resident %5s MiB\n' "$n" "$join" "$((rss / 1024))" >&2
done
unmount_fs "$BASE/a"

python3 - "$rows" "$OUT" <<'PY'
import json, os, sys
rows = [tuple(map(float, l.split())) for l in open(sys.argv[1])]
(n0, t0, m0), (n1, t1, m1) = rows[0], rows[-1]
print(f"{'inodes':>10}{'join (s)':>12}{'resident (MiB)':>16}")
for n, t, m in rows:
    print(f"{int(n):>10}{t:>12.2f}{int(m):>16}")
if n1 > n0:
    k = (n1 - n0) / 1000
    print(f"per 1,000 inodes: join {(t1 - t0) / k * 1000:.1f} ms, "
          f"resident {(m1 - m0) / k * 1024:.0f} KiB")
groups = [f"{int(n):,} inodes" for n, _, _ in rows]
spec = {"title": "a client joining a shared volume, by the namespace's size",
        "series": ["joined client"],
        "panels": [{"heading": "join (the mount until it serves)", "unit": "s", "log": False,
                    "groups": groups, "values": [[t] for _, t, _ in rows]},
                   {"heading": "the joined daemon's resident memory", "unit": "MiB",
                    "log": False, "groups": groups, "values": [[m] for _, _, m in rows]}]}
json.dump(spec, open(os.path.join(sys.argv[2], "spec.json"), "w"), indent=1)
PY
draw_chart "$OUT/spec.json" "$OUT/chart.svg"
