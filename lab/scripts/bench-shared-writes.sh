#!/usr/bin/env bash
# Writes of many clients on one shared volume (#44): each client (a daemon of its own, all on
# one volume whose namespace is in Redis) writes a file of its own with fio, alone and then
# CLIENTS at once; sequential 1 MiB writes and random 4 KiB writes, each job ending in an
# fsync. All clients' fio start together; the rate is every client's bytes over the time from
# the start to the last finish. The single-writer volume (one daemon, CLIENTS fio processes
# on it) runs beside, as the same machine's ceiling.
#
#   lab/scripts/bench-shared-writes.sh
#   SIZE=256M RAND_SIZE=64M CLIENTS=3 ROUNDS=3 lab/scripts/bench-shared-writes.sh
#
# SIZE: each sequential file (default 256M); RAND_SIZE: the random writes per client
# (default 64M: 16,384 writes of 4 KiB, each a change the engine orders); ROUNDS: repeats,
# the table gives medians. Prints MiB/s per system, clients and workload, then the gain from
# 1 to CLIENTS clients. Needs root and /dev/fuse; installs fio and redis-server if missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh

SIZE=${SIZE:-256M}
RAND_SIZE=${RAND_SIZE:-64M}
CLIENTS=${CLIENTS:-3}
ROUNDS=${ROUNDS:-1}
OUT=${OUT:-target/bench-shared-writes}
ensure_packages python3:python3 fio:fio redis-server:redis-server
check_prereqs mount serve || exit 2
check_bench bars || exit 2
mkdir -p "$OUT"
lib_init benchsharedw
start_redis --own-trap
trap 'kill "$REDIS_PID" 2>/dev/null || true; cleanup' EXIT

addrs=""
for _ in 1 2; do
  start_server 4G
  addrs+=${addrs:+,}$SERVER_ADDR
done
mount_fs "$BASE/vol" "$addrs" --volume bw --create
for ((i = 1; i <= CLIENTS; i++)); do
  made=()
  [ "$i" = 1 ] && made=(--create)
  mount_fs "$BASE/shared$i" "$addrs" --volume bsw "${made[@]}" --meta "$REDIS_URL"
done

runner=$BASE/fio_together.py
cat >"$runner" <<'PY'
import os, subprocess, sys, time
# fio_together.py KIND SIZE DIR... : one fio per DIR, started together; prints MiB/s of all.
kind, size, dirs = sys.argv[1], sys.argv[2], sys.argv[3:]
rw, bs = {"seq": ("write", "1M"), "rand": ("randwrite", "4k")}[kind]
tag = f"w{time.monotonic_ns()}"
procs, total = [], 0
start = time.perf_counter()
for i, d in enumerate(dirs):
    f = os.path.join(d, f"{tag}-{i}")
    procs.append(subprocess.Popen(
        ["fio", "--name=w", f"--filename={f}", f"--rw={rw}", f"--bs={bs}", f"--size={size}",
         "--ioengine=psync", "--end_fsync=1", "--output-format=terse"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
for p in procs:
    _, err = p.communicate()
    if p.returncode != 0:
        sys.exit(f"fio failed: {err.decode()[-300:]}")
elapsed = time.perf_counter() - start
units = {"K": 2**10, "M": 2**20, "G": 2**30}
each = int(size[:-1]) * units[size[-1]]
print(f"{len(dirs) * each / elapsed / 2**20:.1f}")
for i, d in enumerate(dirs):
    os.unlink(os.path.join(d, f"{tag}-{i}"))
PY

results=$BASE/results.tsv
: >"$results"
run() { # SYSTEM CLIENTS KIND SIZE DIR...
  local sys=$1 n=$2 kind=$3 size=$4 got
  shift 4
  got=$(python3 "$runner" "$kind" "$size" "$@") || { echo "$sys: $got" >&2; exit 1; }
  printf '%s\t%s\t%s\t%s\n' "$sys" "$n" "$kind" "$got" >>"$results"
  printf '   %-14s %s client(s) %-5s %s MiB/s\n' "$sys" "$n" "$kind" "$got" >&2
}

echo "# $SIZE sequential and $RAND_SIZE random per client; $CLIENTS clients at most" >&2
vols=()
shared=()
for ((i = 1; i <= CLIENTS; i++)); do
  vols+=("$BASE/vol")
  shared+=("$BASE/shared$i")
done
for ((round = 1; round <= ROUNDS; round++)); do
  for kind in seq rand; do
    size=$SIZE
    [ "$kind" = rand ] && size=$RAND_SIZE
    run rmemfs-volume 1 "$kind" "$size" "$BASE/vol"
    run rmemfs-shared 1 "$kind" "$size" "$BASE/shared1"
    run rmemfs-volume "$CLIENTS" "$kind" "$size" "${vols[@]}"
    run rmemfs-shared "$CLIENTS" "$kind" "$size" "${shared[@]}"
  done
done

python3 - "$results" "$CLIENTS" "$OUT" <<'PY'
import json, os, statistics, sys
got = {}
for line in open(sys.argv[1]):
    s, c, k, x = line.split()
    got.setdefault((s, c, k), []).append(float(x))
v = {key: statistics.median(xs) for key, xs in got.items()}
n = sys.argv[2]
print(f"{'MiB/s (median)':<22}{'volume':>12}{'shared':>12}")
for k in ("seq", "rand"):
    for c in ("1", n):
        print(f"{k + ' x' + c:<22}{v[('rmemfs-volume', c, k)]:>12.1f}{v[('rmemfs-shared', c, k)]:>12.1f}")
print(f"gain from 1 to {n} clients:")
for k in ("seq", "rand"):
    g = lambda s: v[(s, n, k)] / v[(s, "1", k)]
    print(f"{k:<22}{g('rmemfs-volume'):>12.2f}{g('rmemfs-shared'):>12.2f}")
systems = ("rmemfs-volume", "rmemfs-shared")
spec = {"title": "writes of many clients, each to a file of its own (fio, end_fsync)",
        "series": ["embedded volume", "shared (Redis)"],
        "panels": [{"heading": heading, "unit": "MiB/s", "log": False,
                    "groups": ["1 client", f"{n} clients"],
                    "values": [[v[(s, c, k)] for s in systems] for c in ("1", n)]}
                   for k, heading in (("seq", "sequential, 1 MiB writes"),
                                      ("rand", "random, 4 KiB writes"))]}
json.dump(spec, open(os.path.join(sys.argv[3], "spec.json"), "w"), indent=1)
PY
draw_chart "$OUT/spec.json" "$OUT/chart.svg"
