#!/usr/bin/env bash
# Issue 45's kill loop, longer than the mount tests' bounded run (`mount-tests/hosts.sh
# volume_shared_kill_loop`): three clients of one shared volume, each on a test host (a
# network namespace), write fsynced files under manifests while a random client is killed
# with SIGKILL every 3 s and mounted again and two memory server hosts are started empty;
# then every fsynced file is checked on every mount, every chunk's copies, and that `rm -rf`
# and `volume rm --meta` leave no extent and no Redis key. ROUNDS times.
# LOAD=1: two CPU hogs run throughout, as the 2-core CI machine is loaded by the test itself.
#
#   tools/shared-kill-loop.sh             # SECS=120 ROUNDS=1
#   LOAD=1 ROUNDS=12 SECS=20 tools/shared-kill-loop.sh
set -uo pipefail
cd "$(dirname "$0")/.."
SECS=${SECS:-120}
ROUNDS=${ROUNDS:-1}
if [ "${LOAD:-0}" = 1 ]; then
  yes >/dev/null &
  hog1=$!
  yes >/dev/null &
  hog2=$!
  trap 'kill $hog1 $hog2 2>/dev/null' EXIT
fi
failed=0
for ((r = 1; r <= ROUNDS; r++)); do
  if out=$(RMEMFS_TEST_KEEP=1 RMEMFS_KILL_LOOP_SECS=$SECS mount-tests/hosts.sh volume_shared_kill_loop 2>&1); then
    kept=$(sed -n 's/^# kept //p' <<<"$out" | tail -1)
    echo "round $r: passed"
    grep -hE "clients killed|writers:|verify:" "$kept"/logs/hosts-volume_shared_kill_loop.log 2>/dev/null | sed 's/^/  /'
    [ -n "$kept" ] && rm -rf "$kept"
  else
    failed=$((failed + 1))
    echo "round $r: FAILED"
    grep -E "FAIL|kept" <<<"$out" | head -5
  fi
done
echo "$failed of $ROUNDS rounds failed"
[ "$failed" -eq 0 ]
