#!/usr/bin/env bash
# Erasure-coded data against three copies (#46), in one run on loopback: six memory servers,
# each round a fresh mount on fresh servers with --replicas 3, then --redundancy ec:4+2
# (ROUNDS rounds, the two alternating; the table gives medians):
#   1. a SIZE file written sequentially in 1 MiB writes (psync, end_fsync), and a SIZE/4 one
#      with direct=1;
#   2. (ec:4+2) the time until stats says encoding has finished, and what the servers hold
#      for the data (their used bytes less the empty mount's, over the files' bytes);
#   3. sequential 1 MiB reads of the file, then RUNTIME s of 4 KiB random reads (psync,
#      through the page cache dropped first: every read reaches the daemon);
#   4. RUNTIME s of 4 KiB random writes with direct=1 (on ec:4+2 these reach cold chunks,
#      each made copies again on its first write: the worst case);
#   5. encoded again, one server killed: sequential reads degraded (before the rebuild starts,
#      REBUILD_DELAY s after the kill), then the rebuild's rate.
#
#   lab/scripts/bench-ec.sh
#   SIZE=1G ROUNDS=3 RUNTIME=10 lab/scripts/bench-ec.sh
#
# Prints the figures of each mode and their ratio (ec / copies) beside the issue's targets.
# Needs root and /dev/fuse; installs fio when missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh

SIZE=${SIZE:-1G}
ROUNDS=${ROUNDS:-3}
RUNTIME=${RUNTIME:-10}
REBUILD_DELAY=${REBUILD_DELAY:-20}
OUT=${OUT:-target/bench-ec}
ensure_packages fio:fio python3:python3 numfmt:coreutils
check_prereqs mount serve || exit 2
size_bytes=$(numfmt --from=iec "$SIZE")
# Three copies of 1.25 x SIZE spread over six servers, with room to spare.
SERVER_SIZE=$((size_bytes * 5 / 4 * 3 / 6 * 3 / 2 / 1048576 + 256))M
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
lib_init benchec
results=$OUT/results.tsv
: >"$results"

fio_run() { # NAME FIO-ARGS...: prints MB/s and IOPS of the job's one direction
  local name=$1
  shift
  timeout -k 10 900 fio --name="$name" --ioengine=psync --output-format=json \
    --output="$OUT/$name.json" "$@" >/dev/null
  python3 - "$OUT/$name.json" <<'PY'
import sys
sys.path.insert(0, "lab/scripts")
from fio_result import fio_job
j = fio_job(sys.argv[1])
side = j["read"] if j["read"]["io_bytes"] > 0 else j["write"]
print(f'{side["bw_bytes"] / 1e6:.1f} {side["iops"]:.0f}')
PY
}

record() { # MODE FIGURE VALUE
  printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$results"
  printf '   %-8s %-22s %s\n' "$1" "$2" "$3" >&2
}

used_now() { # bytes the six servers hold
  echo $(($(servers_total) - $(servers_free)))
}

wait_encoded() { # MNT: waits until no chunk is left to encode and some are stripes
  local i
  for ((i = 0; i < 1200; i++)); do
    [ "$(stats_field "$1" 's["encoding"]["pending"]')" -eq 0 ] &&
      [ "$(stats_field "$1" 's["encoding"]["stripes"]')" -gt 0 ] && return 0
    sleep 0.25
  done
  echo "encoding did not finish within 300 s" >&2
  return 1
}

