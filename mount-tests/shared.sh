# Mount tests of shared volumes (`mount --volume NAME --meta redis://…`: many writers, the
# namespace in Redis), sourced by run.sh.

# Two writers of one volume, its namespace in Redis (`--meta`; a redis-server of the test's
# own on a loopback port): a tree, a file's bytes and an append made on one mount are seen on
# the other; the same name made on both fails on the second (EEXIST); 500 files made on one
# are listed on the other; `rm -rf` on one empties both. B names the servers in the other
# order (the volume's own order is used). A name Redis does not hold is refused without
# --create, naming the volumes it holds; --create makes the volume once (a shared one: a
# second writer joins it, and the first write works).
test_volume_shared() {
  local mnt2=$BASE/mnt/volume_shared2 i
  start_redis
  mkdir -p "$mnt2"
  must_fail "a shared volume not made" "no volume 'sv' .*known volumes: none.*--create" \
    "$BIN" mount "$MNT" --servers "$ADDRS" "${MOUNT_ARGS[@]}" --volume sv --meta "$REDIS_URL"
  mount_fs "$MNT" "$ADDRS" --volume sv --create --meta "$REDIS_URL" || fail "mount --create --meta failed"
  must_fail "a shared volume made twice" "volume 'sv' exists already" \
    "$BIN" mount "$mnt2" --servers "$ADDRS" "${MOUNT_ARGS[@]}" --volume sv --create --meta "$REDIS_URL"
  must_fail "a name Redis does not hold" "no volume 'nosuch' .*known volumes: sv[)]" \
    "$BIN" mount "$mnt2" --servers "$ADDRS" "${MOUNT_ARGS[@]}" --volume nosuch --meta "$REDIS_URL"
  # B names the servers in the other order: the volume's order (kept in Redis) is used.
  local reversed
  reversed=$(tr ',' '\n' <<<"$ADDRS" | tac | paste -sd, -)
  mount_fs "$mnt2" "$reversed" --volume sv --meta "$REDIS_URL" || fail "second mount --meta failed"
  must "mkdir on A" mkdir "$MNT/d"
  must "write on A" dd if=/dev/urandom of="$MNT/d/big" bs=1M count=16 conv=fsync status=none
  must "small on A" sh -c "echo hello >'$MNT/d/x'"
  # A handle opened only to write writes directly (FOPEN_DIRECT_IO): none of its bytes stay
  # in A's page cache (the next open drops them anyway). One that reads too leaves them
  # there, so a cache that shows nothing is not the check's blindness.
  local cached
  cached=$(python3 mount-tests/cached_pages.py "$MNT/d/direct" w $((256 << 10))) ||
    fail "a write-only handle's write on A"
  assert_eq "pages of a write-only handle's writes in A's page cache" "$cached" 0
  cached=$(python3 mount-tests/cached_pages.py "$MNT/d/cached" rw $((256 << 10))) ||
    fail "a read-write handle's write on A"
  [ "$cached" -gt 0 ] ||
    fail "a read-write handle's writes left nothing in A's page cache (the check sees no cache)"
  must "rm on A" rm "$MNT/d/direct" "$MNT/d/cached"
  # B sees A's changes when it opens the file or lists the directory (each catches up
  # first), or within a poll.
  must "mkdir on B" mkdir "$mnt2/d/sub"
  must "cmp A's file on B" cmp "$MNT/d/big" "$mnt2/d/big"
  must "append on B" sh -c "echo world >>'$mnt2/d/x'"
  must "mkdir on A" mkdir "$MNT/d/other"
  assert_eq "x on A" "$(cat "$MNT/d/x")" "hello
world"
  must_fail "the same name made on both" "File exists" mkdir "$MNT/d/sub"
  for ((i = 0; i < 500; i++)); do : >"$MNT/d/f$i" || fail "create f$i on A"; done
  must "mkdir on B" mkdir "$mnt2/d/last"
  assert_eq "entries on B (its listing catches up)" "$(ls "$mnt2/d" | wc -l)" 505
  must "rm -rf on B" rm -rf "$mnt2/d"
  must "mkdir on A" mkdir "$MNT/e"
  assert_eq "entries on A after B's rm -rf" "$(ls "$MNT")" "e"
  # A client joining a filled volume holds the root's names alone at first (the rest is
  # loaded as it is used, and by its poller): it sees A's tree whole, and B's change to it.
  for ((i = 0; i < 20; i++)); do
    mkdir -p "$MNT/e/t$i/u" && echo "$i" >"$MNT/e/t$i/u/f" || fail "tree on A"
  done
  local mnt3=$BASE/mnt/volume_shared3
  mkdir -p "$mnt3"
  mount_fs "$mnt3" "$ADDRS" --volume sv --meta "$REDIS_URL" || fail "a late mount failed"
  must "a change on B the late client has not loaded" mv "$mnt2/e/t7/u/f" "$mnt2/e/t8/moved"
  must "the late client's tree" diff -r "$MNT/e" "$mnt3/e"
  assert_eq "the moved file on the late client" "$(cat "$mnt3/e/t8/moved")" 7
  unmount_fs "$mnt3" || fail "unmount of the late client failed"
  unmount_fs "$mnt2" || fail "unmount of B failed"
  unmount_fs "$MNT" || fail "unmount of A failed"
  # The volume's memory stays with the servers until it is removed, with its namespace in
  # Redis (named by --meta: without it the servers' memory is not freed under a namespace
  # that names it).
  must_fail "volume rm of a shared volume without --meta" "is shared: .*--meta" \
    "$BIN" volume rm sv --servers "$ADDRS"
  t "$BIN" volume rm sv --servers "$ADDRS" --meta "$REDIS_URL" >/dev/null ||
    fail "volume rm of the shared volume failed"
  must_fail "a mount of the removed volume" "no volume 'sv'" \
    "$BIN" mount "$mnt2" --servers "$ADDRS" "${MOUNT_ARGS[@]}" --volume sv --meta "$REDIS_URL"
  local a left=0 n
  for a in ${ADDRS//,/ }; do
    n=$(server_field "$a" 's["extents"]') || fail "stats --server $a"
    left=$((left + n))
  done
  assert_eq "extents left on the servers after volume rm" "$left" 0
}

# The extents every server holds, summed.
servers_extents() {
  local a n sum=0
  for a in ${ADDRS//,/ }; do
    n=$(server_field "$a" 's["extents"]') || return 1
    sum=$((sum + n))
  done
  echo "$sum"
}

# The servers' extents once frees under way are done: the same for 2 s (past a mark's linger
# and a poll), within 20 s.
settled_extents() {
  local last now same=0
  last=$(servers_extents) || return 1
  for _ in $(seq 200); do
    sleep 0.1
    now=$(servers_extents) || return 1
    if [ "$now" = "$last" ]; then
      same=$((same + 1))
      [ "$same" -ge 20 ] && { echo "$now"; return 0; }
    else
      same=0 last=$now
    fi
  done
  return 1
}

# Many writers checked (mount-tests/shared_check.py), two mounts of one volume on Redis:
# locks (flock and fcntl) exclude across clients and a blocked one is granted on release;
# a flock is its open file's (a file opened again while the closed one's release is held
# back does not take it over);
# a blocked one ends at once when its process is killed or signalled (EINTR);
# close-to-open in 24 rounds; four workers (two per mount) change trees of their own and,
# under a flock, a shared directory, checked against models; then A's daemon is frozen
# (SIGSTOP) while a process on A holds a flock: B gets the lock only after A's session ran
# out, and A's process, its daemon resumed, cannot write (the file holds B's bytes only).
test_volume_shared_check() {
  local mnt2=$BASE/mnt/volume_shared_check2 out pid
  start_redis
  mkdir -p "$mnt2"
  # A's daemon holds a flock's RELEASE back while this file exists (the testing build's gate).
  local gate=$BASE/flock-release-gate
  # A writes behind (asked for), B does not: every check below runs both ways.
  RMEMFS_TESTING_FLOCK_RELEASE_GATE=$gate mount_fs "$MNT" "$ADDRS" --volume sc --create \
    --meta "$REDIS_URL" -o write_behind || fail "mount --create --meta failed"
  mount_fs "$mnt2" "$ADDRS" --volume sc --meta "$REDIS_URL" || fail "second mount --meta failed"
  local check=mount-tests/shared_check.py
  out=$(t python3 $check locks "$MNT" "$mnt2") || fail "locks: $out"
  echo "$out" >&2
  out=$(t python3 $check reopen "$MNT" "$mnt2" "$gate") || fail "reopen: $out"
  echo "$out" >&2
  pid=$(daemon_pids "$mnt2" | head -1)
  [ -n "$pid" ] || fail "no daemon for $mnt2"
  out=$(t python3 $check interrupt "$MNT" "$mnt2" "$pid") || fail "interrupt: $out"
  echo "$out" >&2
  out=$(t python3 $check waiters "$MNT" "$mnt2" "$pid" 6) || fail "waiters: $out"
  echo "$out" >&2
  out=$(t python3 $check c2o "$MNT" "$mnt2" 24) || fail "close-to-open: $out"
  echo "$out" >&2
  # A file unlinked on A while open on B: kept for B's handle, its memory back after.
  local before after
  before=$(settled_extents) || fail "the servers' extents never settled"
  out=$(t python3 $check sustain "$MNT" "$mnt2" "${RMEMFS_TEST_SUSTAIN_SECS:-3}") ||
    fail "sustain: $out"
  echo "$out" >&2
  for _ in $(seq 100); do
    after=$(servers_extents) || fail "stats of the servers"
    [ "$after" = "$before" ] && break
    sleep 0.1
  done
  assert_eq "extents on the servers after the sustained file's last close" "$after" "$before"
  out=$(t python3 $check model "$MNT" "$mnt2" 4 40 "${RMEMFS_TEST_SEED:-1}") || fail "model: $out"
  echo "$out" >&2
  pid=$(daemon_pids "$MNT" | head -1)
  [ -n "$pid" ] || fail "no daemon for $MNT"
  out=$(t python3 $check freeze "$MNT" "$mnt2" "$pid" 10) || fail "freeze: $out"
  echo "$out" >&2
  unmount_fs "$mnt2" || fail "unmount of B failed"
  # A was evicted: its unmount must still end it.
  unmount_fs "$MNT" || fail "unmount of the evicted A failed"
  t "$BIN" volume rm sc --servers "$ADDRS" --meta "$REDIS_URL" >/dev/null ||
    fail "volume rm of the shared volume failed"
}

# The shared model check alone, many rounds on one pair of mounts (stress, for
# tools/shared-model.sh): ROUNDS rounds of `shared_check.py model` with seeds 1..ROUNDS, each
# in a directory of its own, checkpoints every 200 changes; stops at the first failure, naming
# the seed. RMEMFS_MODEL_A_ARGS: more arguments for the first mount (e.g. "-o write_behind").
test_volume_shared_model() {
  local mnt2=$BASE/mnt/volume_shared_model2 out r a_args
  read -ra a_args <<<"${RMEMFS_MODEL_A_ARGS:-}"
  start_redis
  mkdir -p "$mnt2"
  # A checkpoint (and the trims after it) every 200 changes, as in the storm.
  RMEMFS_TESTING_CHECKPOINT_EVERY=200 mount_fs "$MNT" "$ADDRS" --volume sm --create \
    --meta "$REDIS_URL" "${a_args[@]}" || fail "mount --create --meta failed"
  RMEMFS_TESTING_CHECKPOINT_EVERY=200 mount_fs "$mnt2" "$ADDRS" --volume sm --meta "$REDIS_URL" ||
    fail "second mount --meta failed"
  for ((r = 1; r <= ${RMEMFS_MODEL_ROUNDS:-20}; r++)); do
    mkdir "$MNT/round$r"
    out=$(t python3 mount-tests/shared_check.py model "$MNT/round$r" "$mnt2/round$r" \
      "${RMEMFS_MODEL_WORKERS:-4}" 40 "$r") || fail "model, round $r (seed $r): $out"
    echo "round $r: $out" >&2
    rm -rf "${MNT:?}/round$r"
  done
}

# Redis restarted under three writers (one per mount), its append-only file synced at every
# write: changes made while it is down fail and are undone, every file a writer was told is
# written (fsynced) reads back whole on every mount, and the mounts list the same names. Then
# Redis comes back empty (its file lost): every mount stops changing the volume with EIO and
# its log names the loss.
test_volume_shared_redis() {
  local aof=$BASE/redis-aof port mnts=() i out
  command -v redis-server >/dev/null 2>&1 || ensure_packages redis-server:redis-server
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  mkdir -p "$aof"
  redis_up() {
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly yes \
      --appendfsync always --dir "$aof" >>"$BASE/logs/redis-aof.log" 2>&1 &
    RR_PID=$!
    for _ in $(seq 100); do
      python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1)' \
        "$port" 2>/dev/null && return 0
      sleep 0.05
    done
    return 1
  }
  redis_up || fail "redis-server did not start"
  # RR_PID (global: the trap runs after this function) is Redis's pid of the moment.
  trap 'kill "${RR_PID:-}" 2>/dev/null || true' EXIT
  local url=redis://127.0.0.1:$port
  for i in 1 2 3; do
    mnts+=("$BASE/mnt/volume_shared_redis$i")
    made=(); [ "$i" = 1 ] && made=(--create)
    mount_fs "${mnts[-1]}" "$ADDRS" --volume rr "${made[@]}" --meta "$url" \
      --log-file "$BASE/logs/daemon-rr$i.log" || fail "mount $i failed"
  done
  local check=mount-tests/shared_check.py pids=()
  for i in 0 1 2; do
    python3 $check writers "${mnts[$i]}/d$i" 6 "$BASE/manifest$i" >"$BASE/logs/writers$i.log" 2>&1 &
    pids+=($!)
  done
  sleep 2
  kill -9 "$RR_PID"
  wait "$RR_PID" 2>/dev/null || true
  sleep 1
  redis_up || fail "redis-server did not start again"
  for p in "${pids[@]}"; do wait "$p" || fail "a writer failed: $(cat "$BASE"/logs/writers*.log)"; done
  cat "$BASE"/logs/writers*.log >&2
  for i in 0 1 2; do
    out=$(t python3 $check verify "$BASE/manifest$i" "${mnts[@]}" -- "d$i") || fail "verify d$i: $out"
    echo "$out" >&2
  done
  # Redis back empty: every mount stops (EIO), naming the loss.
  kill -9 "$RR_PID"
  wait "$RR_PID" 2>/dev/null || true
  rm -rf "$aof"
  mkdir -p "$aof"
  redis_up || fail "redis-server did not start empty"
  for i in 1 2 3; do
    local m=${mnts[$((i - 1))]} log=$BASE/logs/daemon-rr$i.log
    wait_log "$log" "lost changes" 10 || fail "mount $i did not name the loss: $(tail -3 "$log")"
    must_fail "a change on mount $i after the loss" "Input/output error" touch "$m/after-loss"
  done
  for m in "${mnts[@]}"; do unmount_fs "$m" || fail "unmount of $m failed"; done
  kill "$RR_PID" 2>/dev/null || true
}

# A large shared volume (past RMEMFS_TESTING_WHOLE_UNDER=100 inodes here, 100,000 in a product
# build): the maker keeps the whole table; a client that joins holds what it uses, its poller
# loads nothing more, and it forgets what its kernel lets go of (drop_caches); its listings
# still show the whole tree.
test_volume_shared_by_use() {
  local mnt2=$BASE/mnt/volume_shared_by_use2 i f n
  start_redis
  mkdir -p "$mnt2"
  RMEMFS_TESTING_WHOLE_UNDER=100 mount_fs "$MNT" "$ADDRS" --volume bu --create \
    --meta "$REDIS_URL" || fail "mount --create --meta failed"
  for ((i = 0; i < 20; i++)); do
    mkdir "$MNT/d$i" || fail "mkdir d$i on A"
    for ((f = 0; f < 10; f++)); do echo "$i/$f" >"$MNT/d$i/f$f" || fail "d$i/f$f on A"; done
  done
  # A (whole) notes its count of inodes in Redis each second: B reads there that the volume
  # is large.
  for ((i = 0; i < 100; i++)); do
    n=$(redis-cli -u "$REDIS_URL" HGET 'rmemfs:{bu}:s:info' inodes)
    [ "${n:-0}" -ge 221 ] && break
    sleep 0.1
  done
  [ "${n:-0}" -ge 221 ] || fail "A noted ${n:-no} inodes in Redis, not its 221"
  RMEMFS_TESTING_WHOLE_UNDER=100 mount_fs "$mnt2" "$ADDRS" --volume bu --meta "$REDIS_URL" ||
    fail "second mount --meta failed"
  assert_eq "a file of A's read on B" "$(cat "$mnt2/d7/f3")" "7/3"
  # Twenty rounds of B's poller (one each 100 ms), which on a small volume load it all: B
  # holds the root, its 20 names and d7's 10 still (a few more at most).
  sleep 2
  n=$(stats_field "$mnt2" 's["inodes"]') || fail "stats of B"
  [ "$n" -lt 60 ] || fail "B holds $n inodes: its poller loaded the volume (about 31 expected)"
  n=$(stats_field "$MNT" 's["inodes"]') || fail "stats of A"
  [ "$n" -ge 221 ] || fail "A (the keeper) holds $n inodes, not the whole 221"
  assert_eq "A's standing (keeper, whole, large)" \
    "$(stats_field "$MNT" '[s["shared"][k] for k in ("keeper", "whole", "large")]')" "[1, 1, 1]"
  assert_eq "B's standing (keeper, whole, large)" \
    "$(stats_field "$mnt2" '[s["shared"][k] for k in ("keeper", "whole", "large")]')" "[0, 0, 1]"
  assert_eq "B's tree against A's" "$(cd "$mnt2" && find . | sort | md5sum)" \
    "$(cd "$MNT" && find . | sort | md5sum)"
  n=$(stats_field "$mnt2" 's["inodes"]') || fail "stats of B"
  [ "$n" -ge 221 ] || fail "B holds $n inodes after its find (221 expected)"
  # B's kernel lets its dentries go: B forgets what they held (within a few polls), but
  # what its kernel still holds (a file open, a directory open) stays usable.
  exec 3<"$mnt2/d5/f5" || fail "open d5/f5 on B"
  exec 4<"$mnt2/d6" || fail "open d6 on B"
  sync
  if echo 2 >/proc/sys/vm/drop_caches 2>/dev/null; then
    for ((i = 0; i < 100; i++)); do
      n=$(stats_field "$mnt2" 's["inodes"]') || fail "stats of B"
      [ "$n" -lt 60 ] && break
      sleep 0.1
    done
    [ "$n" -lt 60 ] || fail "B holds $n inodes after its kernel let them go (about 41 expected: the root's names, d5's and d6's)"
  else
    echo "SKIPPED (part): B forgetting what its kernel let go of (drop_caches needs root)" >&2
  fi
  assert_eq "an open file read on B after its kernel let go" "$(cat <&3)" "5/5"
  assert_eq "an open directory listed on B after its kernel let go" \
    "$(ls /dev/fd/4/ | wc -l)" 10
  exec 3<&- 4<&-
  assert_eq "a file of A's read on B again" "$(cat "$mnt2/d12/f4")" "12/4"
  must "a change on B" sh -c "echo b >'$mnt2/d12/from-b'"
  assert_eq "B's change on A" "$(cat "$MNT/d12/from-b")" "b"
  unmount_fs "$mnt2" || fail "unmount of B failed"
  unmount_fs "$MNT" || fail "unmount of A failed"
}

# A storm (tools/shared-storm.sh runs it ROUNDS times under CPU load): four processes, two per
# mount, make and remove 1,500 files each in one directory with no lock, the mounts writing a
# checkpoint every 500 changes (RMEMFS_TESTING_CHECKPOINT_EVERY; 20,000 in a product build),
# so the log and the versions are trimmed under the storm and a mount behind a trim is sent
# back by it; nothing may hang, the directory must end empty on both mounts, and Redis's
# versions must have been trimmed (their floor past 0).
test_volume_shared_storm() {
  local mnt2=$BASE/mnt/volume_shared_storm2 out floor i
  start_redis
  mkdir -p "$mnt2"
  RMEMFS_TESTING_CHECKPOINT_EVERY=500 mount_fs "$MNT" "$ADDRS" --volume st --create \
    --meta "$REDIS_URL" --log-file "$BASE/logs/daemon-storm1.log" ||
    fail "mount --create --meta failed"
  RMEMFS_TESTING_CHECKPOINT_EVERY=500 mount_fs "$mnt2" "$ADDRS" --volume st --meta "$REDIS_URL" \
    --log-file "$BASE/logs/daemon-storm2.log" || fail "second mount --meta failed"
  out=$(t python3 mount-tests/shared_check.py storm "$MNT" "$mnt2" "${RMEMFS_STORM_FILES:-1500}") ||
    fail "storm: $out"
  echo "$out" >&2
  # A checkpoint waits for a moment with no change under way: the storm's end at the latest
  # (a poll every 100 ms), so within 10 s of it.
  for ((i = 0; i < 100; i++)); do
    floor=$(redis-cli -u "$REDIS_URL" GET 'rmemfs:{st}:vfloor')
    [ "${floor:-0}" -gt 0 ] && break
    sleep 0.1
  done
  [ "${floor:-0}" -gt 0 ] || fail "no checkpoint trimmed Redis's versions (vfloor '$floor')"
  echo "versions trimmed up to change $floor, $(redis-cli -u "$REDIS_URL" HLEN 'rmemfs:{st}:vers') kept" >&2
  unmount_fs "$mnt2" || fail "unmount of B failed"
  unmount_fs "$MNT" || fail "unmount of A failed"
}
