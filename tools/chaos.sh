#!/usr/bin/env bash
# Chaos test: memory servers on test hosts (mount-tests/hosts-lib.sh), writers creating,
# overwriting, truncating and punching files of random bytes (an operation counts as
# acknowledged once its fsync returned 0; tools/chaos-work.py keeps the expected content), and
# faults on random hosts, some of them overlapping: kill -9 and restart (empty), freeze, a short
# link cut (within the lease) or a long one, a second kill while the pool is degraded by the
# first, and a second kill while a rebuild runs. After every fault each fault's intended
# transition is checked (the server seen down, the rebuild seen running, the server back up),
# and every acknowledged file is read back from the servers and compared.
#
# Two phases share the time:
#   r3m2  four servers, --replicas 3 --min-replicas 2: nothing acknowledged may be lost, and no
#         operation may fail, even with two servers killed.
#   r2m2  three servers, --replicas 2 --min-replicas 2: after two kills, exactly the files with
#         a chunk whose every copy was on the killed servers (by a placement dump taken just
#         before the second kill, the writers paused) and not copied since read EIO, before
#         and after the killed servers come back empty (never zeros, never old bytes); no
#         operation is acknowledged while fewer than two servers are up.
#   b2m2  as r2m2 with servers backed by files (`serve --backing`, in the run's directory on
#         the local disk, so their write-back to a disk runs too): a killed server
#         comes back with its extents, so after the two kills and the restarts every
#         acknowledged file reads back exactly (EIO only while both are down); nothing is
#         lost. Run it alone or beside the others: CHAOS_PHASES="b2m2". It adds a fault of its
#         own, power_loss: the host's file is rolled back to a write-back taken while the
#         writers went on (a copy of it), the server killed and started as after a host
#         restart (another boot id): the mount must take its copies for stale and read every
#         acknowledged file back exactly, never the bytes the file held at the write-back.
#
#   e42   eight servers, --redundancy ec:4+2 --min-replicas 2: data written keeps three copies,
#         cold chunks become stripes of four data and two parity fragments (the writers'
#         overwrites, truncates and punches make them copies again); as r3m2, nothing
#         acknowledged may be lost and no operation may fail, two servers killed at once
#         included, and every stripe is whole again once the servers are back (the rebuild
#         decodes the degraded ones, the encoder makes stripes of them again). Run it with
#         CHAOS_PHASES="e42" (not in the default phases).
#   v2m1  a volume (`--volume`) on two servers, --replicas 2: beside freezes, link cuts and
#         kills of servers, faults of the volume's own. daemon_kill: the mount daemon gets
#         SIGKILL while the writers write and is mounted again (attach replays the journal);
#         every acknowledged file reads back exactly, and every file on the volume (those
#         the kill cut mid-write included) reads the same with either server frozen: copies
#         a crash cut mid-overwrite were made to agree at attach. fill: the pool is filled
#         to ENOSPC (the error must say so) while the writers go on, a server is frozen and
#         thawed while it is full, and the filler is removed: the volume must take writes
#         again (a full pool does not brick it). The phase's daemon runs on a client test host
#         of its own (a third network namespace), so that its link alone can stall:
#         stall_takeover: the holder's link goes down while an overwrite streams to the
#         servers, a daemon on a fourth host takes the volume over (--takeover), the writers
#         move to its mount and it writes the file the stalled overwrite aimed at; then the old
#         holder's link heals. Its stalled payload must not land (the fence closed its
#         connections and waited for the request in progress), its writes must fail, and every
#         acknowledged file, and the new holder's file, read back from either copy.
#
# Usage: tools/chaos.sh [SECONDS]  (default 300; the phases share it). Needs root.
#   CHAOS_SEED=N      replays a run's choices (printed at the start)
#   CHAOS_PHASES="r2m2"  runs only the phases named
#   CHAOS_KINDS="kill power_loss"  draws faults from these kinds only (power_loss: backed phases;
#                  daemon_kill, fill, stall_takeover: volume phases)
#   RMEMFS_MOUNT_ARGS="-o io_uring"  runs the mounts through FUSE over io_uring
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=mount-tests/lib.sh
. mount-tests/lib.sh
# shellcheck source=mount-tests/hosts-lib.sh
. mount-tests/hosts-lib.sh

