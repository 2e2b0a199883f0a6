# shellcheck shell=bash disable=SC2016 # '$1' in bash -c scripts is meant literally
# Real-mount tests of volumes (one holder): crashes, freezes, followers, kept connections and
# exports. Many writers of one volume are in shared.sh. Sourced by run.sh.

# oom_kill PID: kills PID through a cgroup v2 memory limit below its use (the kernel's OOM
# killer, as a host short of memory would). Returns 2 where there is no cgroup v2 memory
# controller.
oom_kill() {
  local pid=$1 cg=/sys/fs/cgroup/rmemfs-oom-$$
  grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null || return 2
  grep -qw memory /sys/fs/cgroup/cgroup.subtree_control ||
    echo +memory >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || return 2
  mkdir -p "$cg" || return 2
  echo "$pid" >"$cg/cgroup.procs" || { rmdir "$cg"; return 2; }
  echo 1M >"$cg/memory.max" 2>/dev/null || true
  wait_daemon_gone "$MNT" 20
  grep -q "oom_kill [1-9]" "$cg/memory.events" || { rmdir "$cg" 2>/dev/null; return 1; }
  rmdir "$cg" 2>/dev/null || true
}

# A volume outlives its daemon. Each round a writer (volume_writer.py) creates, writes,
# appends, renames and unlinks, recording after every fsync of a file and its directory what
# the path must hold (in a manifest outside the mount); the daemon is killed at a random
# moment (SIGKILL; once by a cgroup v2 memory limit where the machine has one), then the
# volume is attached again: every fsynced state must be there. Then: a second daemon is
# refused and --takeover fences the first; rm -rf gives the servers' memory back to what the
# new volume held; `volume rm` frees the rest.
test_volume_crash() {
  local round pid out rc free_new free_end manifest=$WORK/manifest writer
  local rounds=${RMEMFS_VOLUME_ROUNDS:-5} total mnt2=$BASE/mnt/volume_crash2
  local writer_py=$PWD/mount-tests/volume_writer.py
  : >"$manifest"
  mkdir -p "$mnt2"
  mount_fs "$MNT" "$ADDRS" --volume kl --create || fail "mount --volume kl --create failed"
  free_new=$(servers_free) || fail "stats --server failed"
  rc=0
  out=$(t "$BIN" mount "$mnt2" --servers "$ADDRS" --volume nosuch 2>&1 </dev/null) || rc=$?
  [ "$rc" -ne 0 ] || fail "an unknown volume was attached"
  grep -q "known volumes: kl" <<<"$out" || fail "the refusal does not list the known volumes: $out"
  for ((round = 1; round <= rounds; round++)); do
    python3 "$writer_py" write "$MNT" "$manifest" "$round" &
    writer=$!
    # A random moment into the writer's run: what is killed is whatever the daemon was doing.
    sleep "0.$((RANDOM % 8 + 2))"
    pid=$(daemon_pids "$MNT")
    [ -n "$pid" ] || fail "round $round: no daemon"
    rc=0
    if [ "$round" -eq 3 ]; then oom_kill "$pid" || rc=$?; fi
    if [ "$round" -ne 3 ] || [ "$rc" -ne 0 ]; then
      [ "$rc" -eq 2 ] && echo "SKIPPED (loudly): the cgroup v2 OOM kill of round 3: no cgroup v2 memory controller here; SIGKILL instead" | tee -a "$WORK/skipped" >&2
      [ "$rc" -eq 1 ] && fail "round $round: the cgroup memory limit did not OOM-kill the daemon"
      kill -9 "$pid" 2>/dev/null
    fi
    wait_daemon_gone "$MNT" 20 || fail "round $round: the daemon outlived its kill"
    wait "$writer" || true
    mount_fs "$MNT" "$ADDRS" --volume kl || fail "round $round: re-attach failed"
    out=$(t python3 "$writer_py" check "$MNT" "$manifest") || fail "round $round: $out"
    echo "round $round: $out" >&2
  done
  case $(wc -l <"$manifest") in 0 | 1 | 2) fail "the writer confirmed almost nothing: $(cat "$manifest")" ;; esac

  # One holder: a second daemon is refused, naming the holder; --takeover fences it.
  rc=0
  out=$(t "$BIN" mount "$mnt2" --servers "$ADDRS" --volume kl 2>&1 </dev/null) || rc=$?
  [ "$rc" -ne 0 ] || fail "a second daemon attached a held volume"
  grep -q "is held by .* pid [0-9]* (epoch [0-9]*)" <<<"$out" || fail "the refusal does not name holder and epoch: $out"
  mount_fs "$mnt2" "$ADDRS" --volume kl --takeover || fail "--takeover failed"
  rc=0
  t python3 -c 'import os,sys; f=open(sys.argv[1],"wb"); f.write(b"x"*8192); f.flush(); os.fsync(f.fileno())' "$MNT/late" 2>/dev/null || rc=$?
  [ "$rc" -ne 0 ] || fail "the fenced daemon's write and fsync succeeded"
  [ ! -e "$mnt2/late" ] || fail "what the fenced daemon wrote is visible to the new holder"
  out=$(t python3 "$writer_py" check "$mnt2" "$manifest") || fail "after the takeover: $out"
  timeout -k 5 30 umount -l "$MNT" || true
  wait_daemon_gone "$MNT" 10 || fail "the fenced daemon did not exit after its unmount"

  # rm -rf, a barrier, and a re-attach (which frees what the crashed daemons held in stock):
  # the servers hold what the new volume held.
  t rm -rf "$mnt2"/d* || fail "rm -rf failed"
  t python3 -c 'import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd)' "$mnt2" || fail "fsync of the root failed"
  unmount_fs "$mnt2" || fail "unmount failed"
  mount_fs "$MNT" "$ADDRS" --volume kl || fail "re-attach failed"
  free_end=$(servers_free) || fail "stats --server failed"
  assert_eq "free server memory after rm -rf (as after the volume was made)" "$free_end" "$free_new"
  unmount_fs "$MNT" || fail "unmount failed"
  out=$(t "$BIN" volume ls --servers "$ADDRS") || fail "volume ls: $out"
  grep -q "^kl .*detached" <<<"$out" || fail "volume ls does not list kl detached: $out"
  out=$(t "$BIN" volume rm kl --servers "$ADDRS") || fail "volume rm: $out"
  total=0
  for a in ${ADDRS//,/ }; do
    total=$((total + $(server_field "$a" 's["total_bytes"]')))
  done
  assert_eq "free server memory after volume rm" "$(servers_free)" "$total"
}

