#!/usr/bin/env bash
# A/B of one shared-volume client (#44: writes held back, drops with their unlink): OLD and
# NEW binaries alternate ROUNDS times, each one client of a fresh shared volume (`--meta`,
# Redis on loopback) over two memory servers of its own binary: `tar xf` of the
# TAR_FILES-file tree (and the Redis scripts it ran per file), 1,000 empty files created in
# the tree's top directory (made before the tar: no turn of it held), then 500 new files of three
# 10 KiB writes each (each write timed: the first allocates the file's first chunk, the
# second moves it to a larger one, the third fits or moves it again), 1,000 4 KiB appends
# to one file and 1,000 4 KiB overwrites in it; then the 500 files unlinked (each timed)
# and the tree removed with `rm -rf` (and the Redis scripts it ran per file). Prints one
# line per binary and figure, then medians.
#
#   lab/scripts/ab-shared.sh OLD_RMEMFS NEW_RMEMFS     # ROUNDS=3 TAR_FILES=3000
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh
OLD=$1 NEW=$2 ROUNDS=${ROUNDS:-3} TAR_FILES=${TAR_FILES:-3000}
shared_bench_init abshared
tar=$TREE_TAR
results=$BASE/results
: >"$results"

# one_side NAME BINARY ROUND: a fresh volume, its servers and mount, the figures.
one_side() {
  local name=$1 round=$3 mnt=$BASE/m-$1-$3 t0 t1 scripts
  BIN=$2
  start_servers 2 1G
  mount_fs "$mnt" "$SERVER_ADDRS" --volume "ab$name$round" --create --meta "$REDIS_URL"
  redis-cli -u "$REDIS_URL" config resetstat >/dev/null
  mkdir "$mnt/tree"
  t0=$(date +%s.%N)
  tar xf "$tar" -C "$mnt/tree"
  t1=$(date +%s.%N)
  scripts=$(redis-cli -u "$REDIS_URL" info commandstats | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*/\1/p')
  echo "$name tar-x-s $(echo "$t1 - $t0" | bc)" >>"$results"
  echo "$name scripts-per-file $(echo "scale=2; ${scripts:-0} / $TAR_FILES" | bc)" >>"$results"
  python3 - "$mnt" "$name" "$REDIS_URL" >>"$results" <<'PY'
import os, re, subprocess, sys, time
d, name, redis = sys.argv[1], sys.argv[2], sys.argv[3]
def calls():
    # Scripts run and log reads (XRANGE) so far.
    out = subprocess.run(["redis-cli", "-u", redis, "info", "commandstats"],
                         capture_output=True, text=True).stdout
    n = lambda cmd: int((re.search(rf"cmdstat_{cmd}:calls=(\d+)", out) or [0, 0])[1])
    usec = int((re.search(r"cmdstat_evalsha:calls=\d+,usec=(\d+)", out) or [0, 0])[1])
    return n("evalsha"), n("xrange"), usec
# Creates in a directory made well before: its turn, held from the tar's last change there,
# has gone back (it lingers 50 ms), as in a directory made by an earlier job.
time.sleep(0.2)
before = calls()
t = time.perf_counter()
for n in range(1000):
    os.close(os.open(f"{d}/tree/c{n}", os.O_CREAT | os.O_WRONLY, 0o644))
print(f"{name} create-in-old-dir-us {(time.perf_counter() - t) / 1000 * 1e6:.0f}")
after = calls()
print(f"{name} create-scripts-per-file {(after[0] - before[0]) / 1000:.2f}")
print(f"{name} create-reads-per-file {(after[1] - before[1]) / 1000:.2f}")
print(f"{name} create-redis-us-per-file {(after[2] - before[2]) / 1000:.1f}")
spent = [0.0, 0.0, 0.0]
for n in range(500):
    fd = os.open(f"{d}/f{n}", os.O_CREAT | os.O_WRONLY, 0o644)
    for k in range(3):
        t = time.perf_counter()
        os.write(fd, b"x" * 10240)
        spent[k] += time.perf_counter() - t
    os.close(fd)
for k in range(3):
    print(f"{name} write{k + 1}-us {spent[k] / 500 * 1e6:.0f}")
fd = os.open(f"{d}/big", os.O_CREAT | os.O_WRONLY, 0o644)
t = time.perf_counter()
for k in range(1000):
    os.pwrite(fd, b"y" * 4096, k * 4096)
print(f"{name} append4k-us {(time.perf_counter() - t) / 1000 * 1e6:.0f}")
t = time.perf_counter()
for k in range(1000):
    os.pwrite(fd, b"z" * 4096, (k * 7919 % 1000) * 4096)
print(f"{name} overwrite4k-us {(time.perf_counter() - t) / 1000 * 1e6:.0f}")
os.close(fd)
t = time.perf_counter()
for n in range(500):
    os.unlink(f"{d}/f{n}")
print(f"{name} unlink-us {(time.perf_counter() - t) / 500 * 1e6:.0f}")
PY
  redis-cli -u "$REDIS_URL" config resetstat >/dev/null
  t0=$(date +%s.%N)
  rm -rf "$mnt/tree"
  t1=$(date +%s.%N)
  scripts=$(redis-cli -u "$REDIS_URL" info commandstats | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*/\1/p')
  echo "$name rm-rf-s $(echo "$t1 - $t0" | bc)" >>"$results"
  echo "$name rm-scripts-per-file $(echo "scale=2; ${scripts:-0} / $TAR_FILES" | bc)" >>"$results"
  unmount_fs "$mnt"
  kill "${SERVER_PIDS[@]}" 2>/dev/null || true
}

for ((r = 1; r <= ROUNDS; r++)); do
  one_side old "$OLD" "$r"
  one_side new "$NEW" "$r"
done
sed 's/^/   /' "$results"
python3 - "$results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    side, fig, v = line.split()
    rows.setdefault(fig, {}).setdefault(side, []).append(float(v))
print(f"{'figure (median)':<22}{'old':>10}{'new':>10}{'new/old':>10}")
for fig, sides in rows.items():
    o, n = statistics.median(sides["old"]), statistics.median(sides["new"])
    print(f"{fig:<22}{o:>10.2f}{n:>10.2f}{n / o if o else 0:>10.2f}")
PY