SECONDS_TO_RUN=${1:-300}
PHASES=${CHAOS_PHASES:-r3m2 r2m2 v2m1}
SEED=${CHAOS_SEED:-$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')}
RANDOM=$SEED
DETECT=2        # the mount's op timeout (failure detection) and the servers'
LEASE=6         # a cut of 3 s is resumed, one of LEASE + 6 s is not
TRANSITION=$((DETECT + 5))  # a fault is seen (server down) within detection + this margin
REBUILD_RATE=8M  # slow enough that a rebuild of the writers' data (tens of MB) runs for seconds
WRITERS=2
KEEP_FILES=24   # files each writer keeps (64 KiB to 2 MiB each)
WORKER=tools/chaos-work.py
OVERLAPPING=(kill_degraded kill_rebuilding)
VOLUME_KINDS=(daemon_kill fill stall_takeover)
STALL_MIB=16    # the overwrite a takeover stalls: long enough to be mid-stream at the cut
read -ra KINDS <<<"${CHAOS_KINDS:-kill freeze cut_short cut_long ${OVERLAPPING[*]}}"

ensure_packages ip:iproute2 fusermount3:fuse3 nsenter:util-linux python3:python3
check_prereqs mount serve || exit 2
lib_init chaos
REASON=$BASE/reason
MNT=$BASE/mnt
# The writers write through this link to the phase's current mount (a takeover moves them).
CUR=$BASE/cur

echo "chaos: seed $SEED (CHAOS_SEED=$SEED tools/chaos.sh $SECONDS_TO_RUN replays the choices)"

# addr I: host I's address as placement and stats name it.
addr() { host_addr "$1"; }

# server_state I: host I's server as the mount sees it (up, down, rejoining).
server_state() {
  stats_field "$MNT" "[x['state'] for x in s['servers'] if x['addr'] == '$(addr "$1")'][0]"
}

# wait_state I STATE SECS: host I's server must reach STATE within SECS seconds.
wait_state() {
  local i=$1 want=$2 secs=$3 k st=""
  for ((k = 0; k < secs * 5; k++)); do
    st=$(server_state "$i") || fail "rmemfs stats failed"
    [ "$st" = "$want" ] && return 0
    sleep 0.2
  done
  fail "host $i: $st, not $want within $secs s of the fault"
}

# wait_rebuilding SECS: a rebuild pass must be seen running within SECS seconds.
wait_rebuilding() {
  local k
  for ((k = 0; k < $1 * 5; k++)); do
    [ "$(stats_field "$MNT" "s['rebuild']['running']")" = True ] && return 0
    sleep 0.2
  done
  fail "no rebuild seen running within $1 s of the first kill"
}

# pause / resume: the writers' barrier. Each pause has a generation (WORK/pause); a writer
# finishes its operation, writes its manifest and names the generation in WORK/paused-W.
PAUSES=0
pause() {
  local w k
  PAUSES=$((PAUSES + 1))
  echo "$PAUSES" >"$WORK/pause.tmp"
  mv "$WORK/pause.tmp" "$WORK/pause"
  for ((w = 0; w < WRITERS; w++)); do
    for ((k = 0; k < 1200; k++)); do
      [ "$(cat "$WORK/paused-$w" 2>/dev/null)" = "\"$PAUSES\"" ] && break
      [ -s "$WORK/errors" ] && fail "a writer failed: $(head -c 300 "$WORK/errors")"
      sleep 0.05
    done
    [ "$(cat "$WORK/paused-$w" 2>/dev/null)" = "\"$PAUSES\"" ] || fail "writer $w did not pause within 60 s"
  done
}
resume() { rm -f "$WORK/pause"; }

# verify [ARGS]: every acknowledged file read back from the servers (chaos-work.py verify).
verify() {
  if [ "$ALLOW_LOSS" = 1 ]; then
    # Refused writes leave write-back errors that syncfs reports once (EIO): expected while
    # servers are short, so only the dropping of the caches must work.
    timeout -k 5 60 sync -f "$MNT" || echo "chaos:   (sync -f reported the refused writes' errors)"
    sh -c 'echo 3 >/proc/sys/vm/drop_caches' || fail "cannot drop caches"
  else
    drop_caches "$MNT" || fail "cannot drop caches"
  fi
  local out rc=0
  out=$(t python3 "$WORKER" verify --dir "$MNT/w" --work "$WORK" "$@" 2>&1) || rc=$?
  echo "chaos:   verify: $out" | head -n 25
  [ "$rc" -eq 0 ] || fail "acknowledged data read back wrong: $(tail -n +2 <<<"$out" | head -n 3 | tr '\n' ' ')"
}

# other_than I: sets OTHER to a random host other than I (in this shell: a $(...) subshell
# would draw from a copy of RANDOM and leave the run's sequence where it was).
other_than() {
  OTHER=$(((RANDOM % (HOSTS_SERVERS - 1) + $1 + 1) % HOSTS_SERVERS))
}

# double_kill A MODE: kills A, then (MODE degraded: once the mount sees A down; rebuilding:
# once a rebuild runs) pauses the writers, dumps placement and kills a second host B. Checks
# what is left, brings both back empty, checks again, removes what was lost.
double_kill() {
  local a=$1 mode=$2 b dump=$WORK/dump-$FAULTS.json killed t_low="" name holders
  # The first kill must take copies with it (a server re-admitted empty may hold none yet,
  # and its loss would degrade nothing): another host holding some, if A holds none.
  holders=$(stats_field "$MNT" "' '.join(str(i) for i, x in enumerate(s['servers'])
      if x['total_bytes'] - x['free_bytes'] - x['stocked_bytes'] >= $((8 << 20)))")
  if ! grep -qw "$a" <<<"$holders"; then
    read -ra holders <<<"$holders"
    [ ${#holders[@]} -gt 0 ] || fail "no server holds copies"
    a=${holders[RANDOM % ${#holders[@]}]}
    printf 'chaos:   (host %d holds copies; the first kill takes it)\n' "$a"
  fi
  other_than "$a"
  b=$OTHER
  host_kill "$a"
  wait_state "$a" down "$TRANSITION"
  if [ "$mode" = rebuilding ]; then
    wait_rebuilding 30
  else
    [ "$(stats_field "$MNT" "s['chunks']['degraded']")" -gt 0 ] ||
      fail "no chunk degraded with host $a down"
  fi
  pause
  t python3 "$WORKER" dump --dir "$MNT/w" --work "$WORK" --out "$dump" >/dev/null
  host_kill "$b"
  killed="$(addr "$a"),$(addr "$b")"
  [ $((HOSTS_SERVERS - 2)) -lt "$MIN_COPIES" ] && t_low=$(date +%s.%N)
  resume
  printf 'chaos:   then host %d killed (%s)\n' "$b" "$mode"
  wait_state "$b" down "$TRANSITION"
  if [ -n "$t_low" ]; then
    # Fewer servers than the minimum: a write must be refused, not acknowledged.
    must_fail_within $((DETECT * 3 + 5)) "a write with $((HOSTS_SERVERS - 2)) servers up" "" \
      dd if=/dev/urandom of="$MNT/probe" bs=64k count=4 conv=fsync status=none
  fi
  pause
  verify --killed "$killed" --dump "$dump" --expect-lost --lost-out "$WORK/lost-now"
  host_restart "$a" 2>>"$BASE/logs/hosts.err" || fail "host $a did not restart"
  host_restart "$b" 2>>"$BASE/logs/hosts.err" || fail "host $b did not restart"
  [ -n "$t_low" ] && echo "$t_low $(date +%s.%N)" >>"$WORK/low-windows"
  wait_state "$a" up 30
  wait_state "$b" up 30
  if [ "$BACKED" = 1 ]; then
    # Back with their extents: what was unreadable while both were down reads back exactly.
    verify
    rm -f "$WORK/lost-now" "$MNT/probe"
    resume
    return
  fi
  # Back, but empty: what was lost stays lost (EIO), never the new servers' zeros.
  verify --killed "$killed" --dump "$dump"
  if [ -s "$WORK/lost-now" ]; then
    [ "$ALLOW_LOSS" = 1 ] || fail "files lost with --replicas $COPIES: $(head -n 5 "$WORK/lost-now" | tr '\n' ' ')"
    LOST=$((LOST + $(wc -l <"$WORK/lost-now")))
    while read -r name; do rm -f "$MNT/w/$name"; done <"$WORK/lost-now"
    cat "$WORK/lost-now" >>"$WORK/lost"
    rm -f "$WORK/lost-now"
  fi
  rm -f "$MNT/probe"
  resume
}

# remount: the mount daemon of the phase's volume is killed (SIGKILL, mid-write) and the
# volume mounted again at the same place (the dead mount detached), as systemd's restart
# does.
remount() {
  local pid
  for pid in $(daemon_pids "$MNT"); do kill -KILL "$pid"; done
  wait_daemon_gone "$MNT" 10 || fail "the killed daemon is still there"
  mount_holder || fail "the volume did not mount again"
}

# mount_holder [ARGS...]: the phase's mount at MNT, its daemon on test host CLIENT (volume
# phases) or in the root namespace, logging to daemon_log.
mount_holder() {
  local ns=""
  [ -n "$CLIENT" ] && ns=$(host_ns "$CLIENT")
  MOUNT_NETNS=$ns mount_fs "$MNT" "$(hosts_addrs)" "${MOUNT_OPTS[@]}" --log-file "$(daemon_log)" "$@"
}

# daemon_log: the log of the phase's current daemon (one per client host: two daemons of a
# takeover live at once).
daemon_log() { echo "$WORK/daemon${CLIENT:+-h$CLIENT}.log"; }

# digests OUT: every file under the writers' directory (not only the acknowledged ones) read
# from the servers, its SHA-256 or its error, into OUT.
digests() {
  drop_caches "$MNT" || fail "cannot drop caches"
  t python3 - "$MNT/w" >"$1" <<'PY' || fail "cannot read the writers' directory"
import hashlib, os, sys
for name in sorted(os.listdir(sys.argv[1])):
    try:
        with open(os.path.join(sys.argv[1], name), "rb") as f:
            print(name, hashlib.sha256(f.read()).hexdigest())
    except OSError as e:
        print(name, "error", e.errno)
PY
}

# same_with_each_frozen: with the writers paused, every file reads the same with each server
# frozen in turn (each copy preferred) as with both up.
same_with_each_frozen() {
  local h
  digests "$WORK/digests-$FAULTS"
  for ((h = 0; h < HOSTS_SERVERS; h++)); do
    host_freeze "$h"
    wait_state "$h" down "$TRANSITION"
    digests "$WORK/digests-$FAULTS-$h"
    host_thaw "$h"
    wait_state "$h" up 30
    # A freeze past the rebuild delay (1 s) has the mount let go of the host's copies (no
    # other server to rebuild onto) and make them again once it is back: the next host is
    # frozen only once every chunk has both copies again (else it reads EIO, rightly).
    wait_redundant "$MNT" 120
    cmp -s "$WORK/digests-$FAULTS" "$WORK/digests-$FAULTS-$h" ||
      fail "with host $h frozen a file reads otherwise: $(diff "$WORK/digests-$FAULTS" \
        "$WORK/digests-$FAULTS-$h" | head -n 4 | tr '\n' ' ')"
  done
  echo "chaos:   $(wc -l <"$WORK/digests-$FAULTS") files read the same from either copy"
}

# fill HOST: the pool filled to ENOSPC while the writers go on, HOST frozen and thawed while
# it is full, the filler removed; then a write must succeed again.
fill() {
  local h=$1 err=$WORK/fill-$FAULTS.err
  # Random bytes (zeros would be holes), written through (O_DIRECT): a buffered writer
  # whose handle was opened while the pool had room meets ENOSPC only at fsync or close,
  # and is throttled to a crawl meanwhile (doc/FAILURES.md).
  if t dd if=/dev/urandom of="$MNT/fill" bs=1M oflag=direct status=none 2>"$err"; then
    fail "the pool never filled (dd ended without an error)"
  fi
  grep -q "No space left on device" "$err" ||
    fail "filling the pool failed otherwise than ENOSPC: $(head -c 200 "$err")"
  printf 'chaos:   full at %s MiB; host %d frozen while full\n' \
    $(($(stat -c %s "$MNT/fill") >> 20)) "$h"
  host_freeze "$h"
  wait_state "$h" down "$TRANSITION"
  host_thaw "$h"
  wait_state "$h" up 30
  rm -f "$MNT/fill" || fail "the filler could not be removed from a full volume"
  must_within 60 "a write after the pool was emptied" \
    dd if=/dev/urandom of="$MNT/probe" bs=1M count=4 conv=fsync status=none
  rm -f "$MNT/probe"
}

# queued_in NS: the bytes sent and not yet acknowledged by the peer on the TCP connections of
# network namespace NS (a client host: its only connections are its daemon's, to the servers'
# control and data ports).
queued_in() {
  nsenter --net="/run/netns/$1" ss -tnH |
    awk '$3 > 0 { n++; b += $3 } END { printf "%d bytes on %d connections", b, n }'
}

# stall_takeover: the holder's link stalls mid-write and another client host takes the volume
# over; the old holder's stalled payload must never land (see the header).
stall_takeover() {
  local old=$CLIENT old_mnt=$MNT new stream pid k want got ns queued fenced log
  new=$((CLIENT == HOSTS_SERVERS ? HOSTS_SERVERS + 1 : HOSTS_SERVERS))
  ns=$(host_ns "$old")
  # The target is committed first, so its chunks are named by the journal: a payload that
  # landed late would land in the file the new holder sees.
  head -c $((STALL_MIB << 20)) /dev/urandom >"$WORK/stall-old"
  head -c $((STALL_MIB << 20)) /dev/urandom >"$WORK/stall-new"
  t dd if="$WORK/stall-old" of="$MNT/w/stall" bs=1M oflag=direct conv=fsync status=none ||
    fail "cannot write the stall target"
  # Overwrites in place, back to back, until the holder's writes fail: one is always
  # streaming when the link goes down (a marker says the first pass went through).
  stream=$WORK/stall-stream-$FAULTS
  (
    while dd if="$WORK/stall-old" of="$old_mnt/w/stall" bs=1M oflag=direct conv=notrunc \
      status=none 2>>"$stream.err"; do
      touch "$stream.ok"
    done
  ) &
  pid=$!
  for ((k = 0; k < 600; k++)); do
    [ -e "$stream.ok" ] && break
    kill -0 "$pid" 2>/dev/null || fail "the stalled overwrite failed before the stall: $(head -c 200 "$stream.err")"
    sleep 0.05
  done
  [ -e "$stream.ok" ] || fail "the overwrite to stall made no pass in 30 s"
  # The host's log holds earlier takeovers' fences too: this one's is the next line.
  log=$WORK/daemon-h$old.log
  fenced=$(grep -c "this daemon is fenced" "$log" || true)
  host_cut "$old"
  # What the old holder had sent and the servers had not acknowledged when its link went
  # down (a request whose payload was part way shows here).
  queued=$(queued_in "$ns")
  # Another client host takes over while the old holder's requests hang mid-way.
  CLIENT=$new MNT=$BASE/mnt-$new
  mount_holder --takeover || fail "the takeover from host $new failed while host $old was stalled"
  ln -sfn "$MNT" "$CUR.new" && mv -T "$CUR.new" "$CUR"
  t dd if="$WORK/stall-new" of="$MNT/w/stall" bs=1M oflag=direct conv=notrunc,fsync status=none ||
    fail "the new holder cannot write the stall target"
  want=$(sha256sum <"$WORK/stall-new" | cut -d' ' -f1)
  host_heal "$old"
  # The old holder learns it was fenced once its link is back; until every one of its
  # connections to the servers has no unsent or unacknowledged data left, its stalled
  # payload could still go out.
  for ((k = 0; k < 600; k++)); do
    if [ "$(grep -c "this daemon is fenced" "$log" || true)" -gt "$fenced" ] &&
      [ "$(queued_in "$ns")" = "0 bytes on 0 connections" ]; then
      break
    fi
    sleep 0.2
  done
  [ "$(grep -c "this daemon is fenced" "$log" || true)" -gt "$fenced" ] ||
    fail "the old holder (host $old) never learned it was fenced"
  [ "$(queued_in "$ns")" = "0 bytes on 0 connections" ] ||
    fail "the old holder still has data queued to the servers 120 s after its link healed"
  for ((k = 0; k < 300; k++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && fail "the old holder's overwrite still runs 30 s after its fence"
  must_fail_within 30 "a write through the fenced holder" "Input/output error" \
    dd if=/dev/zero of="$old_mnt/w/fenced" bs=4k count=1 conv=fsync status=none
  for pid in $(daemon_pids "$old_mnt"); do kill -KILL "$pid"; done
  timeout -k 5 10 umount -l "$old_mnt" || fail "the old holder's mount could not be detached"
  pause
  verify
  # The new holder's bytes, from either copy: nothing of the stalled payload landed.
  digests "$WORK/digests-$FAULTS"
  got=$(awk '$1 == "stall" { print $2 }' "$WORK/digests-$FAULTS")
  [ "$got" = "$want" ] || fail "the stall target reads otherwise than the new holder wrote (${got:-missing})"
  same_with_each_frozen
  printf 'chaos:   host %d took over from host %d, whose link stalled with %s queued; none landed\n' \
    "$new" "$old" "$queued"
  rm -f "$MNT/w/stall" "$WORK/stall-old" "$WORK/stall-new"
  resume
}

# one_fault KIND HOST: a fault, its transitions checked, then every file verified.
one_fault() {
  local kind=$1 h=$2
  case $kind in
    kill)
      host_kill "$h"
      wait_state "$h" down "$TRANSITION"
      host_restart "$h" 2>>"$BASE/logs/hosts.err" || fail "host $h did not restart"
      wait_state "$h" up 30
      ;;
    freeze)
      host_freeze "$h"
      wait_state "$h" down "$TRANSITION"
      host_thaw "$h"
      wait_state "$h" up 30
      ;;
    cut_short)
      host_cut "$h"
      sleep 3
      host_heal "$h"
      wait_state "$h" up 30
      ;;
    cut_long)
      host_cut "$h"
      wait_state "$h" down "$TRANSITION"
      sleep "$((LEASE + 6))"
      host_heal "$h"
      wait_state "$h" up 30
      ;;
    daemon_kill)
      remount
      pause
      verify
      same_with_each_frozen
      resume
      return
      ;;
    fill) fill "$h" ;;
    stall_takeover)
      stall_takeover
      return
      ;;
    kill_degraded) double_kill "$h" degraded ;;
    kill_rebuilding) double_kill "$h" rebuilding ;;
    power_loss)
      # The medium holds what was written back: a copy of the file now, while the writers go
      # on writing (and fsyncing) for two seconds more, stores the power loss then takes.
      local file=$BASE/backing-$name-$h seen
      seen=$(grep -c "may hold less than was written" "$(daemon_log)" || true)
      cp --sparse=always "$file" "$file.written-back"
      sleep 2
      host_kill "$h"
      mv -f "$file.written-back" "$file"
      wait_state "$h" down "$TRANSITION"
      # Another boot of the host.
      HOST_ARGS[h]="${HOST_ARGS[h]% --boot-id *} --boot-id chaos-$SEED-$FAULTS"
      host_restart "$h" 2>>"$BASE/logs/hosts.err" || fail "host $h did not restart"
      wait_state "$h" up 30
      [ "$(grep -c "may hold less than was written" "$(daemon_log)" || true)" -gt "$seen" ] ||
        fail "the mount did not see host $h back from a power loss"
      ;;
  esac
  if [ "$kind" != kill_degraded ] && [ "$kind" != kill_rebuilding ]; then
    pause
    verify
    resume
  fi
}

