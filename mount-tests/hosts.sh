#!/usr/bin/env bash
# Failure tests on separate test hosts (mount-tests/hosts-lib.sh): three memory servers, each
# in its own network namespace, a mount with two copies of every chunk in the root namespace.
# One host at a time is killed, frozen, cut off or restarted while programs write and verify;
# every test ends with every byte read back and `stats` showing every server up and no chunk
# short of a copy. Usage: mount-tests/hosts.sh [TEST...]. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=mount-tests/lib.sh
. mount-tests/lib.sh
# shellcheck source=mount-tests/hosts-lib.sh
. mount-tests/hosts-lib.sh

# Failure detection (the mount's op timeout) and the servers' own timeouts, short so the
# tests run in seconds; the lease long enough for the short cut, and short for the long one.
DETECT=2
# Hosts 0 to 2 run memory servers; 3 to 5 are clients for the tests that need them.
HOSTS_SERVERS=3
SERVE=(--op-timeout "$DETECT")
MOUNT=(--op-timeout "$DETECT" --replicas 2)

# kill -9 a host while fio writes and verifies; restart it (empty) before the rebuild delay
# runs out and see the copies it lost rebuilt onto it.
test_kill_restart() {
  local st
  seed_files 12
  start_fio_verify
  host_kill 1
  log "killed host 1 while fio was writing"
  finish_fio_verify "host killed"
  check_files 12 "after the kill"
  host_restart 1 || fail "host 1 did not restart"
  log "restarted host 1 (empty arena)"
  wait_log "$DLOG" "is up again \(empty\)" 30 || fail "the restarted server was not admitted"
  wait_redundant "$MNT" 60
  st=$(t "$BIN" stats "$MNT")
  grep -E "^server server#1 .*: up, .*; 268435456 of 268435456 bytes free" <<<"$st" &&
    fail "nothing was rebuilt onto the restarted server"
  # The third host goes: what the restarted one holds must be real.
  host_kill 2
  check_files 12 "after the restart and another kill"
}

# A kill during a large sequential write: once the write returns, the bytes read back exactly.
test_kill_seq_write() {
  local big=$WORK/big
  dd if=/dev/urandom of="$big" bs=1M count=192 status=none
  cp "$big" "$MNT/big" &
  local cp_pid=$! size=0
  for ((k = 0; k < 600; k++)); do
    size=$(stat -c %s "$MNT/big" 2>/dev/null || echo 0)
    [ "$size" -ge $((32 << 20)) ] && break
    kill -0 "$cp_pid" 2>/dev/null || break
    sleep 0.05
  done
  # The kill must land during the write: past its first 32 MiB, before its end.
  [ "$size" -ge $((32 << 20)) ] && [ "$size" -lt $((192 << 20)) ] && kill -0 "$cp_pid" 2>/dev/null ||
    fail "the write was at $size bytes (or over) when the kill was due: it would miss the write"
  host_kill 0
  log "killed host 0 during a 192 MiB sequential write"
  wait "$cp_pid" || fail "the write failed after one of three servers died"
  must "fsync big" dd if=/dev/null of="$MNT/big" conv=notrunc,fsync status=none
  drop_caches "$MNT" || fail "drop caches failed"
  must "cmp big" cmp "$big" "$MNT/big"
  wait_redundant_except_down "$MNT" 60
}

# wait_redundant_except_down MNT SECS: no chunk short of copies (a host may stay down).
wait_redundant_except_down() {
  wait_redundant "$1" "$2" any
}

# Frozen longer than detection, then thawed: no error, the server resumes its session.
test_freeze() {
  seed_files 12
  start_fio_verify
  host_freeze 2
  log "froze host 2 for $((DETECT * 3)) s"
  sleep $((DETECT * 3))
  check_files 12 "while a host is frozen"
  host_thaw 2
  finish_fio_verify "host frozen"
  wait_redundant "$MNT" 60
  grep -q "is down" "$DLOG" || fail "the frozen server was never marked down"
  check_files 12 "after the thaw"
}