# (its own servers, --lease 3; no mount) A holder frozen (SIGSTOP) while still connected: a
# second daemon is refused while the lease runs, naming the holder, and takes the volume over
# without --takeover once the holder has been silent past the lease. The first daemon, resumed
# (SIGCONT), fails its writes, and nothing it writes ever reaches the new holder's files.
test_volume_frozen() {
  local addrs="" pid out attached=0 i mnt2=$BASE/mnt/volume_frozen2 own=()
  mkdir -p "$mnt2"
  for _ in 1 2; do
    start_server 256M --lease 3 || fail "a server did not start"
    addrs+=${addrs:+,}$SERVER_ADDR
    own+=("$SERVER_PID")
  done
  # shellcheck disable=SC2064 # the pids are meant to be expanded now
  trap "kill_servers ${own[*]}" EXIT
  # Heartbeats every second (a quarter of the op timeout): a live holder is never silent
  # for the 3 s lease.
  mount_fs "$MNT" "$addrs" --volume fz --create --op-timeout 4 || fail "mount --volume fz --create failed"
  must "write a" python3 -c 'import os,sys; f=open(sys.argv[1],"wb"); f.write(b"before\n"*1000); f.flush(); os.fsync(f.fileno())' "$MNT/a"
  pid=$(daemon_pids "$MNT")
  [ -n "$pid" ] || fail "no daemon"
  kill -STOP "$pid"
  out=$(t "$BIN" mount "$mnt2" --servers "$addrs" --volume fz 2>&1 </dev/null) &&
    fail "a second daemon attached while the frozen holder's lease ran"
  grep -q "is held by .* pid $pid (epoch [0-9]*)" <<<"$out" || fail "the refusal does not name the frozen holder: $out"
  for ((i = 0; i < 60; i++)); do
    if mount_fs "$mnt2" "$addrs" --volume fz --op-timeout 4 2>/dev/null; then
      attached=1
      break
    fi
    sleep 0.5
  done
  [ "$attached" = 1 ] || fail "the volume of a holder silent past the lease was not taken over"
  assert_eq "a on the new holder" "$(head -c 7 "$mnt2/a")" "before"
  kill -CONT "$pid"
  t python3 -c 'import os,sys; f=open(sys.argv[1],"wb"); f.write(b"x"*8192); f.flush(); os.fsync(f.fileno())' "$MNT/late" 2>/dev/null &&
    fail "the fenced daemon's new file was written and fsynced"
  t python3 -c 'import os,sys; fd=os.open(sys.argv[1], os.O_WRONLY); os.pwrite(fd, b"AFTER!", 0); os.fsync(fd)' "$MNT/a" 2>/dev/null &&
    fail "the fenced daemon's overwrite was written and fsynced"
  sync
  echo 3 >/proc/sys/vm/drop_caches
  [ ! -e "$mnt2/late" ] || fail "the fenced daemon's file is visible to the new holder"
  assert_eq "a on the new holder after the fenced overwrite" "$(head -c 7 "$mnt2/a")" "before"
  assert_eq "a's size" "$(stat -c %s "$mnt2/a")" 7000
  timeout -k 5 30 umount -l "$MNT" || true
  wait_daemon_gone "$MNT" 10 || fail "the fenced daemon did not exit after its unmount"
  unmount_fs "$mnt2" || fail "unmount failed"
}