# stop_writers: ends the writers of a phase that failed (they would go on writing).
WRITER_PIDS=()
stop_writers() {
  [ ${#WRITER_PIDS[@]} -gt 0 ] && kill "${WRITER_PIDS[@]}" 2>/dev/null
  WRITER_PIDS=()
  return 0
}

# phase NAME SECONDS
phase() {
  local name=$1 secs=$2 servers copies min w start kind h i code=""
  local backing=() kinds=() volume=0 first=("${OVERLAPPING[@]}")
  BACKED=0
  case $name in
    r3m2) servers=4 copies=3 min=2 ALLOW_LOSS=0 ;;
    r2m2) servers=3 copies=2 min=2 ALLOW_LOSS=1 ;;
    e42) servers=8 copies=3 min=2 ALLOW_LOSS=0 code=ec:4+2 ;;
    b2m2) servers=3 copies=2 min=2 ALLOW_LOSS=1 BACKED=1 ;;
    # Writes the daemon's kill cuts, and those a full pool refuses, fail: they are not
    # acknowledged, so their files leave the manifests (ALLOW_LOSS); acknowledged ones must
    # all read back.
    v2m1) servers=2 copies=2 min=1 ALLOW_LOSS=1 volume=1 first=(daemon_kill stall_takeover) ;;
    *) fail "unknown phase $name" ;;
  esac
  COPIES=$copies MIN_COPIES=$min FAULTS=0 LOST=0
  for kind in "${KINDS[@]}"; do
    [ "$kind" = power_loss ] && [ "$BACKED" != 1 ] && continue
    # Two servers: a second kill would take every copy.
    [ "$volume" = 1 ] && [[ " ${OVERLAPPING[*]} " == *" $kind "* ]] && continue
    kinds+=("$kind")
  done
  [ "$BACKED" = 1 ] && [ -z "${CHAOS_KINDS:-}" ] && kinds+=(power_loss)
  [ "$volume" = 1 ] && [ -z "${CHAOS_KINDS:-}" ] && kinds+=("${VOLUME_KINDS[@]}")
  if [ "$volume" = 0 ]; then
    local k vkinds=()
    for k in "${kinds[@]}"; do [[ " ${VOLUME_KINDS[*]} " == *" $k "* ]] || vkinds+=("$k"); done
    kinds=("${vkinds[@]}")
  fi
  [ ${#kinds[@]} -gt 0 ] || fail "no fault kind for phase $name (CHAOS_KINDS=${CHAOS_KINDS:-})"
  WORK=$BASE/work-$name
  mkdir -p "$WORK"
  # A volume's daemon runs on a client host of its own (two: a takeover moves it), so that
  # its link alone can be cut; the servers are hosts 0 to servers - 1.
  HOSTS_SERVERS=$servers CLIENT="" MNT=$BASE/mnt
  if [ "$volume" = 1 ]; then
    hosts_init $((servers + 2))
    CLIENT=$servers MNT=$BASE/mnt-$servers
  else
    hosts_init "$servers"
  fi
  trap 'stop_writers; hosts_teardown; cleanup' EXIT
  for ((i = 0; i < servers; i++)); do
    backing=()
    [ "$BACKED" = 1 ] && backing=(--backing "$BASE/backing-$name-$i")
    host_start "$i" 256M --op-timeout "$DETECT" --lease "$LEASE" "${backing[@]}" \
      2>>"$BASE/logs/hosts.err"
  done
  MOUNT_OPTS=(--op-timeout "$DETECT" --min-replicas "$min"
    --rebuild-delay 1 --rebuild-rate "$REBUILD_RATE" --secret-file "$HOSTS_SECRET")
  if [ -n "$code" ]; then
    MOUNT_OPTS+=(--redundancy "$code")
  else
    MOUNT_OPTS+=(--replicas "$copies")
  fi
  [ "$volume" = 1 ] && MOUNT_OPTS+=(--volume "chaos-$SEED")
  mount_holder $([ "$volume" = 1 ] && echo --create) || fail "the phase's mount failed"
  mkdir -p "$MNT/w"
  ln -sfn "$MNT" "$CUR"
  echo "chaos: phase $name: $servers servers, ${code:---replicas $copies} --min-replicas $min, $secs s"
  WRITER_PIDS=()
  for ((w = 0; w < WRITERS; w++)); do
    python3 "$WORKER" writer --dir "$CUR/w" --work "$WORK" --id "$w" --seed "$SEED-$name" \
      --keep "$KEEP_FILES" $([ "$ALLOW_LOSS" = 1 ] || echo --strict) 2>>"$WORK/writer.err" &
    WRITER_PIDS+=($!)
  done
  # Faults start once the writers have written their files (a server killed before would
  # hold nothing to lose or rebuild).
  for ((w = 0; w < WRITERS; w++)); do
    for ((i = 0; i < 600; i++)); do
      [ "$(awk '$3 == "new"' "$WORK/acks-$w" 2>/dev/null | wc -l)" -ge "$KEEP_FILES" ] && break
      [ -s "$WORK/errors" ] && fail "a writer failed: $(head -c 300 "$WORK/errors")"
      sleep 0.1
    done
  done
  # The first fault of a phase overlaps (so even a short run has one); then any kind.
  start=$(date +%s)
  while [ $(($(date +%s) - start)) -lt "$secs" ] || [ "$FAULTS" -eq 0 ]; do
    [ -s "$WORK/errors" ] && fail "a writer failed: $(head -c 300 "$WORK/errors")"
    wait_redundant "$MNT" 120
    h=$((RANDOM % servers))
    if [ "$FAULTS" -eq 0 ] && [ -z "${CHAOS_KINDS:-}" ]; then
      kind=${first[RANDOM % ${#first[@]}]}
    else
      kind=${kinds[RANDOM % ${#kinds[@]}]}
    fi
    FAULTS=$((FAULTS + 1))
    printf 'chaos: %s t=%4ds fault %d: %-15s host %d\n' "$name" $(($(date +%s) - start)) \
      "$FAULTS" "$kind" "$h"
    one_fault "$kind" "$h"
  done
  touch "$WORK/stop"
  wait "${WRITER_PIDS[@]}" || true
  WRITER_PIDS=()
  [ -s "$WORK/errors" ] && fail "a writer failed: $(head -c 300 "$WORK/errors")"
  wait_redundant "$MNT" 120
  verify
  if [ "$ALLOW_LOSS" = 1 ]; then
    touch "$WORK/low-windows"
    local out rc=0
    out=$(t python3 "$WORKER" acks --work "$WORK" --windows "$WORK/low-windows" 2>&1) || rc=$?
    echo "chaos:   $(tr '\n' ' ' <<<"$out")"
    [ "$rc" -eq 0 ] || fail "an operation was acknowledged while fewer than $min servers were up"
  fi
  echo "chaos: $name: $FAULTS faults; operations acknowledged: $(python3 "$WORKER" counts --work "$WORK");" \
    "files lost (as predicted) $LOST"
  [ "$volume" = 1 ] && echo "chaos:   attaches that made copies agree: $(cat "$WORK"/daemon*.log | grep -c "copies now agree" || true)"
  stats_field "$MNT" "'chunks %(healthy)d healthy, %(degraded)d degraded, %(lost)d lost' % s['chunks']" |
    sed 's/^/chaos:   /'
  [ -n "$code" ] && stats_field "$MNT" "'stripes now %(stripes)d, made %(stripes_made)d in all, chunks left to encode %(pending)d' % s['encoding']" |
    sed 's/^/chaos:   /'
  unmount_fs "$MNT" || fail "unmount failed"
  hosts_teardown
}

# Each phase gets its share of the time.
n_phases=$(wc -w <<<"$PHASES")
for p in $PHASES; do
  phase "$p" $((SECONDS_TO_RUN / n_phases))
done
echo "chaos: passed (seed $SEED)"