# Cut off for less than the lease (and the rebuild delay): the session resumes with every
# copy intact, nothing is copied.
test_cut_short() {
  seed_files 12
  host_cut 1
  log "cut host 1's link for $((DETECT * 3)) s"
  sleep $((DETECT * 3))
  check_files 12 "while a host is cut off"
  host_heal 1
  wait_log "$DLOG" "session resumed" 30 || fail "the session was not resumed: $(tail -n 5 "$DLOG")"
  # With --rebuild-delay 60 no rebuild pass runs during this test (checked: 0 passes), so
  # full redundancy after the heal can only come from the resumed session's copies.
  wait_redundant "$MNT" 30
  assert_eq "rebuild passes (delay 60 s)" "$(stats_field "$MNT" 's["rebuild"]["passes"]')" 0
  # Another host goes: chunks it shared with the resumed one are read from the resumed one.
  host_kill 0
  check_files 12 "read back with the resumed host's copies"
}

# Cut off for longer than the lease: rebuilt around while away; back empty, admitted and
# rebuilt onto.
test_cut_long() {
  seed_files 12
  host_cut 1
  log "cut host 1's link for 14 s (lease 3 s)"
  sleep 14
  check_files 12 "while a host is cut off"
  wait_redundant_except_down "$MNT" 30
  host_heal 1
  wait_log "$DLOG" "is up again \(empty\)" 30 ||
    fail "the server whose lease ran out was not re-admitted"
  wait_redundant "$MNT" 60
  check_files 12 "after the long cut"
}

# client_mount I MNT [ARGS...]: a volume mount whose daemon runs on test host I (its network
# namespace only: the mount itself is in the test's mount namespace, as on a real client).
client_mount() {
  local i=$1 mnt=$2
  shift 2
  mkdir -p "$mnt"
  nsenter --net="/run/netns/$(host_ns "$i")" timeout -k 10 60 "$BIN" mount "$mnt" \
    --servers "$(hosts_addrs)" --secret-file "$HOSTS_SECRET" "${MOUNT[@]}" "$@" \
    --log-file "$WORK/client$i.log" </dev/null
}

# A volume's daemon on test host 3 is killed while a writer records every fsynced state; the
# volume is attached from test host 4: every fsynced state is there.
test_volume_other_host() {
  local a=$WORK/on-a b=$WORK/on-b manifest=$WORK/manifest writer pid out
  local writer_py=$PWD/mount-tests/volume_writer.py
  : >"$manifest"
  client_mount 3 "$a" --volume far --create || fail "mount on host 3 failed"
  python3 "$writer_py" write "$a" "$manifest" 1 &
  writer=$!
  # Killed once the writer has confirmed a few states, at a random moment after.
  for ((k = 0; k < 300; k++)); do
    [ "$(grep -c '^C' "$manifest")" -ge 3 ] && break
    sleep 0.1
  done
  sleep "0.$((RANDOM % 8 + 1))"
  pid=$(daemon_pids "$a")
  [ -n "$pid" ] || fail "no daemon for $a"
  kill -9 "$pid"
  wait_daemon_gone "$a" 20 || fail "the daemon outlived kill -9"
  wait "$writer" || true
  [ "$(grep -c '^C' "$manifest")" -ge 3 ] || fail "the writer confirmed almost nothing: $(head -c 300 "$manifest")"
  log "killed the volume's daemon on host 3 after $(grep -c '^C' "$manifest") confirmed states"
  client_mount 4 "$b" --volume far || fail "attach from host 4 failed"
  out=$(t python3 "$writer_py" check "$b" "$manifest") || fail "on host 4: $out"
  log "host 4 found every fsynced state: $out"
  grep -q "holder connected" <<<"$(t "$BIN" volume status far --servers "$(hosts_addrs)" \
    --secret-file "$HOSTS_SECRET")" || fail "volume status does not show host 4 attached"
  timeout -k 5 30 umount -l "$a" || true
  unmount_fs "$b" || fail "unmount on host 4 failed"
}