# A volume's follower on this host (the fabric's read-only path; mount-tests/hosts.sh
# volume_followers runs three on test hosts): it reads the holder's files with their
# checksums, sees files the holder fsyncs and an overwrite of a file it holds open, cannot
# write, and adds no extent to the servers.
test_volume_follow() {
  local mnt2=$BASE/mnt/volume_follow2 want got free extents out
  local check_py=$PWD/mount-tests/follow_check.py
  mount_fs "$MNT" "$ADDRS" --volume fl --create || fail "mount --volume fl --create failed"
  mkdir -p "$MNT/d" "$mnt2"
  must "write d/big" dd if=/dev/urandom of="$MNT/d/big" bs=1M count=24 conv=fsync status=none
  must "write d/small" sh -c "echo small >'$MNT/d/small' && sync '$MNT/d/small'"
  want=$(cd "$MNT/d" && t sha256sum -- *) || fail "sha256sum on the holder failed"
  free=$(servers_free) || fail "servers' free bytes"
  extents=$(servers_sum extents) || fail "servers' extents"
  mount_fs "$mnt2" "$ADDRS" --volume fl --read-only || fail "mount --read-only failed"
  got=$(cd "$mnt2/d" && t sha256sum -- *) || fail "sha256sum on the follower failed"
  assert_eq "checksums on the follower" "$got" "$want"
  # The follower takes no extent. The holder may give some back meanwhile (its stock) or
  # move its journal's checkpoint spare (a free and a slightly larger allocation), so the
  # count may only fall and the free bytes only by less than a MiB.
  got=$(servers_sum extents) || fail "servers' extents"
  [ "$got" -le "$extents" ] || fail "the servers hold $got extents with a follower reading, $extents before"
  got=$(servers_free) || fail "servers' free bytes"
  [ "$got" -ge $((free - (1 << 20))) ] ||
    fail "the servers have $got bytes free with a follower reading, $free before"
  out=$(t python3 "$check_py" visible "$MNT" "$mnt2" 20 5 2>&1) || fail "$out"
  log "$out"
  out=$(t python3 "$check_py" overwrite "$MNT" "$mnt2" 5 2>&1) || fail "$out"
  log "$out"
  must_fail "a follower's write" "Read-only file system" touch "$mnt2/nope"
  unmount_fs "$mnt2" || fail "unmount of the follower failed"
  unmount_fs "$MNT" || fail "unmount of the holder failed"
  t "$BIN" volume rm fl --servers "$ADDRS" >/dev/null || fail "volume rm failed"
}

