#!/usr/bin/env bash
# `mount --busy-poll` against the default, measured both ways in one run: fio 4 KiB random
# reads (tools/fio/rand-read.fio) on one memory server, ROUNDS alternating rounds per setting,
# a fresh mount each; prints IOPS, p50 and p99 per round and the medians (#13 item 7).
#
#   tools/bench-busy-poll.sh
#   SIZE=256M RUNTIME=8 ROUNDS=5 tools/bench-busy-poll.sh
#
# Needs root and /dev/fuse (as mount-tests/run.sh); installs fio when missing (Debian).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=mount-tests/lib.sh
. mount-tests/lib.sh

SIZE=${SIZE:-256M}
RUNTIME=${RUNTIME:-8}
ROUNDS=${ROUNDS:-3}
ensure_packages fio:fio python3:python3
check_prereqs mount serve || exit 2
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
      fio --output-format=json --output="$BASE/fio.json" tools/fio/rand-read.fio >/dev/null
    python3 - "$BASE/fio.json" "$setting" "$round" "$results" <<'PY'
import json, sys
path, setting, rnd, results = sys.argv[1:5]
text = open(path).read()
read = json.loads(text[text.index("{"):])["jobs"][0]["read"]
pct = read["clat_ns"]["percentile"]
row = {"setting": setting, "iops": read["iops"], "p50_us": pct["50.000000"] / 1e3,
       "p99_us": pct["99.000000"] / 1e3}
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
python3 - "$results" <<'PY'
import json, statistics, sys
rows = json.load(open(sys.argv[1]))
print()
for setting in ("off", "on"):
    r = [x for x in rows if x["setting"] == setting]
    med = lambda k: statistics.median(x[k] for x in r)
    print(f"median, busy-poll {setting:<3}: {med('iops'):8.0f} IOPS  p50 {med('p50_us'):6.1f} us"
          f"  p99 {med('p99_us'):6.1f} us")
PY