# A host drained while fio writes and verifies (two copies of three hosts): fio verifies
# without an error, no sample of `stats --json` taken throughout shows a chunk short of two
# copies, and the drained host ends with no extent of the mount (asked of the host itself).
# Another admin request during the drain is refused at once. The host is then removed, and a
# new host (3) added takes new chunks. The copy rate is held to 30 MB/s
# (`--rebuild-rate`) so that the drain lasts long enough to be sampled.
test_drain() {
  local out extents drain
  seed_files 12
  wait_redundant "$MNT" 30
  start_fio_verify
  start_copy_sampler
  t "$BIN" admin drain "$MNT" "$(host_addr 2)" >"$WORK/drain.out" 2>"$WORK/drain.progress" &
  drain=$!
  # Another admin request meanwhile is refused at once, naming the drain.
  wait_log "$WORK/drain.progress" "bytes moved off" 30 || fail "the drain printed no progress within 30 s"
  out=$(t "$BIN" admin rebalance "$MNT" 2>&1) && fail "a rebalance during the drain was accepted: $out"
  grep -q "another admin request is running on this mount (Drain" <<<"$out" ||
    fail "the refusal does not name the drain: $out"
  wait "$drain" || fail "drain failed: $(cat "$WORK/drain.out") $(tail -n 3 "$WORK/drain.progress")"
  out=$(cat "$WORK/drain.out")
  log "$out"
  # About 100 MB at 30 MB/s: a few progress lines (one a second).
  [ "$(grep -c "bytes moved off" "$WORK/drain.progress")" -ge 1 ] ||
    fail "the drain printed no progress: $(head -c 300 "$WORK/drain.progress")"
  log "progress lines: $(wc -l <"$WORK/drain.progress"); last: $(tail -n 1 "$WORK/drain.progress")"
  finish_fio_verify "a host drained"
  stop_copy_sampler "during the drain"
  grep -qv ' 0$' "$WORK/samples" || fail "no sample saw a copy still to move: the drain was not sampled"
  extents=$(server_field "$(host_addr 2)" 's["extents"]' --secret-file "$HOSTS_SECRET")
  assert_eq "extents on the drained host" "$extents" 0
  check_files 12 "after the drain"
  out=$(t "$BIN" admin remove "$MNT" "$(host_addr 2)") || fail "remove failed: $out"
  assert_eq "the removed host's state" "$(stats_field "$MNT" "[x['state'] for x in s['servers'] if x['addr'] == '$(host_addr 2)'][0]")" removed
  host_start 3 256M "${SERVE[@]}" || fail "host 3 did not start"
  out=$(t "$BIN" admin add-server "$MNT" "$(host_addr 3)") || fail "add-server failed: $out"
  log "$out"
  must "write after add-server" dd if=/dev/urandom of="$MNT/new" bs=1M count=4 conv=fsync status=none
  all_chunks_on "$MNT/new" "$(host_addr 3)" || fail "host 3 does not hold a copy of every new chunk"
  wait_redundant "$MNT" 30
  check_files 12 "after remove and add-server"
}

# servers_used: extents and used bytes over the memory servers, asked of each server.
servers_used() {
  local i out="" e
  for ((i = 0; i < HOSTS_SERVERS; i++)); do
    e=$(server_field "$(host_addr "$i")" 's["extents"], s["total_bytes"] - s["free_bytes"]' \
      --secret-file "$HOSTS_SECRET") || fail "stats --server $(host_addr "$i") failed"
    out+="$e;"
  done
  echo "$out"
}