# export_twice NAME DEST: exports volume NAME to DEST; a second export copies no chunk.
export_twice() {
  local out
  out=$(t "$BIN" volume export "$1" "$2" --servers "$ADDRS" 2>&1) || fail "export to $2: $out"
  echo "$out" >&2
  grep -qF "exported volume '$1' to $2" <<<"$out" || fail "export said: $out"
  out=$(t "$BIN" volume export "$1" "$2" --servers "$ADDRS" 2>&1) || fail "second export: $out"
  grep -q "; 0 chunks copied" <<<"$out" || fail "a second export copied chunks again: $out"
}

# power_loss: the whole rack loses power: every server of the test stops, and two new ones
# start empty (ADDRS and TEST_PIDS name them).
power_loss() {
  local addrs=""
  kill_servers "${TEST_PIDS[@]}"
  for _ in 1 2; do
    start_server 256M || fail "a new server did not start"
    addrs+=${addrs:+,}$SERVER_ADDR
    TEST_PIDS+=("$SERVER_PID")
  done
  ADDRS=$addrs
}

# `volume export` and `import`, as after losing the whole rack's power: a tree (hard links,
# symlinks, xattrs, an ACL, holes, owners and modes) on a volume is exported to a directory,
# every server is stopped, new empty ones start, the export is imported and mounted: the
# same tree. A second export copies nothing new; an export without its manifest is refused.
# (one server, no mount) Restart without unmounting (--supervise): the daemon killed twice
# (SIGKILL) and restarted once (SIGHUP, an upgrade's path) while a program holds a file being
# written, one being read, one unlinked while open and a directory stream, and stat()s in a
# loop: every descriptor keeps working with the same bytes, no request fails; then killed
# with an fsync certainly in its hands (its server frozen), which the next daemon answers
# after the kernel sends it again (FUSE_NOTIFY_RESEND). Unmounting ends the supervisor.
test_volume_keep() {
  local out
  # A kept connection is served through the kept /dev/fuse descriptor, whatever the default.
  local EXPECT_FUSE=/dev/fuse
  mount_fs "$MNT" "$ADDRS" --volume keep --create --supervise --op-timeout 60 ||
    fail "mount --supervise failed"
  out=$(t python3 mount-tests/keep_open.py "$MNT" "${TEST_PIDS[0]}") || fail "$out"
  echo "$out" >&2
  grep -q "round 4 .*the fsync returned 0" <<<"$out" || fail "the resend round did not run: $out"
  unmount_fs "$MNT" || fail "unmounting the supervised mount failed"
  [ -z "$(daemon_pids "$MNT")" ] || fail "the supervisor outlived the unmount"
}

# (servers 2 × 256M, no mount) Write-behind on a volume's holder (its default): three writers
# append to files whose every 8-byte word names its file and place (most never fsynced, one in
# four fsynced with its directory, one in five unlinked again so later files get memory that
# held other files' bytes); the daemon is killed (SIGKILL) at a random moment and the volume
# attached again, RMEMFS_VOLUME_ROUNDS times (3): every fsynced byte is there, and no file holds
# a word of another file or anything else it was never written (zeros where the kernel's
# writeback cache had not sent a page yet are allowed). tools/volume-kill-loop.sh runs it longer.
test_volume_crash_behind() {
  local round pid out manifest=$WORK/manifest writer deferred tries
  local rounds=${RMEMFS_VOLUME_ROUNDS:-3} writer_py=$PWD/mount-tests/pattern_writer.py
  : >"$manifest"
  mount_fs "$MNT" "$ADDRS" --volume wb --create || fail "mount --volume wb --create failed"
  for ((round = 1; round <= rounds; round++)); do
    python3 "$writer_py" write "$MNT" "$manifest" "$round" 3 &
    writer=$!
    sleep "0.$((RANDOM % 8 + 2))"
    # The kill comes once some write was answered before it was sent: on a loaded machine
    # the writers may not have written yet, so the daemon is asked again (for up to 20 s).
    for ((tries = 0; ; tries++)); do
      deferred=$(stats_field "$MNT" 's["writeback"]["behind"]["deferred"]') ||
        fail "round $round: stats --json failed"
      [ "$deferred" -gt 0 ] && break
      [ "$tries" -lt 200 ] || fail "round $round: no write was answered before it was sent (20 s)"
      sleep 0.1
    done
    pid=$(daemon_pids "$MNT")
    [ -n "$pid" ] || fail "round $round: no daemon"
    kill -9 "$pid" 2>/dev/null
    wait_daemon_gone "$MNT" 20 || fail "round $round: the daemon outlived its kill"
    wait "$writer" || true
    mount_fs "$MNT" "$ADDRS" --volume wb || fail "round $round: re-attach failed"
    out=$(t python3 "$writer_py" check "$MNT" "$manifest") || fail "round $round: $out"
    echo "round $round: $out ($deferred writes answered before they were sent)" >&2
  done
  grep -q '^+' "$manifest" || fail "the writers fsynced nothing"
}