run_mode() { # MODE ARGS...
  local mode=$1 mnt pids=() used0 t0 t1 got
  shift
  ADDRS=""
  for _ in 1 2 3 4 5 6; do
    start_server "$SERVER_SIZE"
    pids+=("$SERVER_PID")
    ADDRS+=${ADDRS:+,}$SERVER_ADDR
  done
  mnt=$BASE/mnt-$mode
  # The rebuild waits REBUILD_DELAY s after the kill: the degraded reads are measured
  # before it starts (it would decode or copy beside them), its rate after.
  mount_fs "$mnt" "$ADDRS" --rebuild-delay "$REBUILD_DELAY" --rebuild-rate 0 "$@"
  used0=$(used_now)
  got=$(fio_run "$mode-seq-write" --filename="$mnt/seq" --rw=write --bs=1M --size="$SIZE" \
    --end_fsync=1)
  record "$mode" seq_write_mb_s "${got% *}"
  got=$(fio_run "$mode-seq-write-direct" --filename="$mnt/seqd" --rw=write --bs=1M \
    --size=$((size_bytes / 4)) --direct=1 --end_fsync=1)
  record "$mode" seq_write_direct_mb_s "${got% *}"
  if [ "$mode" = ec ]; then
    t0=$(date +%s.%N)
    wait_encoded "$mnt"
    t1=$(date +%s.%N)
    record "$mode" encoded_after_s "$(python3 -c "print(f'{$t1 - $t0:.1f}')")"
  fi
  settle=$(stats_field "$mnt" 's["encoding"]["copy_bytes"] + s["encoding"]["stripe_bytes"]')
  record "$mode" held_x "$(python3 -c "print(f'{($(used_now) - $used0) / ($size_bytes * 5 / 4):.3f}')")"
  record "$mode" held_by_map_x "$(python3 -c "print(f'{$settle / ($size_bytes * 5 / 4):.3f}')")"
  drop_caches "$mnt"
  got=$(fio_run "$mode-seq-read" --filename="$mnt/seq" --rw=read --bs=1M --size="$SIZE")
  record "$mode" seq_read_mb_s "${got% *}"
  drop_caches "$mnt"
  got=$(fio_run "$mode-rand-read" --filename="$mnt/seq" --rw=randread --bs=4k --size="$SIZE" \
    --runtime="$RUNTIME" --time_based=1)
  record "$mode" rand_read_iops "${got#* }"
  got=$(fio_run "$mode-rand-write" --filename="$mnt/seq" --rw=randwrite --bs=4k --size="$SIZE" \
    --runtime="$RUNTIME" --time_based=1 --direct=1)
  record "$mode" rand_write_direct_iops "${got#* }"
  [ "$mode" = ec ] && wait_encoded "$mnt"
  drop_caches "$mnt"
  kill -KILL "${pids[0]}"
  got=$(fio_run "$mode-seq-read-degraded" --filename="$mnt/seq" --rw=read --bs=1M --size="$SIZE")
  record "$mode" degraded_seq_read_mb_s "${got% *}"
  wait_rebuilt "$mnt" >/dev/null
  record "$mode" rebuild_mb_s "$(python3 -c "print(f'{$(stats_field "$mnt" 's["rebuild"]["last_rate_bytes_per_s"]') / 1e6:.0f}')")"
  unmount_fs "$mnt"
  kill_servers "${pids[@]}"
}

for ((r = 1; r <= ROUNDS; r++)); do
  echo "== round $r of $ROUNDS: three copies" >&2
  run_mode copies --replicas 3
  echo "== round $r of $ROUNDS: ec:4+2" >&2
  run_mode ec --redundancy ec:4+2
done

python3 - "$results" "$SIZE" "$ROUNDS" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    mode, fig, val = line.split("\t")
    rows[(mode, fig)].append(float(val))
med = {k: statistics.median(v) for k, v in rows.items()}
targets = {
    "seq_read_mb_s": ">= 0.9", "rand_read_iops": ">= 0.8", "seq_write_mb_s": ">= 0.7",
    "seq_write_direct_mb_s": ">= 0.7", "rand_write_direct_iops": ">= 0.5",
    "held_x": "<= 1.6 (ec)",
}
print(f"six servers, {sys.argv[2]} file, medians of {sys.argv[3]} rounds (alternating)")
print(f"| figure | three copies | ec:4+2 | ec / copies | target |")
print("| --- | --- | --- | --- | --- |")
for fig in ["seq_write_mb_s", "seq_write_direct_mb_s", "encoded_after_s", "held_x", "held_by_map_x",
            "seq_read_mb_s", "rand_read_iops", "rand_write_direct_iops",
            "degraded_seq_read_mb_s", "rebuild_mb_s"]:
    c, e = med.get(("copies", fig)), med.get(("ec", fig))
    ratio = f"{e / c:.2f}" if c and e else ""
    fmt = lambda v: "" if v is None else f"{v:g}"
    print(f"| {fig} | {fmt(c)} | {fmt(e)} | {ratio} | {targets.get(fig, '')} |")
c, e = med[("copies", "seq_read_mb_s")], med[("ec", "seq_read_mb_s")]
print(f"degraded / healthy sequential reads: copies {med[('copies', 'degraded_seq_read_mb_s')] / c:.2f}, "
      f"ec:4+2 {med[('ec', 'degraded_seq_read_mb_s')] / e:.2f} (target >= 0.5)")
PY