# Followers of a volume (`mount --read-only`): the test's mount holds volume `shared` and
# loads a data set (RMEMFS_FOLLOW_DATA_MB, 96 by default; the issue's 2 GiB run is in
# doc/TESTING.md); three followers, on test hosts 3 to 5, each read every byte of it and get
# the holder's checksums, while the servers hold the one copy set the holder wrote (extents
# and bytes asked of each server, before and after). Then, with the holder writing: 100 files
# fsynced one at a time appear on a follower (median and max printed, each within 5 s), an
# overwrite of a file a follower has cached reaches it, and a follower cannot write.
test_volume_followers() {
  local mb=${RMEMFS_FOLLOW_DATA_MB:-96} files=8 i r pids=() want used_before used_after out
  local check_py=$PWD/mount-tests/follow_check.py
  mkdir -p "$MNT/data"
  for ((i = 0; i < files; i++)); do
    must "write data/$i" dd if=/dev/urandom of="$MNT/data/$i" bs=1M count=$((mb / files)) conv=fsync status=none
  done
  drop_caches "$MNT" || fail "drop caches failed"
  want=$(cd "$MNT/data" && t sha256sum -- *) || fail "sha256sum on the holder failed"
  used_before=$(servers_used)
  for r in 3 4 5; do
    client_mount "$r" "$WORK/r$r" --volume shared --read-only || fail "follower on host $r did not mount"
  done
  local t0=$SECONDS
  for r in 3 4 5; do
    (cd "$WORK/r$r/data" && t sha256sum -- * >"$WORK/sums$r") &
    pids+=($!)
  done
  for r in 0 1 2; do wait "${pids[r]}" || fail "a follower's read of the data set failed"; done
  log "three followers read ${mb} MiB each in $((SECONDS - t0)) s"
  for r in 3 4 5; do
    assert_eq "the data set's checksums on host $r" "$(cat "$WORK/sums$r")" "$want"
  done
  used_after=$(servers_used)
  # One copy set: the followers added no extent on any server. The holder's journal may
  # move its checkpoint spare meanwhile (a free and a larger allocation when it retries:
  # the same count, some KiB more), so bytes need only stay far below another copy set.
  local before after k b a
  IFS=';' read -ra before <<<"$used_before"
  IFS=';' read -ra after <<<"$used_after"
  for k in "${!before[@]}"; do
    b=${before[k]//[() ]/} a=${after[k]//[() ]/}
    [ "${b%%,*}" = "${a%%,*}" ] ||
      fail "server $k holds ${a%%,*} extents after the followers read, ${b%%,*} before"
    [ "${a##*,}" -le $((${b##*,} + (1 << 20))) ] ||
      fail "server $k uses ${a##*,} bytes after the followers read, ${b##*,} before"
  done
  out=$(t python3 "$check_py" visible "$MNT" "$WORK/r4" 100 5 2>&1) || fail "$out"
  log "$out"
  out=$(t python3 "$check_py" overwrite "$MNT" "$WORK/r5" 5 2>&1) || fail "$out"
  log "$out"
  must_fail "a follower's write" "Read-only file system" touch "$WORK/r3/nope"
  out=$(stats_field "$WORK/r3" "s['follower']['applied'] > 0 and s['follower']['records'] > 0") ||
    fail "stats of a follower"
  assert_eq "a follower's stats show records applied" "$out" True
  for r in 3 4 5; do unmount_fs "$WORK/r$r" || fail "unmount of the follower on host $r failed"; done
}

# Issue 45's kill loop (longer in tools/shared-kill-loop.sh): three clients of one shared
# volume (two copies of each chunk), each on a test host of its own (3 to 5), their Redis on
# the hosts' bridge, each run a writer that records every file it fsynced in a manifest
# outside the mounts. For RMEMFS_KILL_LOOP_SECS (default 20) a random client's daemon is
# killed with SIGKILL every 3 s and mounted again, and twice a memory server host is killed
# and started empty. Then: every fsynced file of every writer whole on every mount, every
# chunk back at two copies (the rebuild), and after `rm -rf` and `volume rm --meta` every
# server's memory back and no key of the volume left in Redis.
test_volume_shared_kill_loop() {
  local secs=${RMEMFS_KILL_LOOP_SECS:-20} mnts=() i n out check=$PWD/mount-tests/shared_check.py
  local writers=() restarted=0 killed=0 end round=0 victim pid server short a left
  REDIS_BIND=$HOSTS_NET.1 start_redis --own-trap
  # shellcheck disable=SC2064 # the pid is meant to be expanded now
  trap "kill $REDIS_PID 2>/dev/null || true" EXIT
  remount() {
    local n=$1 made=()
    [ "${2:-}" = create ] && made=(--create)
    client_mount $((3 + n)) "${mnts[$n]}" --volume kl "${made[@]}" --meta "$REDIS_URL" \
      --rebuild-delay 1
  }
  for i in 0 1 2; do
    mnts+=("$WORK/kl$i")
    if [ "$i" = 0 ]; then remount 0 create || fail "mount on host 3 failed"; else remount "$i" || fail "mount on host $((3 + i)) failed"; fi
  done
  for i in 0 1 2; do
    python3 "$check" writers "${mnts[$i]}/w$i" "$((secs + 2))" "$WORK/manifest$i" \
      >"$WORK/writer$i.log" 2>&1 &
    writers+=($!)
  done
  end=$((SECONDS + secs))
  while [ "$SECONDS" -lt "$end" ]; do
    sleep 3
    round=$((round + 1))
    if [ $((round % 3)) = 2 ] && [ "$restarted" -lt 2 ]; then
      server=$restarted
      host_kill "$server" || fail "host $server outlived its kill"
      host_restart "$server" || fail "host $server did not start again"
      restarted=$((restarted + 1))
      log "round $round: memory server host $server killed and started empty"
      continue
    fi
    victim=$((RANDOM % 3))
    pid=$(daemon_pids "${mnts[$victim]}" | head -1)
    [ -n "$pid" ] || fail "no daemon for the client on host $((3 + victim))"
    kill -9 "$pid"
    wait_daemon_gone "${mnts[$victim]}" 10 || fail "the daemon on host $((3 + victim)) outlived kill -9"
    umount -l "${mnts[$victim]}" 2>/dev/null || true
    remount "$victim" || fail "mount on host $((3 + victim)) again after its kill failed"
    killed=$((killed + 1))
  done
  for pid in "${writers[@]}"; do wait "$pid" || fail "a writer failed: $(cat "$WORK"/writer*.log)"; done
  cat "$WORK"/writer*.log
  log "$killed clients killed and mounted again, $restarted memory servers started empty"
  # Every chunk back at two copies: the rebuild (its delay 1 s) on every client's view.
  for _ in $(seq 120); do
    short=0
    for m in "${mnts[@]}"; do
      n=$(stats_field "$m" 's["chunks"]["degraded"] + s["chunks"]["lost"]') || n=1
      short=$((short + n))
    done
    [ "$short" = 0 ] && break
    sleep 0.5
  done
  assert_eq "chunks short of copies after the rebuild" "$short" 0
  for i in 0 1 2; do
    if ! out=$(t python3 "$check" verify "$WORK/manifest$i" "${mnts[@]}" -- "w$i"); then
      # What each client saw of servers' births and checkpoints, for the report (the work
      # directory goes with the run).
      grep -hE "birth|checkpoint|lost changes|evict" "$WORK"/client*.log | tail -n 15 >&2 || true
      fail "verify w$i: $out"
    fi
    log "$out"
  done
  must "rm -rf on host 3" rm -rf "${mnts[0]}/w0" "${mnts[0]}/w1" "${mnts[0]}/w2"
  for m in "${mnts[@]}"; do unmount_fs "$m" || fail "unmount of $m failed"; done
  # Clients killed last may still have sessions: they run out and the volume is removed.
  for _ in $(seq 40); do
    "$BIN" volume rm kl --servers "$(hosts_addrs)" --secret-file "$HOSTS_SECRET" \
      --meta "$REDIS_URL" >"$WORK/rm.log" 2>&1 && break
    sleep 0.5
  done
  grep -q "removed volume 'kl'" "$WORK/rm.log" || fail "volume rm: $(cat "$WORK/rm.log")"
  left=0
  for ((i = 0; i < 3; i++)); do
    n=$(server_field "$(host_addr "$i")" 's["extents"]' --secret-file "$HOSTS_SECRET") ||
      fail "stats --server of host $i"
    left=$((left + n))
  done
  assert_eq "extents left on the servers after volume rm" "$left" 0
  a=${REDIS_URL#redis://}
  out=$(python3 -c 'import socket,sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
s.sendall(b"KEYS rmemfs:{kl}:*\r\n")
print(s.recv(65536).decode().split("\r\n")[0])' "${a%%:*}" "${a##*:}")
  assert_eq "keys of the volume left in Redis" "$out" "*0"
}

# name, extra serve arguments, extra mount arguments ("nomount": the test mounts its own)
ALL_TESTS=(
  "kill_restart||--rebuild-delay 8"
  "kill_seq_write||--rebuild-delay 1"
  "freeze||--rebuild-delay 1"
  "cut_short||--rebuild-delay 60"
  "cut_long|--lease 3|--rebuild-delay 1"
  "volume_other_host||"
  "drain||--rebuild-delay 60 --rebuild-rate 30M"
  "volume_followers||--volume shared --create"
  "volume_shared_kill_loop||nomount"
)

run_host_test() {
  local name=$1 sargs margs reason="" i tlog t0=$SECONDS
  read -ra sargs <<<"$2"
  read -ra margs <<<"$3"
  tlog=$BASE/logs/hosts-$name.log
  MNT=$BASE/mnt/$name WORK=$BASE/work/$name REASON=$BASE/logs/$name.reason
  DLOG=$WORK/daemon.log
  mkdir -p "$MNT" "$WORK"
  : >"$REASON"
  if ! hosts_init 6 2>>"$tlog"; then
    reason="cannot create the test hosts: $(tail -n 1 "$tlog")"
  fi
  for ((i = 0; i < 3; i++)); do
    [ -z "$reason" ] || break
    host_start "$i" "${RMEMFS_HOSTS_SIZE:-256M}" "${SERVE[@]}" "${sargs[@]}" 2>>"$tlog" || reason="host $i did not start"
  done
  if [ -z "$reason" ] && [ "${margs[*]}" != nomount ] &&
    ! RUST_LOG=${RMEMFS_TEST_RUST_LOG:-info} mount_fs "$MNT" "$(hosts_addrs)" "${MOUNT[@]}" \
      --secret-file "$HOSTS_SECRET" --log-file "$DLOG" "${margs[@]}" 2>>"$tlog"; then
    reason="mount failed: $(tail -n 1 "$tlog")"
  fi
  if [ -z "$reason" ]; then
    reason=$(run_test_fn "$name" "$tlog")
  fi
  if is_mounted "$MNT" && ! unmount_fs "$MNT" 2>>"$tlog"; then
    [ -n "$reason" ] || reason="unmount after the test failed"
  fi
  hosts_teardown
  if [ -z "$reason" ]; then
    echo "ok hosts/$name ($((SECONDS - t0)) s)"
    PASSED=$((PASSED + 1))
  else
    echo "FAIL hosts/$name ($((SECONDS - t0)) s): $reason"
    tail -n 20 "$tlog" | sed 's/^/    | /'
    [ -f "$DLOG" ] && tail -n 10 "$DLOG" | sed 's/^/    d /'
    FAILED=$((FAILED + 1))
  fi
}

main() {
  local spec name selected=()
  PASSED=0 FAILED=0
  for spec in "${ALL_TESTS[@]}"; do
    name=${spec%%|*}
    if [ $# -eq 0 ] || [[ " $* " == *" $name "* ]]; then selected+=("$spec"); fi
  done
  [ ${#selected[@]} -gt 0 ] || {
    echo "unknown test; tests: $(printf '%s\n' "${ALL_TESTS[@]}" | cut -d'|' -f1 | tr '\n' ' ')" >&2
    exit 2
  }
  ensure_packages fio:fio ip:iproute2 cmp:diffutils fusermount3:fuse3
  check_prereqs mount serve || exit 2
  lib_init hosts
  for spec in "${selected[@]}"; do
    IFS='|' read -r name s m <<<"$spec"
    run_host_test "$name" "$s" "$m"
  done
  hosts_teardown
  cleanup
  echo "$PASSED passed, $FAILED failed"
  [ "$FAILED" -eq 0 ] || exit 1
}

main "$@"