test_volume_export() {
  local src=$WORK/src dest=$WORK/export out p
  # The servers started below are this subshell's: the runner knows only the first ones.
  trap 'kill_servers "${TEST_PIDS[@]}"' EXIT
  mkdir -p "$src/d/e"
  head -c 3000000 /dev/urandom >"$src/d/big"
  printf 'small\n' >"$src/d/e/small"
  ln "$src/d/e/small" "$src/d/hard"
  ln -s e/small "$src/d/link"
  truncate -s 5M "$src/d/holes" && printf 'tail' | dd of="$src/d/holes" bs=1 seek=4194304 conv=notrunc status=none
  chown 1234:2345 "$src/d/e/small" && chmod 640 "$src/d/e/small"
  mount_fs "$MNT" "$ADDRS" --volume exp --create || fail "mount --volume exp --create failed"
  # A volume keeps no more copies than its journal (three): four refused, saying why.
  out=$(t "$BIN" admin set-replicas "$MNT" 4 2>&1) && fail "4 copies on a volume were accepted: $out"
  grep -q "journal keeps 3" <<<"$out" || fail "the refusal does not say why: $out"
  must "cp -a" cp -a "$src/d" "$MNT/"
  command -v setfattr >/dev/null && must "setfattr" setfattr -n user.tag -v kept "$MNT/d/big"
  command -v setfacl >/dev/null && must "setfacl" setfacl -m u:1234:r "$MNT/d/big"
  command -v getfattr >/dev/null && getfattr -d -m - "$MNT/d/big" >"$WORK/xattrs-before" 2>/dev/null
  unmount_fs "$MNT" || fail "unmount failed"
  export_twice exp "$dest"
  power_loss
  out=$(t "$BIN" volume import "$dest" exp --servers "$ADDRS") || fail "import: $out"
  echo "$out" >&2
  mount_fs "$MNT" "$ADDRS" --volume exp || fail "mounting the imported volume failed"
  compare_trees "$src/d" "$MNT/d" "the imported tree"
  assert_eq "hard link count" "$(stat -c %h "$MNT/d/hard")" 2
  assert_eq "owner of small" "$(stat -c %u:%g:%a "$MNT/d/e/small")" "1234:2345:640"
  assert_eq "symlink" "$(readlink "$MNT/d/link")" "e/small"
  p=$(stat -c %b "$MNT/d/holes")
  [ "$p" -lt 4096 ] || fail "the holes file holds $p blocks: its holes were filled"
  if [ -s "$WORK/xattrs-before" ]; then
    assert_eq "xattrs and ACL" "$(getfattr -d -m - "$MNT/d/big" 2>/dev/null)" "$(cat "$WORK/xattrs-before")"
  fi
  unmount_fs "$MNT" || fail "unmount failed"
  rm "$dest/manifest.json"
  out=$(t "$BIN" volume import "$dest" again --servers "$ADDRS" 2>&1) && fail "an export without its manifest was imported"
  grep -q "no complete export" <<<"$out" || fail "the refusal does not say why: $out"
}

