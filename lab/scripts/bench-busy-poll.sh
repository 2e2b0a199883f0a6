#!/usr/bin/env bash
# `mount --busy-poll` against the default, measured both ways in one run: fio 4 KiB random
# reads (lab/fio/rand-read.fio) on one memory server, ROUNDS alternating rounds per setting,
# a fresh mount each; prints IOPS, p50 and p99 per round and the medians (#13 item 7), and
# draws the medians in OUT/chart.svg (default OUT target/bench-busy-poll).
#
#   lab/scripts/bench-busy-poll.sh
#   SIZE=256M RUNTIME=8 ROUNDS=5 lab/scripts/bench-busy-poll.sh
#
# Needs root and /dev/fuse (as mount-tests/run.sh); installs fio when missing (Debian).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh

SIZE=${SIZE:-256M}
RUNTIME=${RUNTIME:-8}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-target/bench-busy-poll}
ensure_packages fio:fio python3:python3
check_prereqs mount serve || exit 2
check_bench bars || exit 2
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
lib_init bench-busy-poll

start_server 4G
results=$BASE/results.json
echo "[]" >"$results"
for ((round = 1; round <= ROUNDS; round++)); do
  for setting in off on; do
    args=()
    [ "$setting" = on ] && args=(--busy-poll)
    mount_fs "$BASE/mnt" "$SERVER_ADDR" "${args[@]}"
    DIR=$BASE/mnt BS=4k SIZE=$SIZE RUNTIME=$RUNTIME timeout -k 10 $((RUNTIME + 600)) \
      fio --output-format=json --output="$BASE/fio.json" lab/fio/rand-read.fio >/dev/null
    python3 - "$BASE/fio.json" "$setting" "$round" "$results" <<'PY'
import json, sys
sys.path.insert(0, "lab/scripts")
from fio_result import fio_side  # noqa: E402
path, setting, rnd, results = sys.argv[1:5]
read = fio_side(path, rw="read")
row = {"setting": setting, "iops": read["iops"], "p50_us": read["p50_us"],
       "p99_us": read["p99_us"]}
rows = json.load(open(results)) + [row]
json.dump(rows, open(results, "w"))
print(f"busy-poll {setting:<3} round {rnd}: {row['iops']:8.0f} IOPS  p50 {row['p50_us']:6.1f} us"
      f"  p99 {row['p99_us']:6.1f} us")
PY
    timeout -k 10 120 rm -f "$BASE/mnt"/rand-read.*
    unmount_fs "$BASE/mnt"
  done
done
kill_servers "$SERVER_PID"
python3 - "$results" "$OUT" "$SIZE" "$ROUNDS" <<'PY'
import json, os, statistics, sys
rows = json.load(open(sys.argv[1]))
out, size, rounds = sys.argv[2:5]
print()
medians = {}
for setting in ("off", "on"):
    r = [x for x in rows if x["setting"] == setting]
    medians[setting] = {k: statistics.median(x[k] for x in r) for k in ("iops", "p50_us", "p99_us")}
    m = medians[setting]
    print(f"median, busy-poll {setting:<3}: {m['iops']:8.0f} IOPS  p50 {m['p50_us']:6.1f} us"
          f"  p99 {m['p99_us']:6.1f} us")
json.dump({"rounds": rows, "medians": medians}, open(os.path.join(out, "summary.json"), "w"), indent=2)
off, on = medians["off"], medians["on"]
spec = {
    "title": f"--busy-poll: fio 4 KiB random reads ({size}), one server, medians of {rounds} rounds",
    "series": ["busy-poll off (default)", "busy-poll on"],
    "panels": [
        {"heading": "throughput", "unit": "thousands of IOPS", "groups": ["IOPS"],
         "values": [[off["iops"] / 1e3, on["iops"] / 1e3]]},
        {"heading": "completion latency", "unit": "microseconds", "groups": ["p50", "p99"],
         "values": [[off["p50_us"], on["p50_us"]], [off["p99_us"], on["p99_us"]]]},
    ],
}
json.dump(spec, open(os.path.join(out, "spec.json"), "w"), indent=1)
PY
draw_chart "$OUT/spec.json" "$OUT/chart.svg"
