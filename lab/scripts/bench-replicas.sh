#!/usr/bin/env bash
# What two copies cost and what a lost server costs, in one run on loopback (three memory
# servers):
#   1. fio seq-read/seq-write 1 MiB and rand-read/rand-write 4 KiB (lab/fio/*.fio) with
#      --replicas 1 and --replicas 2, and the ratio 2/1;
#   2. the failover pause: the longest single read or write (fio max completion latency, 64 KiB
#      random read/write) across a server killed (SIGKILL) and one frozen (SIGSTOP) past the
#      detection time (--op-timeout DETECT), against the detection time;
#   3. the rebuild: REBUILD_DATA bytes written with two copies, the server holding the most
#      killed, and the time until `stats` shows no chunk short of a copy (--rebuild-rate 0,
#      --rebuild-delay 0): bytes copied, MB/s.
#
#   lab/scripts/bench-replicas.sh
#   SIZE=256M RUNTIME=8 REBUILD_DATA=1G lab/scripts/bench-replicas.sh
#
# Results in OUT (default target/bench-replicas): fio JSON per run, summary.json, and chart.svg
# (the fio figures with one and two copies). Needs root and /dev/fuse; installs fio when missing
# (Debian).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh

SIZE=${SIZE:-256M}
RUNTIME=${RUNTIME:-8}
DETECT=${DETECT:-2}
REBUILD_DATA=${REBUILD_DATA:-1G}
OUT=${OUT:-target/bench-replicas}
export SIZE RUNTIME
JOBS=(seq-write seq-read rand-write rand-read)

ensure_packages fio:fio python3:python3 fusermount3:fuse3 numfmt:coreutils
check_prereqs mount serve || exit 2
check_bench bars || exit 2
size_bytes=$(numfmt --from=iec "$SIZE")
data_bytes=$(numfmt --from=iec "$REBUILD_DATA")
# Room for one fio file in two copies, or for the rebuild data in two copies on two servers.
SERVER_SIZE=$(((size_bytes * 2 > data_bytes ? size_bytes * 2 : data_bytes) / 1048576 + 128))M
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT"/*.json "$OUT"/*.txt "$OUT/chart.svg"
lib_init benchrep

# three_servers: starts three memory servers; sets PIDS and ADDRS.
three_servers() {
  PIDS=() ADDRS=""
  for _ in 1 2 3; do
    start_server "$SERVER_SIZE" --op-timeout "$DETECT"
    PIDS+=("$SERVER_PID")
    ADDRS+=${ADDRS:+,}$SERVER_ADDR
  done
}

for r in 1 2; do
  echo "== fio, --replicas $r (three servers of $SERVER_SIZE)" >&2
  three_servers
  mnt=$BASE/mnt-r$r
  mount_fs "$mnt" "$ADDRS" --replicas "$r"
  for job in "${JOBS[@]}"; do
    case $job in seq-*) bs=1M ;; *) bs=4k ;; esac
    echo "   $job (bs $bs, size $SIZE, ${RUNTIME} s)" >&2
    DIR=$mnt BS=$bs timeout -k 10 $((RUNTIME + 600)) \
      fio --output-format=json --output="$OUT/r$r-$job.json" "lab/fio/$job.fio"
    rm -f "$mnt/$job".*
  done
  unmount_fs "$mnt"
  kill_servers "${PIDS[@]}"
done

for fault in kill freeze; do
  echo "== failover pause: a server ${fault} during 64 KiB random reads and writes" >&2
  three_servers
  mnt=$BASE/mnt-$fault
  mount_fs "$mnt" "$ADDRS" --replicas 2 --op-timeout "$DETECT"
  fio --name=pause --directory="$mnt" --size=64M --bs=64k --rw=randrw --ioengine=psync \
    --runtime=$((DETECT * 4 + 6)) --time_based=1 --output-format=json \
    --output="$OUT/pause-$fault.json" &
  fio_pid=$!
  sleep 3
  if [ "$fault" = kill ]; then
    kill -KILL "${PIDS[1]}"
  else
    kill -STOP "${PIDS[1]}"
    sleep $((DETECT * 2))
    kill -CONT "${PIDS[1]}"
  fi
  wait "$fio_pid"
  unmount_fs "$mnt"
  kill_servers "${PIDS[@]}"
done

echo "== rebuild: $REBUILD_DATA in two copies, the fullest server killed" >&2
three_servers
mnt=$BASE/mnt-rebuild
mount_fs "$mnt" "$ADDRS" --replicas 2 --rebuild-rate 0 --rebuild-delay 0
per=$((data_bytes / 8 / 1048576))
for i in 0 1 2 3 4 5 6 7; do
  dd if=/dev/urandom of="$mnt/d$i" bs=1M count="$per" status=none
