#!/usr/bin/env bash
# Followers of a volume (`mount --read-only`, #31): what they cost the holder, and how soon
# they see what it commits. Over two memory servers on loopback, one holder mounts volume
# `bf`; in each round the holder runs the same work with, in turn:
#   none   no follower;
#   idle   FOLLOWERS followers mounted, polling the journal (what following itself costs);
#   busy   the same followers, each reading the holder's tree in a loop (on a 2-core machine
#          they also take CPU from the holder: that is the machine, not a lock).
# The work: FSYNCS times a 4 KiB file created, written and fsynced (the fsync's p50 and p99),
# and CREATES empty files made and removed (operations per second). Rounds alternate the
# three (ROUNDS of them); each figure is the median of its rounds. Then the time until a
# follower sees each of 100 files the holder fsyncs (median, max).
#
#   lab/scripts/bench-follow.sh
#   ROUNDS=5 FOLLOWERS=3 FSYNCS=500 CREATES=5000 lab/scripts/bench-follow.sh
#
# Prints one line per mode and figure (median, and each round's), and the ratios to `none`.
# Needs root and /dev/fuse.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh

ROUNDS=${ROUNDS:-5}
FOLLOWERS=${FOLLOWERS:-3}
FSYNCS=${FSYNCS:-500}
CREATES=${CREATES:-5000}
ensure_packages python3:python3
check_prereqs mount serve || exit 2
lib_init benchfollow
trap 'kill_readers; cleanup' EXIT

start_servers 2 1G
addrs=$SERVER_ADDRS
holder=$BASE/holder
mount_fs "$holder" "$addrs" --volume bf --create
mkdir -p "$holder/tree"
for i in $(seq 1 200); do head -c 65536 /dev/urandom >"$holder/tree/f$i"; done
sync -f "$holder"

work=$BASE/work.py
cat >"$work" <<'PY'
import os, statistics, sys, time
top, fsyncs, creates = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
d = os.path.join(top, "w")
os.makedirs(d, exist_ok=True)
lat = []
for i in range(fsyncs):
    fd = os.open(os.path.join(d, f"s{i}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, b"x" * 4096)
    t0 = time.perf_counter()
    os.fsync(fd)
    lat.append(time.perf_counter() - t0)
    os.close(fd)
for i in range(fsyncs):
    os.unlink(os.path.join(d, f"s{i}"))
t0 = time.perf_counter()
for i in range(creates):
    os.close(os.open(os.path.join(d, f"c{i}"), os.O_WRONLY | os.O_CREAT, 0o644))
for i in range(creates):
    os.unlink(os.path.join(d, f"c{i}"))
ops = 2 * creates / (time.perf_counter() - t0)
lat.sort()
print(f"{lat[len(lat) // 2] * 1e6:.0f} {lat[int(len(lat) * 0.99)] * 1e6:.0f} {ops:.0f}")
PY

READER_PIDS=()
kill_readers() {
  local p
  for p in "${READER_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${READER_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  READER_PIDS=()
}
follower() { echo "$BASE/follower$1"; }

mount_followers() {
  local i
  for ((i = 1; i <= FOLLOWERS; i++)); do
    mount_fs "$(follower "$i")" "$addrs" --volume bf --read-only
  done
}
unmount_followers() {
  local i
  for ((i = 1; i <= FOLLOWERS; i++)); do unmount_fs "$(follower "$i")"; done
}
start_readers() {
  local i
  for ((i = 1; i <= FOLLOWERS; i++)); do
    # One process (a kill ends it and its reads): every file of the tree, over and over.
    python3 -c 'import glob, sys
while True:
    for p in glob.glob(sys.argv[1] + "/tree/*"):
        with open(p, "rb") as f:
            f.read()' "$(follower "$i")" &
    READER_PIDS+=($!)
  done
}

results=$BASE/results
: >"$results"
for ((r = 1; r <= ROUNDS; r++)); do
  for mode in none idle busy; do
    case $mode in
    idle) mount_followers ;;
    busy)
      mount_followers
      start_readers
      ;;
    esac
    read -r p50 p99 ops < <(timeout -k 10 600 python3 "$work" "$holder" "$FSYNCS" "$CREATES")
    echo "$mode $p50 $p99 $ops" >>"$results"
    kill_readers
    [ "$mode" = none ] || unmount_followers
  done
done

python3 - "$results" "$FOLLOWERS" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
n = sys.argv[2]
names = {"none": "no follower", "idle": f"{n} idle followers", "busy": f"{n} reading followers"}
figs = [("fsync p50 us", 1), ("fsync p99 us", 2), ("creates+removes/s", 3)]
med = {}
for mode in ("none", "idle", "busy"):
    for label, i in figs:
        vals = [float(r[i]) for r in rows if r[0] == mode]
        med[(mode, i)] = statistics.median(vals)
        print(f"{names[mode]:>22}  {label:<18} {med[(mode, i)]:>9.0f}   rounds: "
              + " ".join(f"{v:.0f}" for v in vals))
for mode in ("idle", "busy"):
    print(f"{names[mode]:>22} / no follower: " + ", ".join(
        f"{label} {med[(mode, i)] / med[('none', i)]:.2f}x" for label, i in figs))
PY

mount_followers
echo "visibility on a follower of files the holder fsyncs:"
timeout -k 10 300 python3 mount-tests/follow_check.py visible "$holder" "$(follower 1)" 100 5
unmount_followers
