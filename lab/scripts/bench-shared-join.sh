#!/usr/bin/env bash
# What a client joining a shared volume pays, by the namespace's size (#44: the join's bound):
# one client fills the volume to each size in SIZES (empty files, DIR_FILES to a directory),
# then a second client mounts it: the time its `mount` takes (the join, until it serves),
# its daemon's resident memory then, the time of its first `ls` of one directory, of a
# `find` over everything (which loads what it has not), and its resident memory after;
# then it unmounts. With OLD_BIN (an rmemfs before format 7, which loads the whole
# namespace at the join) the same runs with it first, on a volume of its own: side by side.
# Prints a row per build and size.
#
#   lab/scripts/bench-shared-join.sh
#   OLD_BIN=/tmp/old/rmemfs SIZES="10000 100000" lab/scripts/bench-shared-join.sh
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
  start_server 2G
  addrs+=${addrs:+,}$SERVER_ADDR
done

rows=$BASE/rows.tsv
: >"$rows"
secs() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.3f}')" "$@"; }
rss_of() { awk '/^VmRSS/ {print int($2 / 1024)}' "/proc/$(daemon_pids "$1" | head -1)/status"; }
run() { # LABEL BINARY VOLUME
  local label=$1 bin=$2 vol=$3 have=0 n
  BIN=$bin mount_fs "$BASE/a-$vol" "$addrs" --volume "$vol" --create --meta "$REDIS_URL"
  for n in $SIZES; do
    fill_empty "$BASE/a-$vol" "$have" "$n" "$DIR_FILES"
    have=$n
    local t0 t1 t2 t3 rss0 rss1 seen
    t0=$(date +%s.%N)
    BIN=$bin mount_fs "$BASE/b-$vol" "$addrs" --volume "$vol" --meta "$REDIS_URL"
    t1=$(date +%s.%N)
    rss0=$(rss_of "$BASE/b-$vol")
    ls "$BASE/b-$vol/$(ls "$BASE/b-$vol" | head -1)" >/dev/null
    t2=$(date +%s.%N)
    seen=$(find "$BASE/b-$vol" -type f | wc -l)
    t3=$(date +%s.%N)
    rss1=$(rss_of "$BASE/b-$vol")
    [ "$seen" = "$n" ] || { echo "$label: the joined client lists $seen files, not $n" >&2; exit 1; }
    BIN=$bin unmount_fs "$BASE/b-$vol"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$label" "$n" "$(secs "$t0" "$t1")" "$rss0" \
      "$(secs "$t1" "$t2")" "$(secs "$t2" "$t3")" "$rss1" >>"$rows"
    printf '   %-12s %8s inodes: join %s s, %s MiB; first ls %s s; find %s s, %s MiB\n' \
      "$label" "$n" "$(secs "$t0" "$t1")" "$rss0" "$(secs "$t1" "$t2")" "$(secs "$t2" "$t3")" \
      "$rss1" >&2
  done
  BIN=$bin unmount_fs "$BASE/a-$vol"
}
echo "# build, inodes: join (s), resident then (MiB), first ls (s), find (s), resident after" >&2
[ -n "${OLD_BIN:-}" ] && run "old" "$OLD_BIN" bjold
run "this build" "${BIN:-target/release/rmemfs}" bjnew

python3 - "$rows" "$OUT" <<'PY'
import json, os, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
print(f"{'build':<12}{'inodes':>10}{'join (s)':>10}{'MiB':>6}{'first ls':>10}{'find (s)':>10}{'MiB':>6}")
for b, n, j, m0, ls, f, m1 in rows:
    print(f"{b:<12}{int(n):>10}{float(j):>10.2f}{m0:>6}{float(ls):>10.3f}{float(f):>10.2f}{m1:>6}")
builds = sorted({r[0] for r in rows}, key=[r[0] for r in rows].index)
sizes = sorted({int(r[1]) for r in rows})
def val(b, n, i):
    return next((float(r[i]) for r in rows if r[0] == b and int(r[1]) == n), 0.0)
groups = [f"{n:,} inodes" for n in sizes]
spec = {"title": "a client joining a shared volume, by the namespace's size",
        "series": builds,
        "panels": [{"heading": "join (the mount until it serves)", "unit": "s", "log": False,
                    "groups": groups, "values": [[val(b, n, 2) for b in builds] for n in sizes]},
                   {"heading": "the joined daemon's resident memory, at the join", "unit": "MiB",
                    "log": False, "groups": groups,
                    "values": [[val(b, n, 3) for b in builds] for n in sizes]}]}
json.dump(spec, open(os.path.join(sys.argv[2], "spec.json"), "w"), indent=1)
PY
draw_chart "$OUT/spec.json" "$OUT/chart.svg"
