# shellcheck shell=bash disable=SC2016 # '$1' in bash -c scripts is meant literally
# Real-mount tests of capacity: files larger than one server, a full pool (ENOSPC) and absurd
# sizes. Sourced by run.sh.

# (servers 64M + 64M) A 96 MiB file fits only because its chunks spread over both servers, and
# reads back intact.
test_larger_than_one_server() {
  dd if=/dev/urandom of="$WORK/big" bs=1M count=96 status=none
  must "write 96 MiB" cp "$WORK/big" "$MNT/big"
  drop_caches "$MNT" || fail "drop caches failed"
  assert_eq "size" "$(t stat -c %s "$MNT/big")" $((96 << 20))
  must "cmp 96 MiB" cmp "$WORK/big" "$MNT/big"
}

# (servers 32M + 32M) Filling the pool gives ENOSPC, not a hang or corruption: earlier data
# stays intact, and removing the big file frees its memory for new writes.
test_enospc() {
  local rc=0 sum got i
  head -c 1M /dev/urandom >"$WORK/small"
  must "write 1 MiB" cp "$WORK/small" "$MNT/small"
  sum=$(sha256sum <"$WORK/small")
  timeout -k 10 "$TMO" dd if=/dev/zero of="$MNT/big" bs=1M count=200 conv=fsync 2>"$WORK/dd.err" || rc=$?
  cat "$WORK/dd.err" >&2
  [ "$rc" -ne 0 ] || fail "dd of 200 MiB into a 64 MiB pool succeeded"
  is_timeout "$rc" && fail "dd into a full pool timed out after ${TMO}s"
  grep -q "No space left on device" "$WORK/dd.err" ||
    fail "dd failed (exit $rc) without 'No space left on device': $(head -c 200 "$WORK/dd.err" | tr '\n' ' ')"
  must "df on a full pool" df "$MNT"
  drop_caches "$MNT" || fail "drop caches failed"
  got=$(t cat "$MNT/small" | sha256sum) || fail "reading the 1 MiB file after ENOSPC failed"
  assert_eq "sha256 of the file written before the pool filled" "$got" "$sum"
  must "rm big" rm "$MNT/big"
  # Memory comes back when the kernel releases the file (asynchronously): retry for 10 s.
  dd if=/dev/urandom of="$WORK/new" bs=1M count=8 status=none
  for ((i = 0; ; i++)); do
    rc=0
    timeout -k 10 "$TMO" cp "$WORK/new" "$MNT/new" || rc=$?
    [ "$rc" -eq 0 ] && break
    is_timeout "$rc" && fail "writing 8 MiB after rm timed out"
    [ "$i" -lt 10 ] || fail "writing 8 MiB still fails 10 s after rm of the big file (exit $rc)"
    t rm -f "$MNT/new" || true
    sleep 1
  done
  drop_caches "$MNT" || fail "drop caches failed"
  must "cmp the 8 MiB file written after rm" cmp "$WORK/new" "$MNT/new"
}

# Sizes no pool could hold are refused at once, before anything is allocated:
# fallocate of 1 PiB (ENOSPC), a size past the largest file (EFBIG, also for truncate -s 8E,
# which coreutils itself refuses), and a write at offset 2^62 (EFBIG). The daemon's memory does
# not grow (it used to collect one entry per chunk and be OOM-killed), the file keeps its
# bytes, and the mount keeps serving.
test_absurd_sizes() {
  local pid rss0 rss1 sum got
  pid=$(daemon_pids "$MNT" | head -n 1)
  [ -n "$pid" ] || fail "no daemon process for $MNT"
  head -c 100000 /dev/urandom >"$WORK/f"
  must "write a file" cp "$WORK/f" "$MNT/f"
  sum=$(sha256sum <"$WORK/f")
  rss0=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
  must_fail "fallocate -l 1P" "No space left on device" fallocate -l 1P "$MNT/f"
  must_fail "fallocate past the largest file" "File too large" fallocate -o 7E -l 1M "$MNT/f"
  must_fail "truncate -s 8E" "" truncate -s 8E "$MNT/f"
  must_fail "truncate -s 7E" "File too large" truncate -s 7E "$MNT/f"
  must_fail "write at offset 2^62" "File too large" \
    dd if=/dev/zero of="$MNT/f" bs=4096 count=1 seek=$((1 << 50)) conv=notrunc status=none
  rss1=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
  log "daemon RSS ${rss0} KiB before, ${rss1} KiB after"
  [ "$rss1" -lt $((rss0 + 16384)) ] || fail "the daemon grew from ${rss0} to ${rss1} KiB"
  drop_caches "$MNT" || fail "drop caches failed"
  got=$(t cat "$MNT/f" | sha256sum) || fail "reading the file back failed"
  assert_eq "sha256 of the file after the refusals" "$got" "$sum"
  assert_eq "size after the refusals" "$(stat -c %s "$MNT/f")" 100000
  must "a 1 MiB fallocate still works" fallocate -l 1M "$MNT/g"
  assert_eq "size after fallocate" "$(stat -c %s "$MNT/g")" 1048576
}
