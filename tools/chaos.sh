#!/usr/bin/env bash
# Chaos test: three memory servers on test hosts (mount-tests/hosts-lib.sh), a mount keeping
# two copies of every chunk, writers writing files of random bytes and fsyncing them, and one
# fault at a time on a random host for SECONDS (default 300): kill -9 and restart, freeze
# (SIGSTOP, then SIGCONT), a short link cut (within the lease) or a long one (past it). Before
# each fault the mount must be back to full redundancy (two copies of everything, every server
# up), so no two faults overlap. A writer's error (EIO or any other) fails the run; at the end
# every acknowledged file is read back and compared. Prints one line per fault and a summary.
# Usage: tools/chaos.sh [SECONDS]. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=mount-tests/lib.sh
. mount-tests/lib.sh
# shellcheck source=mount-tests/hosts-lib.sh
. mount-tests/hosts-lib.sh

SECONDS_TO_RUN=${1:-300}
DETECT=2    # the mount's op timeout (failure detection) and the servers'
LEASE=6     # a cut of 3 s is resumed, one of LEASE + 6 s is not
WRITERS=2
KEEP_FILES=60  # each writer keeps its last files; older ones are verified, then removed

ensure_packages ip:iproute2 cmp:diffutils fusermount3:fuse3 nsenter:util-linux
check_prereqs mount serve || exit 2
lib_init chaos
REASON=$BASE/reason
MNT=$BASE/mnt
WORK=$BASE/work
DLOG=$WORK/daemon.log
mkdir -p "$MNT" "$WORK/ref"
hosts_init 3
for i in 0 1 2; do
  host_start "$i" 256M --op-timeout "$DETECT" --lease "$LEASE" 2>>"$BASE/logs/hosts.err"
done
mount_fs "$MNT" "$(hosts_addrs)" --op-timeout "$DETECT" --replicas 2 --rebuild-delay 1 \
  --secret-file "$HOSTS_SECRET" --log-file "$DLOG"
mkdir -p "$MNT/w"

# writer W: writes files of 64 KiB to 2 MiB, each fsynced (dd conv=fsync) before it counts as
# acknowledged (listed in acked-W); verifies and removes its files older than KEEP_FILES.
writer() {
  local w=$1 n=0 ref f old
  set +e
  while [ ! -e "$WORK/stop" ]; do
    n=$((n + 1))
    ref=$WORK/ref/$w-$n
    f=$MNT/w/$w-$n
    head -c $(((1 + RANDOM % 32) * 65536)) /dev/urandom >"$ref"
    if ! out=$(dd if="$ref" of="$f" bs=1M conv=fsync status=none 2>&1); then
      echo "writer $w: writing $f failed: $out" >>"$WORK/errors"
      return
    fi
    echo "$w-$n" >>"$WORK/acked-$w"
    old=$((n - KEEP_FILES))
    if [ "$old" -gt 0 ]; then
      if ! cmp -s "$WORK/ref/$w-$old" "$MNT/w/$w-$old"; then
        echo "writer $w: $w-$old reads back wrong" >>"$WORK/errors"
        return
      fi
      rm -f "$MNT/w/$w-$old" "$WORK/ref/$w-$old"
      echo "$w-$old" >>"$WORK/removed-$w"
    fi
  done
}

for ((w = 0; w < WRITERS; w++)); do
  writer "$w" &
  WRITER_PIDS+=($!)
done

declare -A faults=()
start=$(date +%s)
while [ $(($(date +%s) - start)) -lt "$SECONDS_TO_RUN" ] && [ ! -s "$WORK/errors" ]; do
  wait_redundant "$MNT" 120
  h=$((RANDOM % 3))
  kind=$(printf '%s\n' kill freeze cut_short cut_long | shuf -n 1)
  printf 'chaos: t=%4ds %-9s host %d\n' $(($(date +%s) - start)) "$kind" "$h"
  case $kind in
    kill)
      host_kill "$h"
      sleep "$((RANDOM % 4))"
      host_restart "$h" 2>>"$BASE/logs/hosts.err" || fail "host $h did not restart"
      ;;
    freeze)
      host_freeze "$h"
      sleep "$((DETECT + 1 + RANDOM % 3))"
      host_thaw "$h"
      ;;
    cut_short)
      host_cut "$h"
      sleep 3
      host_heal "$h"
      ;;
    cut_long)
      host_cut "$h"
      sleep "$((LEASE + 6))"
      host_heal "$h"
      ;;
  esac
  faults[$kind]=$((${faults[$kind]:-0} + 1))
  sleep 2
done
touch "$WORK/stop"
wait "${WRITER_PIDS[@]}" || true
if [ -s "$WORK/errors" ]; then
  cat "$WORK/errors" >&2
  fail "a writer saw an error"
fi
wait_redundant "$MNT" 120

# Every acknowledged file not yet removed reads back exactly (from the servers, not the cache).
drop_caches "$MNT" || fail "drop caches failed"
acked=0 checked=0 bad=0
for ((w = 0; w < WRITERS; w++)); do
  acked=$((acked + $(wc -l <"$WORK/acked-$w")))
  while read -r name; do
    grep -qx "$name" "$WORK/removed-$w" 2>/dev/null && continue
    checked=$((checked + 1))
    cmp -s "$WORK/ref/$name" "$MNT/w/$name" || {
      echo "corrupt or lost: $name" >&2
      bad=$((bad + 1))
    }
  done <"$WORK/acked-$w"
done
st=$(t "$BIN" stats "$MNT")
summary="faults:"
for k in kill freeze cut_short cut_long; do summary+=" $k ${faults[$k]:-0}"; done
echo "chaos: $SECONDS_TO_RUN s; $summary; files acknowledged $acked (verified as written" \
  "and removed $((acked - checked)), verified at the end $checked); lost or corrupt $bad"
grep -E '^(chunks|rebuild)' <<<"$st" | sed 's/^/chaos: /'
unmount_fs "$MNT"
[ "$bad" -eq 0 ] || exit 1
