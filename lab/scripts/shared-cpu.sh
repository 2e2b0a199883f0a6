#!/usr/bin/env bash
# Where the CPU of a shared volume's creates goes (#44): 1 and CLIENTS shared clients (a daemon
# each, Redis on loopback, two memory servers) create FILES empty files each in directories of
# their own, all started behind a barrier; for each run, the creates per second, and the CPU
# time per create (user and system, from /proc) of Redis, of the daemons (together) and of the
# whole machine, the kernel's share of it, Redis's own time per script (`INFO commandstats`)
# and the FUSE requests per create of client 1. ROUNDS runs of each, alternating; medians.
# PERF=1 also samples the whole machine with perf in the last CLIENTS-client run and prints
# the share of each process. Prints results only.
#
#   lab/scripts/shared-cpu.sh [RMEMFS]    # FILES=3000 CLIENTS=3 ROUNDS=3; default target/release
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh
BIN=$(realpath "${1:-target/release/rmemfs}")
FILES=${FILES:-3000} CLIENTS=${CLIENTS:-3} ROUNDS=${ROUNDS:-3} TAR_FILES=${TAR_FILES:-10}
shared_bench_init sharedcpu
start_servers 2 1G
roots=()
for ((i = 1; i <= CLIENTS; i++)); do
  made=()
  [ "$i" = 1 ] && made=(--create)
  mount_fs "$BASE/s$i" "$SERVER_ADDRS" --volume cpu "${made[@]}" --meta "$REDIS_URL"
  roots+=("$BASE/s$i")
done
daemons=$(pgrep -f "rmemfs mount .*--meta" | tr '\n' ' ')
hz=$(getconf CLK_TCK)

cat >"$BASE/creates.py" <<'PY'
import multiprocessing as mp, os, sys, time
files, roots = int(sys.argv[1]), sys.argv[2:]
run = f"run{time.monotonic_ns()}"
os.makedirs(os.path.join(roots[0], run))
def client(i, barrier, q):
    d = os.path.join(roots[i], run, f"c{i}")
    os.makedirs(d, exist_ok=True)
    barrier.wait()
    t = time.perf_counter()
    for n in range(files):
        os.close(os.open(f"{d}/f{n}", os.O_CREAT | os.O_WRONLY, 0o644))
    q.put((t, time.perf_counter()))
barrier, q = mp.Barrier(len(roots)), mp.Queue()
procs = [mp.Process(target=client, args=(i, barrier, q)) for i in range(len(roots))]
for p in procs: p.start()
for p in procs:
    p.join()
    assert p.exitcode == 0, "a client failed"
spans = [q.get() for _ in procs]
print(f"{len(roots) * files / (max(b for _, b in spans) - min(a for a, _ in spans)):.0f}")
PY

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }           # user + system, in ticks
sum_ticks() { local p n=0; for p in "$@"; do n=$((n + $(ticks "$p"))); done; echo "$n"; }
machine() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8, $4 + $7 + $8}' /proc/stat; } # all, kernel
requests() { "$BIN" stats --json "${roots[0]}"; }

results=$BASE/results.tsv # clients, figure, value
: >"$results"
one_run() { # CLIENTS [perf]
  local n=$1 ops r0 d0 m0 k0 r1 d1 m1 k1 rate evalsha
  ops=$((FILES * n))
  requests >"$BASE/req0.json"
  redis-cli -u "$REDIS_URL" config resetstat >/dev/null
  r0=$(ticks "$REDIS_PID") d0=$(sum_ticks $daemons)
  read -r m0 k0 < <(machine)
  if [ "${2:-}" = perf ]; then
    rate=$(perf record -F 999 -a -o "$BASE/perf.data" -- python3 "$BASE/creates.py" "$FILES" "${roots[@]:0:n}" 2>/dev/null)
  else
    rate=$(python3 "$BASE/creates.py" "$FILES" "${roots[@]:0:n}")
  fi
  r1=$(ticks "$REDIS_PID") d1=$(sum_ticks $daemons)
  read -r m1 k1 < <(machine)
  evalsha=$(redis-cli -u "$REDIS_URL" info commandstats | tr -d '\r' |
    sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/\1/p')
  us() { echo $((($2 - $1) * 1000000 / hz / ops)); }
  printf '%s\t%s\t%s\n' "$n" "creates/s" "$rate" "$n" "redis-cpu-us" "$(us "$r0" "$r1")" \
    "$n" "daemons-cpu-us" "$(us "$d0" "$d1")" "$n" "machine-cpu-us" "$(us "$m0" "$m1")" \
    "$n" "kernel-cpu-us" "$(us "$k0" "$k1")" "$n" "redis-us-per-script" "${evalsha:-0}" >>"$results"
  requests >"$BASE/req1.json"
  python3 - "$BASE/req0.json" "$BASE/req1.json" "$FILES" "$n" >>"$results" <<'PY'
import json, sys
a, b = (json.load(open(f))["requests"] for f in sys.argv[1:3])
files, n = int(sys.argv[3]), sys.argv[4]
for op, v in sorted(b.items()):
    d = v["count"] - a.get(op, {"count": 0})["count"]
    if d > 0:
        print(f"{n}\tfuse-{op}-per-create\t{d / files:.2f}")
PY
}

for ((round = 1; round <= ROUNDS; round++)); do
  one_run 1
  if [ "${PERF:-0}" = 1 ] && [ "$round" = "$ROUNDS" ]; then one_run "$CLIENTS" perf; else one_run "$CLIENTS"; fi
done

python3 - "$results" <<'PY'
import statistics, sys
got = {}
for line in open(sys.argv[1]):
    n, figure, value = line.rstrip("\n").split("\t")
    got.setdefault((figure, n), []).append(float(value))
clients = sorted({n for _, n in got}, key=int)
figures = list(dict.fromkeys(f for f, _ in got))
print(f"{'figure (medians)':<28}" + "".join(f"{n + ' client(s)':>14}" for n in clients))
for f in figures:
    cells = [got.get((f, n)) for n in clients]
    print(f"{f:<28}" + "".join(f"{statistics.median(c):>14.2f}" if c else f"{'-':>14}" for c in cells))
PY
if [ "${PERF:-0}" = 1 ]; then
  echo "share of the samples by process (the last $CLIENTS-client run):"
  perf report -i "$BASE/perf.data" --no-children --sort comm -g none --percent-limit 1 --stdio 2>/dev/null |
    grep -v '^#' | grep -v '^$'
fi
