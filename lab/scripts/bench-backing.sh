#!/usr/bin/env bash
# What `serve --backing` costs: the fio benchmark's 1 MiB sequential write and 4 KiB random
# write jobs (lab/fio/seq-write.fio, rand-write.fio) on three mounts side by side, each over
# one memory server of its own: in RAM (plain), backed by a file on tmpfs (/dev/shm: what
# persistent memory or a DAX device gives), and backed by a file on a disk file system
# (BACKING_DIR). The jobs alternate over the three mounts round after round, and each
# figure is the median of its rounds, so the machine's drift and the page cache's
# variance fall on all three alike. Also: each server's start (its arena reserved), and a
# backed server's restart with the data in it (the file mapped again, every extent
# registered again).
#
#   lab/scripts/bench-backing.sh
#   ROUNDS=5 SIZE=1G RUNTIME=8 BACKING_DIR=/var/tmp lab/scripts/bench-backing.sh
#
# Prints one line per target and job (median MB/s, and each round's), the ratios to plain,
# and the start and restart times. Needs root and /dev/fuse.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh

ROUNDS=${ROUNDS:-5}
SIZE=${SIZE:-1G}
RUNTIME=${RUNTIME:-8}
BACKING_DIR=${BACKING_DIR:-/var/tmp}
ensure_packages fio:fio numfmt:coreutils python3:python3
check_prereqs mount serve || exit 2
size_bytes=$(numfmt --from=iec "$SIZE")
SERVER_SIZE=$((size_bytes * 2 / 1048576 + 64))M
lib_init benchbacking
export SIZE RUNTIME

tmpfs_file=$(mktemp -u /dev/shm/rmemfs-bench-backing.XXXXXX)
disk_file=$(mktemp -u "$BACKING_DIR/rmemfs-bench-backing.XXXXXX")
trap 'rm -f "$tmpfs_file" "$disk_file"; cleanup' EXIT
TARGETS=(plain backed-tmpfs backed-disk)
declare -A ARGS=([plain]="" [backed-tmpfs]="--backing $tmpfs_file" [backed-disk]="--backing $disk_file")
declare -A PID ADDR

# start TARGET: its server (PID, ADDR); says how long it took to listen.
start() {
  local t0 t1
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086 # the arguments are words
  start_server "$SERVER_SIZE" ${ARGS[$1]}
  t1=$(date +%s.%N)
  PID[$1]=$SERVER_PID ADDR[$1]=$SERVER_ADDR
  echo "start $1 ($SERVER_SIZE${ARGS[$1]:+, ${ARGS[$1]}}): listening after" \
    "$(python3 -c "print(f'{$t1 - $t0:.1f}')") s"
}

for t in "${TARGETS[@]}"; do
  start "$t"
  mount_fs "$BASE/$t" "${ADDR[$t]}"
done

results=$BASE/results
: >"$results"
for ((r = 1; r <= ROUNDS; r++)); do
  for job in seq-write rand-write; do
    case $job in seq-*) bs=1M ;; *) bs=4k ;; esac
    for t in "${TARGETS[@]}"; do
      drop_caches "$BASE/$t"
      SIZE=$SIZE DIR=$BASE/$t BS=$bs timeout -k 10 $((RUNTIME + 600)) \
        fio --output-format=json --output="$BASE/$t-$job-$r.json" "lab/fio/$job.fio"
      python3 -c 'import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]["write"]
print(sys.argv[2], sys.argv[3], j["bw_bytes"] / 1e6)' "$BASE/$t-$job-$r.json" "$t" "$job" >>"$results"
      rm -f "$BASE/$t/$job".*
    done
  done
  echo "round $r of $ROUNDS done" >&2
done

# A backed server's restart with the data in it: a file of SIZE written, the server killed
# and started again from its file, the mount resumes.
must "write a file to keep" dd if=/dev/urandom of="$BASE/backed-tmpfs/kept" bs=1M \
  count=$((size_bytes / 1048576)) conv=fsync status=none
addr=${ADDR[backed-tmpfs]}
kill -9 "${PID[backed-tmpfs]}"
for ((i = 0; i < 100; i++)); do kill -0 "${PID[backed-tmpfs]}" 2>/dev/null || break; sleep 0.1; done
t0=$(date +%s.%N)
# shellcheck disable=SC2086 # the arguments are words
"$BIN" serve --listen "$addr" --size "$SERVER_SIZE" ${ARGS[backed-tmpfs]} \
  >"$BASE/logs/restart.out" 2>"$BASE/logs/restart.err" </dev/null &
ALL_SERVER_PIDS+=("$!")
for ((i = 0; i < 600; i++)); do grep -q "listening on" "$BASE/logs/restart.out" && break; sleep 0.1; done
t1=$(date +%s.%N)
# The mount reconnects on its own schedule and resumes its session there.
for ((i = 0; i < 600; i++)); do
  "$BIN" stats --json "$BASE/backed-tmpfs" | python3 -c 'import json, sys
sys.exit(0 if all(s["state"] == "up" for s in json.load(sys.stdin)["servers"]) else 1)' && break
  sleep 0.1
done
t2=$(date +%s.%N)
restored=$(grep -o "restored [0-9]* extents ([0-9]* bytes) in [0-9.]* s" "$BASE/logs/restart.err" || echo "nothing restored")
drop_caches "$BASE/backed-tmpfs"
must "read the kept file after the restart" cat "$BASE/backed-tmpfs/kept" >/dev/null

python3 - "$results" "$ROUNDS" "$SIZE" "$RUNTIME" "$SERVER_SIZE" <<'PY'
import statistics, sys
path, rounds, size, runtime, server_size = sys.argv[1:]
runs = {}
for line in open(path):
    t, job, mb = line.split()
    runs.setdefault((t, job), []).append(float(mb))
print(f"# serve --backing: fio {size} files, {runtime} s per job, psync, through the page cache; "
      f"servers of {server_size}; median of {rounds} alternating rounds, MB/s")
print(f"{'target':<14} {'job':<11} {'median':>8}  rounds")
for (t, job), v in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    print(f"{t:<14} {job:<11} {statistics.median(v):>8.1f}  " + " ".join(f"{x:.0f}" for x in v))
for job in ("seq-write", "rand-write"):
    base = statistics.median(runs[("plain", job)])
    for t in ("backed-tmpfs", "backed-disk"):
        m = statistics.median(runs[(t, job)])
        print(f"{job} {t} / plain = {m / base:.2f}x")
PY
echo "restart of the tmpfs-backed server holding a $SIZE file: listening again in" \
  "$(python3 -c "print(f'{$t1 - $t0:.1f}')") s, up in the mount again after" \
  "$(python3 -c "print(f'{$t2 - $t0:.1f}')") s; $restored; the file read back through the mount"