done
sync -f "$mnt"
st=$("$BIN" stats "$mnt")
# The server holding the most bytes (total - free), by its index in --servers.
victim=$(awk '/^server server#/ { split($2, a, "#"); for (i = 1; i <= NF; i++) if ($i == "of") used = $(i + 1) - $(i - 1); if (used > best) { best = used; v = a[2] + 0; held = used } } END { print v, held }' <<<"$st")
read -r vidx held <<<"$victim"
t0=$(date +%s.%N)
kill -KILL "${PIDS[$vidx]}"
st=$(wait_rebuilt "$mnt")
t1=$(date +%s.%N)
grep -E "^(chunks|rebuild)" <<<"$st" >"$OUT/rebuild-stats.txt"
copied=$(sed -n 's/.* chunks (\([0-9]*\) bytes) copied.*/\1/p' "$OUT/rebuild-stats.txt")
last_rate=$(sed -n 's/.*last rate \([0-9]*\) bytes\/s.*/\1/p' "$OUT/rebuild-stats.txt")
unmount_fs "$mnt"
kill_servers "${PIDS[@]}"

python3 - "$OUT" "$DETECT" "$held" "$copied" "$last_rate" "$t0" "$t1" <<'PY'
import json, os, sys
sys.path.insert(0, "lab/scripts")
from fio_result import fio_job, fio_side  # noqa: E402

out, detect, held, copied, last_rate, t0, t1 = sys.argv[1:8]
detect, held, copied, last_rate = float(detect), int(held), int(copied or 0), int(last_rate or 0)
elapsed = float(t1) - float(t0)


jobs = ["seq-read", "seq-write", "rand-read", "rand-write"]
res = {}
print("# fio over three loopback servers: psync, direct=0; MB/s = 10^6 bytes/s")
print(f"{'job':<11} {'r1 MB/s':>9} {'r2 MB/s':>9} {'r1 IOPS':>9} {'r2 IOPS':>9} {'r2/r1':>7}")
for job in jobs:
    row = {}
    for r in (1, 2):
        f = fio_side(os.path.join(out, f"r{r}-{job}.json"), job)
        row[r] = {"mb_s": f["mb_s"], "iops": f["iops"]}
    ratio = row[2]["mb_s"] / row[1]["mb_s"] if row[1]["mb_s"] else 0
    res[job] = {"replicas_1": row[1], "replicas_2": row[2], "ratio": ratio}
    print(f"{job:<11} {row[1]['mb_s']:>9.1f} {row[2]['mb_s']:>9.1f} {row[1]['iops']:>9.0f} "
          f"{row[2]['iops']:>9.0f} {ratio:>6.2f}x")

pause = {}
print()
print(f"# failover pause (longest single 64 KiB read or write), detection time {detect:.0f} s")
for fault in ("kill", "freeze"):
    j = fio_job(os.path.join(out, f"pause-{fault}.json"))
    worst = max(j["read"]["clat_ns"]["max"], j["write"]["clat_ns"]["max"]) / 1e9
    errors = j.get("error", 0)
    pause[fault] = {"max_latency_s": worst, "fio_error": errors}
    print(f"server {fault:<7} longest op {worst:6.2f} s   (target <= detection + 1 s = "
          f"{detect + 1:.0f} s)   fio errors {errors}")

print()
rate = copied / elapsed / 1e6 if elapsed > 0 else 0
print(f"# rebuild after killing the server holding {held / 2**20:.0f} MiB of copies")
print(f"copied {copied / 2**20:.0f} MiB; back to two copies of everything {elapsed:.2f} s after "
      f"the kill: {rate:.0f} MB/s end to end; the rebuild pass itself {last_rate / 1e6:.0f} MB/s")
summary = {"fio": res, "failover_pause": pause,
           "rebuild": {"held_bytes": held, "copied_bytes": copied, "seconds": elapsed,
                       "mb_s_end_to_end": rate, "pass_mb_s": last_rate / 1e6}}
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
seq, rand = ["seq-read", "seq-write"], ["rand-read", "rand-write"]
spec = {
    "title": "one copy against two, three servers on loopback (fio psync)",
    "series": ["--replicas 1", "--replicas 2"],
    "panels": [
        {"heading": "1 MiB sequential", "unit": "MB/s", "groups": seq,
         "values": [[res[j]["replicas_1"]["mb_s"], res[j]["replicas_2"]["mb_s"]] for j in seq]},
        {"heading": "4 KiB random", "unit": "thousands of IOPS", "groups": rand,
         "values": [[res[j]["replicas_1"]["iops"] / 1e3, res[j]["replicas_2"]["iops"] / 1e3]
                    for j in rand]},
    ],
}
with open(os.path.join(out, "spec.json"), "w") as f:
    json.dump(spec, f, indent=1)
print(f"\n# results in {out}")
PY
draw_chart "$OUT/spec.json" "$OUT/chart.svg"
