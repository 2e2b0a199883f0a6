# shellcheck shell=bash disable=SC2016 # '$1' in bash -c scripts is meant literally
# Real-mount tests of operations: copies set and servers added while mounted, rolling
# restarts, the mount helper, mounts by a user, the Debian package, metrics and systemd.
# Sourced by run.sh.

# (servers 3 × 256M, two copies) The copy count changed live (`rmemfs admin set-replicas`)
# while fio writes and verifies: 5 copies refused (4 at most); 3, then 1, reached by the
# background rebuild (stats: every chunk healthy at the count, none with extra copies, and a
# file's placement shows that many copies per chunk); fio ends with zero errors; every file
# reads back; the servers' used memory at one copy under half of what three held.
test_set_replicas() {
  local out st i total used3 used1 copies a
  seed_files 12
  start_fio_verify
  out=$(t "$BIN" admin set-replicas "$MNT" 5 2>&1) && fail "5 copies were accepted: $out"
  grep -q "between 1 and 4" <<<"$out" || fail "the refusal does not say why: $out"
  for copies in 3 1; do
    out=$(t "$BIN" admin set-replicas "$MNT" "$copies") || fail "set-replicas $copies: $out"
    log "$out"
    st=$(wait_copies "$copies" 120 "after set-replicas $copies")
    log "$(grep -E '^(chunks|rebuild)' <<<"$st")"
    must "f5 at $copies copies per chunk" \
      python3 mount-tests/placement_check.py "$MNT/f5" --copies "$copies"
    total=0
    for a in ${ADDRS//,/ }; do
      total=$((total + $(server_field "$a" 's["total_bytes"]')))
    done
    if [ "$copies" = 3 ]; then
      finish_fio_verify "the copy count raised from 2 to 3"
      used3=$((total - $(servers_free)))
    fi
  done
  check_files 12 "after the copy count went 2 -> 3 -> 1"
  # Copies let go of go back to their servers (asynchronously): poll.
  for ((i = 0; ; i++)); do
    used1=$((total - $(servers_free)))
    [ $((used1 * 2)) -lt "$used3" ] && break
    [ "$i" -lt 60 ] || fail "at one copy the servers still use $used1 bytes (three copies: $used3)"
    sleep 0.5
  done
  log "servers' used memory: $used3 bytes at three copies, $used1 at one"
}

# (servers 3 × 256M, two copies) A fourth server added to the live mount takes new chunks at
# once (it is the emptiest); `rmemfs admin rebalance`, run while fio writes and verifies,
# then moves copies until every server's used fraction (as the servers count it) is within
# 10% of the mean; every byte reads back, every chunk keeps two copies.
test_add_server() {
  local out fourth
  seed_files 12
  must "a 96 MiB file" dd if=/dev/urandom of="$MNT/big" bs=1M count=96 conv=fsync status=none
  start_server 256M || fail "a fourth server did not start"
  fourth=$SERVER_ADDR
  # This subshell's server: the runner does not know it.
  # shellcheck disable=SC2064 # the pid is meant to be expanded now
  trap "kill_servers $SERVER_PID" EXIT
  out=$(t "$BIN" admin add-server "$MNT" "$fourth") || fail "add-server: $out"
  log "$out"
  out=$(t "$BIN" admin add-server "$MNT" "$fourth" 2>&1) && fail "added twice: $out"
  must "write after add-server" dd if=/dev/urandom of="$MNT/new" bs=1M count=8 conv=fsync status=none
  all_chunks_on "$MNT/new" "$fourth" || fail "not every new chunk has a copy on the added server"
  # Small fio files: their layout alone would even the servers out (new chunks go to the
  # emptiest), leaving the rebalance nothing to move.
  RMEMFS_TEST_FIO_SIZE=16M start_fio_verify
  out=$(t "$BIN" admin rebalance "$MNT" 2>"$WORK/rebalance.progress") || fail "rebalance: $out"
  log "$out"
  grep -qE "rebalanced: [1-9][0-9]* chunk copies" <<<"$out" || fail "the rebalance moved nothing: $out"
  finish_fio_verify "a rebalance"
  must "every server within 10% of the mean used fraction" \
    python3 mount-tests/servers_balanced.py "$BIN" "$ADDRS,$fourth"
  wait_copies 2 30 "after the rebalance" >/dev/null
  check_files 12 "after the rebalance"
  must "cmp new" test -s "$MNT/new"
}

# (servers 3 × 256M, two copies) tools/rolling-restart.sh restarts every server (kill -9,
# then a new process on the same port) while fio writes and verifies: fio verifies, no sample
# of `stats --json` taken throughout shows a chunk short of two copies, every server is a new
# process at the end, and every byte reads back.
test_rolling_restart() {
  local restart=$WORK/restart.sh i a st
  i=0
  for a in ${ADDRS//,/ }; do
    echo "${TEST_PIDS[$i]}" >"$WORK/pid.$a"
    i=$((i + 1))
  done
  # The restarted servers are this subshell's: the runner knows only the first ones.
  trap 'for f in "$WORK"/pid.*; do kill -9 "$(cat "$f")" 2>/dev/null || true; done' EXIT
  write_restart_script "$restart" "$SHARED_SIZE"
  seed_files 12
  start_fio_verify
  start_copy_sampler
  must_within 300 "tools/rolling-restart.sh" env RMEMFS_BIN="$BIN" tools/rolling-restart.sh "$MNT" "$restart {}"
  finish_fio_verify "a rolling restart of every server"
  stop_copy_sampler "throughout the rolling restart"
  for a in ${ADDRS//,/ }; do
    { tr '\0' ' ' <"/proc/$(cat "$WORK/pid.$a")/cmdline"; } 2>/dev/null | grep -q " serve --listen $a " ||
      fail "the server at $a is not the restarted process"
  done
  wait_copies 2 30 "after the rolling restart" >/dev/null
  st=$(stats_field "$MNT" '",".join(sorted(x["addr"] for x in s["servers"] if x["state"] == "up"))') ||
    fail "stats --json failed"
  assert_eq "servers up after the restart" "$st" "$(tr ',' '\n' <<<"$ADDRS" | LC_ALL=C sort | paste -sd,)"
  check_files 12 "after the rolling restart"
}

# `mount -t rmemfs` and an fstab line (mount --fstab FILE -a) through the mount helper
# (/sbin/mount.rmemfs, a link to the binary, made here if missing and removed after): options
# that are rmemfs flags (servers=a+b, replicas=) and FUSE options pass, fstab-only ones
# (_netdev, nofail, x-systemd.*) are dropped; umount as usual.
test_mount_helper() {
  local m=$MNT helper=/sbin/mount.rmemfs made=0 servers
  if [ ! -e "$helper" ]; then
    ln -s "$(realpath "$BIN")" "$helper"
    made=1
  fi
  servers=${ADDRS//,/+}
  local rc=0
  (
    set -e
    must "mount -t rmemfs" mount -t rmemfs pool "$m" \
      -o "servers=$servers,replicas=2,allow_other,_netdev,nofail"
    is_mounted "$m" || fail "mount -t rmemfs did not mount"
    grep -q "^pool $m " /proc/mounts || fail "the source is not the fsname: $(grep " $m " /proc/mounts)"
    put "$m/f" "through the helper"
    assert_eq "read back" "$(get "$m/f")" "through the helper"
    unmount_fs "$m" || fail "umount failed"
    printf 'pool2 %s rmemfs servers=%s,nofail,_netdev,x-systemd.automount 0 0\n' "$m" "$servers" \
      >"$WORK/fstab"
    must "mount --fstab -a" mount --fstab "$WORK/fstab" -a
    is_mounted "$m" || fail "the fstab line did not mount"
    must "umount" umount "$m"
    wait_daemon_gone "$m" 10 || fail "the daemon outlived umount"
  ) || rc=$?
  [ "$made" -eq 0 ] || rm -f "$helper"
  return "$rc"
}

# A user's mount (through fusermount3, embedded server) with the default 8 MiB memlock limit
# writes 64 MiB: the tcp fabric registers what it cannot pin unpinned, counts it and says so
# once, instead of failing writes past the limit.
test_nonroot() {
  local dir=$WORK/user pool bin out
  local as_nobody=(prlimit --memlock=8388608:8388608 setpriv --reuid=65534 --regid=65534 --clear-groups)
  pool=$dir/pool
  bin=$dir/rmemfs
  chmod o+x "$BASE" "$BASE/work" "$WORK"
  mkdir -p "$pool"
  cp "$(realpath "$BIN")" "$bin"
  chmod 755 "$bin"
  chown -R 65534:65534 "$dir"
  # Where /dev/fuse is root-only (mode 0600, as on some machines), FUSE is the admin's to
  # grant (fusermount3 opens the device as the calling user): a user's mount is refused at
  # once, naming /dev/fuse and the grants; with a per-user ACL on the 0600 device it works.
  # The test makes the device so, and puts its mode and ACL back.
  local fuse_mode fuse_acl
  fuse_mode=$(stat -c %a /dev/fuse)
  fuse_acl=$(getfacl -p /dev/fuse 2>/dev/null)
  restore_fuse() { chmod "$fuse_mode" /dev/fuse; setfacl -b /dev/fuse; setfacl --set-file=- /dev/fuse <<<"$fuse_acl" || true; }
  setfacl -b /dev/fuse
  chmod 600 /dev/fuse
  if out=$(t "${as_nobody[@]}" "$bin" mount "$pool" --size 256M 2>&1); then
    restore_fuse
    fail "a user's mount with /dev/fuse at 0600 and no grant succeeded"
  fi
  grep -q "/dev/fuse (mode 0600" <<<"$out" && grep -q "setfacl -m u:USER:rw" <<<"$out" ||
    { restore_fuse; fail "the refusal does not name /dev/fuse's mode and the grants: $out"; }
  ! is_mounted "$pool" || { restore_fuse; fail "a refused mount left a mount behind"; }
  setfacl -m u:65534:rw /dev/fuse
  out=$(t "${as_nobody[@]}" "$bin" mount "$pool" --size 256M 2>&1) ||
    { restore_fuse; fail "a user's mount with /dev/fuse at 0600 and an ACL for that user: $out"; }
  restore_fuse
  is_mounted "$pool" || fail "the user's mount is not in the mount table"
  must "64 MiB of random bytes" dd if=/dev/urandom of="$dir/src" bs=1M count=64 status=none
  chmod 644 "$dir/src"
  must "64 MiB as nobody" "${as_nobody[@]}" dd if="$dir/src" of="$pool/big" bs=1M conv=fsync \
    status=none
  # Only its user reaches a mount made without allow_other (root included).
  assert_eq "size" "$("${as_nobody[@]}" stat -c %s "$pool/big")" 67108864
  must "drop caches" sh -c 'echo 3 >/proc/sys/vm/drop_caches'
  must "read back as nobody" "${as_nobody[@]}" cmp "$dir/src" "$pool/big"
  # (The embedded server registered 64 MiB of extents past the 8 MiB limit: unpinned. The
  # mount's own registrations may or may not pass the limit, so its counter may be 0.)
  out=$(t "${as_nobody[@]}" "$bin" stats "$pool" 2>&1) || fail "stats as nobody: $out"
  # The same figures for scripts: `stats --json` parses and counts the writes.
  out=$(t "${as_nobody[@]}" "$bin" stats --json "$pool" | python3 mount-tests/json_expr.py '
" ".join(map(str, [s["fabric"]["name"], s["fabric"]["bytes_written"] >= 64 << 20,
  type(s["fabric"]["unpinned_bytes"]) is int,
  s["requests"]["write"]["count"] > 0 and s["fabric_batches"]["read"]["count"] > 0,
  [x["state"] for x in s["servers"]]]))') ||
    fail "stats --json: $out"
  assert_eq "stats --json: fabric, bytes written, unpinned, writes, servers" "$out" \
    "tcp True True True ['up']"
  must "fusermount3 -u as nobody" "${as_nobody[@]}" fusermount3 -u "$pool"
  wait_daemon_gone "$pool" 10 || fail "the user's daemon outlived the unmount"
}

# The Debian package (tools/package.sh: cargo deb) holds the binary, the units, the man pages
# and the completions; installed, its mount helper mounts with `mount -t rmemfs`, and removing
# it takes the helper links away. Skips installing over an rmemfs package already there.
test_package() {
  local m=$MNT deb out f
  # cargo-deb, once per machine: a build of its own (minutes on two busy cores), so outside
  # the request timeout that bounds the packaging itself.
  if ! cargo deb --version >/dev/null 2>&1; then
    timeout -k 10 1800 cargo install cargo-deb --locked >"$WORK/cargo-deb.log" 2>&1 ||
      fail "installing cargo-deb: $(tail -n 5 "$WORK/cargo-deb.log")"
  fi
  deb=$(RMEMFS_PACKAGE_BIN=$BIN t tools/package.sh 2>"$WORK/package.log") || fail "tools/package.sh: $(tail -n 5 "$WORK/package.log")"
  [ -f "$deb" ] || fail "no package at '$deb'"
  out=$(dpkg-deb -c "$deb")
  for f in ./usr/bin/rmemfs ./lib/systemd/system/rmemfs-serve@.service \
    ./lib/systemd/system/rmemfs-mount@.service ./usr/share/man/man1/rmemfs.1.gz \
    ./usr/share/man/man1/rmemfs-mount.1.gz ./usr/share/man/man1/rmemfs-serve.1.gz \
    ./usr/share/bash-completion/completions/rmemfs ./usr/share/doc/rmemfs/examples/serve.env.example; do
    grep -q " $f\$" <<<"$out" || fail "the package lacks $f"
  done
  dpkg-deb --fsys-tarfile "$deb" | tar -xO ./usr/share/man/man1/rmemfs-mount.1.gz | zcat |
    grep -qF -- '\-\-servers' || fail "rmemfs-mount.1 does not document --servers"
  # Debian's own checks: nothing to report (overrides, each with its reason, are packaged).
  local lint
  lint=$(t lintian "$deb" 2>&1 | grep -E '^[EWIXP]: ' || true)
  [ -z "$lint" ] || fail "lintian reports: $(tr '\n' ' ' <<<"$lint")"
  if [ "$(dpkg-query -W -f='${Status}' rmemfs 2>/dev/null)" = "install ok installed" ]; then
    log "an rmemfs package is installed already: not installing over it"
    return 0
  fi
  must "dpkg -i" dpkg -i "$deb"
  local rc=0
  (
    set -e
    assert_eq "mount helper link" "$(readlink /sbin/mount.rmemfs)" /usr/bin/rmemfs
    must "rmemfs --version from the package" /usr/bin/rmemfs --version
    must "mount -t rmemfs (packaged helper)" mount -t rmemfs pool "$m" -o "servers=${ADDRS//,/+}"
    is_mounted "$m" || fail "mount -t rmemfs did not mount"
    grep -q "^pool $m " /proc/mounts || fail "not the packaged mount"
    assert_eq "the daemon's binary" "$(readlink "/proc/$(daemon_pids "$m" | head -n 1)/exe")" \
      /usr/bin/rmemfs
    put "$m/f" "packaged"
    assert_eq "read back" "$(get "$m/f")" "packaged"
    unmount_fs "$m" || fail "umount failed"
  ) || rc=$?
  must "dpkg -P" dpkg -P rmemfs
  [ ! -e /sbin/mount.rmemfs ] || fail "the mount helper link outlived the package"
  [ ! -e /usr/bin/rmemfs ] || fail "the binary outlived the package"
  return "$rc"
}

# free_port: a loopback TCP port nobody listens on now.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# The Prometheus endpoints of a memory server and of a mount (--metrics-listen) pass
# `promtool check metrics` and count the I/O just done; anything but GET /metrics is refused.
test_metrics() {
  local m=$MNT sport mport out
  sport=$(free_port)
  mport=$(free_port)
  start_server 64M --metrics-listen "127.0.0.1:$sport" || fail "serve --metrics-listen"
  # This subshell's server: the runner does not know it.
  # shellcheck disable=SC2064 # the pid is meant to be expanded now
  trap "kill_servers $SERVER_PID" EXIT
  mount_fs "$m" "$SERVER_ADDR" --metrics-listen "127.0.0.1:$mport" || fail "mount --metrics-listen"
  must "write" dd if=/dev/urandom of="$m/f" bs=1M count=8 conv=fsync status=none
  must "drop caches" sh -c 'echo 3 >/proc/sys/vm/drop_caches'
  must "read" cat "$m/f" >/dev/null
  for port in "$mport" "$sport"; do
    out=$(t curl -sf "http://127.0.0.1:$port/metrics") || fail "scrape of :$port"
    printf '%s\n' "$out" >"$WORK/metrics-$port.txt"
    t promtool check metrics <"$WORK/metrics-$port.txt" >"$WORK/promtool-$port.txt" 2>&1 ||
      fail "promtool check metrics (:$port): $(cat "$WORK/promtool-$port.txt")"
  done
  # The mount: requests by op, their latency histogram, bytes moved, the server up.
  out=$(cat "$WORK/metrics-$mport.txt")
  grep -Eq '^rmemfs_requests_total\{op="write"\} [1-9]' <<<"$out" || fail "no writes counted: $out"
  grep -Eq '^rmemfs_request_duration_seconds_bucket\{le="\+Inf",op="read"\} [1-9]' <<<"$out" ||
    fail "no read latency histogram: $(grep duration <<<"$out" | head -5)"
  grep -Eq '^rmemfs_fabric_batch_duration_seconds_count\{kind="read"\} [1-9]' <<<"$out" ||
    fail "no fabric read batches timed: $(grep batch_duration_seconds_count <<<"$out")"
  grep -Eq '^rmemfs_fabric_bytes_total\{direction="written"\} [1-9][0-9]{6,}' <<<"$out" ||
    fail "no bytes written counted: $(grep fabric_bytes <<<"$out")"
  grep -Eq "^rmemfs_server_up\{server=\"$SERVER_ADDR\"\} 1" <<<"$out" ||
    fail "the server is not up in the metrics: $(grep server_up <<<"$out")"
  # The server: its client, extents and memory in use.
  out=$(cat "$WORK/metrics-$sport.txt")
  grep -Eq '^rmemfs_serve_clients 1$' <<<"$out" || fail "server clients: $(grep clients <<<"$out")"
  grep -Eq '^rmemfs_serve_extents [1-9]' <<<"$out" || fail "server extents: $(grep extents <<<"$out")"
  grep -Eq '^rmemfs_serve_refused_secret_total 0$' <<<"$out" ||
    fail "server counters: $(grep refused <<<"$out")"
  assert_eq "a POST" "$(t curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$mport/metrics")" 405
  assert_eq "another path" "$(t curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$mport/")" 404
  unmount_fs "$m" || fail "umount"
}

# The systemd units in dist/systemd pass `systemd-analyze verify` (their paths pointed at this
# build and a scratch settings directory), and `rmemfs mount -f` tells $NOTIFY_SOCKET
# READY=1 once the mount is live, as Type=notify needs.
test_systemd() {
  local m=$MNT d=$WORK/units f out
  mkdir -p "$d"
  for f in rmemfs-serve@.service rmemfs-mount@.service mnt-pool.mount; do
    sed "s#/usr/bin/rmemfs#$(realpath "$BIN")#; s#/etc/rmemfs/#$d/#" "dist/systemd/$f" >"$d/$f"
  done
  cp dist/systemd/serve.env.example "$d/serve-a.env"
  cp dist/systemd/mount.env.example "$d/mount-a.env"
  cp "$d/rmemfs-serve@.service" "$d/rmemfs-serve@a.service"
  cp "$d/rmemfs-mount@.service" "$d/rmemfs-mount@a.service"
  out=$(t systemd-analyze verify "$d/rmemfs-serve@a.service" "$d/rmemfs-mount@a.service" \
    "$d/mnt-pool.mount" 2>&1) || fail "systemd-analyze verify: $out"
  out=$(t python3 mount-tests/notify_check.py "$BIN" "$m" "$ADDRS") ||
    fail "mount -f under NOTIFY_SOCKET: $out"
  assert_eq "notification, mounted when told, exit status" "$out" "READY=1 True 0"
}

# --- runner ----------------------------------------------------------------------------------