# (servers 2 × 256M, no mount) Export of an attached volume (`rmemfs admin export`) while a
# writer keeps making files: the export succeeds with the volume mounted, the writer sees no
# error (its changes only waited), and the export imported as a new volume holds every file
# the writer had finished before the export began, byte for byte.
test_volume_export_live() {
  local dest=$WORK/live-export out writer mnt2=$BASE/mnt/volume_export_live2 done_before
  mkdir -p "$mnt2"
  mount_fs "$MNT" "$ADDRS" --volume live --create || fail "mount --volume live --create failed"
  python3 mount-tests/live_export.py write "$MNT" "$WORK/finished" "$WORK/stop" \
    >"$WORK/writer.out" 2>&1 &
  writer=$!
  must_within 30 "the writer started" bash -c 'until [ "$(wc -l <"$1" 2>/dev/null)" -gt 20 ]; do sleep 0.1; done' _ "$WORK/finished"
  done_before=$(wc -l <"$WORK/finished")
  out=$(t "$BIN" admin export "$MNT" "$dest" 2>&1) || fail "admin export: $out"
  echo "$out" >&2
  grep -q "exported volume 'live' to $dest" <<<"$out" || fail "admin export said: $out"
  touch "$WORK/stop"
  wait "$writer" || fail "the writer failed during the export: $(cat "$WORK/writer.out")"
  cat "$WORK/writer.out" >&2
  out=$(t "$BIN" volume export live "$WORK/other" --servers "$ADDRS" 2>&1) && fail "a held volume was exported directly"
  grep -q "rmemfs admin export" <<<"$out" || fail "the refusal does not point to admin export: $out"
  out=$(t "$BIN" volume import "$dest" live-copy --servers "$ADDRS") || fail "import: $out"
  mount_fs "$mnt2" "$ADDRS" --volume live-copy || fail "mounting the imported copy failed"
  must "every file finished before the export, in the copy" \
    python3 mount-tests/live_export.py check "$mnt2" "$done_before"
  unmount_fs "$mnt2" || fail "unmount failed"
}

# (servers 2 × 256M, no mount) Export to S3-compatible storage and back: a volume exported
# to a bucket of moto_server (the Python package moto, on loopback), every server stopped,
# new ones started empty, the volume imported from the bucket: the same tree. A second export
# copies no chunk; an export whose manifest is gone is refused.
test_volume_export_s3() {
  local src=$WORK/src out port moto_pid bucket=rmemfs-test
  command -v moto_server >/dev/null || pip install -q "moto[server]" >&2 || true
  command -v moto_server >/dev/null || skip "moto_server (pip install 'moto[server]') is not installable here"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  moto_server -H 127.0.0.1 -p "$port" >"$WORK/moto.log" 2>&1 &
  moto_pid=$!
  # The servers started below are this subshell's: the runner knows only the first ones.
  # shellcheck disable=SC2064 # the pid is meant to be expanded now
  trap "kill $moto_pid 2>/dev/null || true; kill_servers \"\${TEST_PIDS[@]}\"" EXIT
  export AWS_ENDPOINT_URL=http://127.0.0.1:$port AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1
  must_within 30 "moto_server answers" bash -c 'until curl -sf "$1" >/dev/null; do sleep 0.2; done' _ "$AWS_ENDPOINT_URL"
  must "make the bucket" python3 -c 'import boto3, os, sys
boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).create_bucket(Bucket=sys.argv[1])' "$bucket"
  mkdir -p "$src/d/e"
  head -c 5000000 /dev/urandom >"$src/d/big"
  printf 'small\n' >"$src/d/e/small"
  ln "$src/d/e/small" "$src/d/hard"
  ln -s e/small "$src/d/link"
  mount_fs "$MNT" "$ADDRS" --volume s3v --create || fail "mount --volume s3v --create failed"
  must "cp -a" cp -a "$src/d" "$MNT/"
  unmount_fs "$MNT" || fail "unmount failed"
  export_twice s3v "s3://$bucket/backups/s3v"
  power_loss
  out=$(t "$BIN" volume import "s3://$bucket/backups/s3v" s3v --servers "$ADDRS" 2>&1) || fail "import from S3: $out"
  echo "$out" >&2
  mount_fs "$MNT" "$ADDRS" --volume s3v || fail "mounting the imported volume failed"
  compare_trees "$src/d" "$MNT/d" "the tree imported from S3"
  assert_eq "hard link count" "$(stat -c %h "$MNT/d/hard")" 2
  unmount_fs "$MNT" || fail "unmount failed"
  must "delete the manifest" python3 -c 'import boto3, os, sys
boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).delete_object(Bucket=sys.argv[1], Key=sys.argv[2])' "$bucket" backups/s3v/manifest.json
  out=$(t "$BIN" volume import "s3://$bucket/backups/s3v" again --servers "$ADDRS" 2>&1) && fail "an export without its manifest was imported"
  grep -q "no complete export" <<<"$out" || fail "the refusal does not say why: $out"
}
