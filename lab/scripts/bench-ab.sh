#!/usr/bin/env bash
# Two rmemfs binaries side by side in one run (A/B): the fio jobs of lab/scripts/bench-fio.sh that
# matter most (1 MiB sequential write and read, 4 KiB random write and read; one job each,
# psync through the page cache, caches dropped before reads), on a mount of one memory server
# of each binary, in alternating rounds so drift on this VM hits both alike. Prints a table of
# MB/s and IOPS per round and the B/A ratio of the medians.
#
#   lab/scripts/bench-ab.sh A_BIN B_BIN [ROUNDS]
#   A_ARGS="-o no_io_uring" B_ARGS="-o no_io_uring" lab/scripts/bench-ab.sh old/rmemfs target/release/rmemfs
#
# Settings (environment): SIZE (file size per job, default 512M), RUNTIME (seconds per job,
# default 5), SERVER_SIZE (each memory server's arena, default 2G: a pool above 1.9 GB, where
# even older binaries keep the writeback cache on; give 1536M to see a small pool),
# A_ARGS / B_ARGS (extra `rmemfs mount` arguments for each side), A_SERVE / B_SERVE (extra
# `rmemfs serve` arguments, e.g. --lazy; an older binary knows none of the newer ones).
# AB_JOBS: the jobs to run, of the four (e.g. AB_JOBS=rand-write; all four by default).
# Needs root and /dev/fuse; installs fio when missing (Debian).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh

[ $# -ge 2 ] || {
  echo "usage: $0 A_BIN B_BIN [ROUNDS]" >&2
  exit 2
}
A_BIN=$(realpath "$1")
B_BIN=$(realpath "$2")
ROUNDS=${3:-2}
SIZE=${SIZE:-512M}
RUNTIME=${RUNTIME:-5}
SERVER_SIZE=${SERVER_SIZE:-2G}
read -ra A_MOUNT <<<"${A_ARGS:-}"
read -ra B_MOUNT <<<"${B_ARGS:-}"
read -ra A_SRV <<<"${A_SERVE:-}"
read -ra B_SRV <<<"${B_SERVE:-}"
JOBS=(${AB_JOBS:-seq-write seq-read rand-write rand-read})
export RUNTIME

ensure_packages fio:fio python3:python3 fusermount3:fuse3
BIN=$A_BIN check_prereqs mount serve || exit 2
BIN=$B_BIN check_prereqs mount serve || exit 2
lib_init bench-ab
OUT=$BASE/out
mkdir -p "$OUT"

# one SIDE ROUND: a server and a mount of that side's binary, the jobs, then both gone.
one() {
  local side=$1 round=$2 job bs mnt=$BASE/mnt-$1 srv_args mnt_args
  if [ "$side" = A ]; then
    BIN=$A_BIN srv_args=("${A_SRV[@]}") mnt_args=("${A_MOUNT[@]}")
  else
    BIN=$B_BIN srv_args=("${B_SRV[@]}") mnt_args=("${B_MOUNT[@]}")
  fi
  start_server "$SERVER_SIZE" "${srv_args[@]}" >/dev/null
  mount_fs "$mnt" "$SERVER_ADDR" "${mnt_args[@]}"
  for job in "${JOBS[@]}"; do
    case $job in seq-*) bs=1M ;; *) bs=4k ;; esac
    if [[ $job == *-read ]]; then
      SIZE=$SIZE DIR=$mnt BS=$bs timeout -k 10 600 \
        fio --create_only=1 --output=/dev/null "lab/fio/$job.fio"
      drop_caches "$mnt"
    fi
    SIZE=$SIZE DIR=$mnt BS=$bs timeout -k 10 $((RUNTIME + 600)) \
      fio --output-format=json --output="$OUT/$side-$round-$job.json" "lab/fio/$job.fio"
    # shellcheck disable=SC2016 # expanded by the inner bash
    timeout -k 10 120 bash -c 'rm -f "$1/$2".*' _ "$mnt" "$job"
  done
  t "$BIN" stats "$mnt" | grep -E '^(fuse|writeback)' >"$OUT/$side-$round.stats" || true
  unmount_fs "$mnt"
  kill_servers "$SERVER_PID"
}

for ((r = 1; r <= ROUNDS; r++)); do
  # Alternate which side goes first.
  if [ $((r % 2)) = 1 ]; then one A "$r"; one B "$r"; else one B "$r"; one A "$r"; fi
done

python3 - "$OUT" "$ROUNDS" "${JOBS[*]}" "$A_BIN ${A_ARGS:-}" "$B_BIN ${B_ARGS:-}" <<'PY'
import statistics, sys
sys.path.insert(0, "lab/scripts")
from fio_result import fio_side  # noqa: E402
out, rounds, jobs, a, b = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4], sys.argv[5]
def fig(side, r, job):
    f = fio_side(f"{out}/{side}-{r}-{job}.json", job)
    return f["mb_s"], f["iops"]
print(f"A: {a}\nB: {b}")
for side in "AB":
    for r in range(1, rounds + 1):
        print(f"{side} round {r}: " + open(f"{out}/{side}-{r}.stats").read().replace("\n", "; "))
print(f"{'job':<12}{'A MB/s (IOPS) per round':<40}{'B MB/s (IOPS) per round':<40}B/A")
for job in jobs:
    cols = []
    med = {}
    for side in "AB":
        figs = [fig(side, r, job) for r in range(1, rounds + 1)]
        cols.append(", ".join(f"{m:.0f} ({i:.0f})" for m, i in figs))
        med[side] = statistics.median(m for m, _ in figs)
    print(f"{job:<12}{cols[0]:<40}{cols[1]:<40}{med['B'] / med['A']:.2f}")
PY
