#!/usr/bin/env bash
# A large directory loaded by a client that joined after it was filled (#44): one client
# makes NAMES empty files in one directory, a second mounts the volume and lists it
# (`ls -f`, which loads it: in one Redis script before this build, a page at a time past
# 10,000 names with it); timed, with the longest Redis command meanwhile (`SLOWLOG`: what
# every other client of the volume waits behind at worst) and the commands over 10 ms. With
# OLD_BIN, the same with that build first, on a volume of its own: side by side. Prints a
# row per build.
#
#   lab/scripts/bench-shared-bigdir.sh
#   OLD_BIN=/tmp/old/rmemfs NAMES=100000 lab/scripts/bench-shared-bigdir.sh
#
# Needs root and /dev/fuse; installs redis-server if missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lab/scripts/lib.sh
. lab/scripts/lib.sh

NAMES=${NAMES:-50000}
ensure_packages python3:python3 redis-server:redis-server
check_prereqs mount serve || exit 2
lib_init benchsharedbigdir
start_redis --own-trap
trap 'kill "$REDIS_PID" 2>/dev/null || true; cleanup' EXIT
start_servers 2 2G
addrs=$SERVER_ADDRS
secs() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.3f}')" "$@"; }

echo "# build, names: ls of the directory on a client that joined (s), longest Redis command (ms), commands over 10 ms" >&2
printf '%-12s %8s %10s %12s %10s\n' build names "ls (s)" "longest (ms)" "over 10 ms"
run() { # LABEL BINARY VOLUME
  local label=$1 bin=$2 vol=$3 t0 t1 seen longest over
  BIN=$bin mount_fs "$BASE/a-$vol" "$addrs" --volume "$vol" --create --meta "$REDIS_URL"
  mkdir "$BASE/a-$vol/big"
  fill_empty "$BASE/a-$vol/big" 0 "$NAMES" "$((NAMES + 1))"
  BIN=$bin mount_fs "$BASE/b-$vol" "$addrs" --volume "$vol" --meta "$REDIS_URL"
  redis-cli -u "$REDIS_URL" config set slowlog-log-slower-than 1000 >/dev/null
  redis-cli -u "$REDIS_URL" config set slowlog-max-len 100000 >/dev/null
  redis-cli -u "$REDIS_URL" slowlog reset >/dev/null
  t0=$(date +%s.%N)
  seen=$(ls -f "$BASE/b-$vol/big/d0" | wc -l)
  t1=$(date +%s.%N)
  [ "$seen" = "$((NAMES + 2))" ] || { echo "$label: listed $seen names, not $((NAMES + 2))" >&2; exit 1; }
  read -r longest over < <(redis-cli -u "$REDIS_URL" slowlog get 100000 | python3 -c '
import sys
lines = [l.strip() for l in sys.stdin]
# Each entry: id, time, duration (us), the command and its arguments, client, name.
durs = [int(lines[i + 2]) for i in range(len(lines) - 3)
        if lines[i].isdigit() and lines[i + 1].isdigit() and len(lines[i + 1]) == 10 and lines[i + 2].isdigit()]
print(f"{max(durs, default=0) / 1000:.1f} {sum(d > 10000 for d in durs)}")')
  printf '%-12s %8s %10s %12s %10s\n' "$label" "$NAMES" "$(secs "$t0" "$t1")" "$longest" "$over"
  BIN=$bin unmount_fs "$BASE/b-$vol"
  BIN=$bin unmount_fs "$BASE/a-$vol"
}
[ -n "${OLD_BIN:-}" ] && run old "$OLD_BIN" bdold
run "this build" "${BIN:-target/release/rmemfs}" bdnew
