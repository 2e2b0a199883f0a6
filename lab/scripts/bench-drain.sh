#!/usr/bin/env bash
# How fast `rmemfs admin drain` empties a server of an idle mount, on loopback, beside the
# rebuild of the same bytes after a kill (the copy path both use), in one run:
#   three memory servers, --replicas 2, --rebuild-rate 0; DATA written in 8 files; then
#   1. drain the server holding the most: bytes moved, seconds, MB/s (the daemon's figure,
#      and the admin command end to end, which includes asking the server it holds nothing);
#   2. on a fresh pool with the same data, kill that server and time the rebuild back to
#      two copies (`stats`' rebuild rate).
#
#   lab/scripts/bench-drain.sh
#   DATA=2G lab/scripts/bench-drain.sh
#
# Prints one line per figure. Needs root and /dev/fuse.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh

DATA=${DATA:-1G}
ensure_packages numfmt:coreutils python3:python3
check_prereqs mount serve stats || exit 2
data_bytes=$(numfmt --from=iec "$DATA")
# Two copies of the data on two servers, with room to spare.
SERVER_SIZE=$((data_bytes / 1048576 + 256))M
lib_init benchdrain

three_servers() {
  PIDS=() ADDRS=()
  for _ in 1 2 3; do
    start_server "$SERVER_SIZE"
    PIDS+=("$SERVER_PID")
    ADDRS+=("$SERVER_ADDR")
  done
}

fill() {
  local per=$((data_bytes / 8 / 1048576)) i
  for i in 0 1 2 3 4 5 6 7; do
    dd if=/dev/urandom of="$1/d$i" bs=1M count="$per" status=none
  done
  sync -f "$1"
}

# fullest MNT: the index of the server holding the most bytes, and those bytes.
fullest() {
  "$BIN" stats --json "$1" | python3 -c 'import json, sys
s = json.load(sys.stdin)["servers"]
used = [x["total_bytes"] - x["free_bytes"] for x in s]
i = max(range(len(used)), key=lambda k: used[k])
print(i, used[i])'
}

# pool_with_data NAME DELAY: three servers, a mount MNT of them (two copies, no rate limit,
# rebuild delay DELAY) holding DATA; sets VICTIM and HELD (the fullest server and its bytes).
pool_with_data() {
  three_servers
  MNT=$BASE/mnt-$1
  mount_fs "$MNT" "$(IFS=,; echo "${ADDRS[*]}")" --replicas 2 --rebuild-rate 0 --rebuild-delay "$2"
  fill "$MNT"
  read -r VICTIM HELD < <(fullest "$MNT")
}

echo "== drain: $DATA in two copies on three servers" >&2
pool_with_data drain 3600
held=$HELD
t0=$(date +%s.%N)
out=$("$BIN" admin drain "$MNT" "${ADDRS[$VICTIM]}" 2>/dev/null)
t1=$(date +%s.%N)
echo "   $out" >&2
unmount_fs "$MNT"
kill_servers "${PIDS[@]}"

echo "== rebuild: the same, the fullest server killed" >&2
pool_with_data rebuild 0
rheld=$HELD
kill -KILL "${PIDS[$VICTIM]}"
st=$(wait_rebuilt "$MNT")
rate=$(sed -n 's/.*last rate \([0-9]*\) bytes\/s.*/\1/p' <<<"$st")
unmount_fs "$MNT"
kill_servers "${PIDS[@]}"

python3 - "$out" "$t0" "$t1" "$held" "$rheld" "$rate" <<'PY'
import re, sys
out, t0, t1, held, rheld, rate = sys.argv[1:7]
m = re.search(r"\((\d+) bytes\) moved in ([\d.]+) s \((\d+) MB/s\)", out)
moved, secs, mbs = int(m.group(1)), float(m.group(2)), int(m.group(3))
end = float(t1) - float(t0)
rebuild = int(rate or 0) / 1e6
print(f"drain: {moved / 2**20:.0f} MiB moved off the fullest server (it held {int(held) / 2**20:.0f} MiB) "
      f"in {secs:.2f} s: {mbs} MB/s; the admin command end to end {end:.2f} s "
      f"({moved / end / 1e6:.0f} MB/s)")
print(f"rebuild of the same after a kill: {rebuild:.0f} MB/s (it held {int(rheld) / 2**20:.0f} MiB)")
if rebuild > 0:
    print(f"ratio drain / rebuild: {mbs / rebuild:.2f}")
PY
cleanup
