# shellcheck shell=bash
# Real-mount tests of the library (rmemfs::library through its C ABI and Python package),
# beside real mounts of the same volume. Sourced by run.sh.

# LIB: the C ABI's shared object the Python package loads (built beside the binary).
library_so() {
  local so
  so=$(dirname "$BIN")/librmemfs_c.so
  [ -f "$so" ] || fail "$so is missing: build it with 'cargo build --release -p rmemfs-c'"
  echo "$so"
}

# (servers 2 × 256M, no mount) A program holds a volume through the Python package and
# writes files; a follower mount reads them back identical. A holder mount writes more; a
# program following it reads them back with read and read_many (64 ranges a file), is
# refused a write (EROFS), and a forked child's call fails with EBADF while the parent goes
# on. Then a program holding a volume is killed (SIGKILL) while it writes and fsyncs, three
# times: the volume mounted again has every file any round fsynced.
test_library() {
  local so src=$WORK/lsrc mnt2=$BASE/mnt/library2 out manifest=$WORK/lmanifest py pid base round
  so=$(library_so)
  py=(env RMEMFS_LIB="$so" python3 mount-tests/library_check.py)
  mkdir -p "$src" "$mnt2"
  for i in 1 2 3; do head -c $((i * 700000 + 13)) /dev/urandom >"$src/f$i"; done
  head -c 5 /dev/urandom >"$src/tiny"
  out=$(t "${py[@]}" hold "$ADDRS" lib "$src" 2>&1) || fail "the library's holder: $out"
  log "$out"
  mount_fs "$mnt2" "$ADDRS" --volume lib --read-only || fail "mount --read-only failed"
  for f in f1 f2 f3 tiny; do
    cmp -s "$src/$f" "$mnt2/lib/$f" || fail "the follower mount reads $f otherwise than the library wrote it"
  done
  unmount_fs "$mnt2" || fail "unmount of the follower failed"
  mount_fs "$MNT" "$ADDRS" --volume lib || fail "mount --volume lib failed"
  head -c 3000000 /dev/urandom >"$src/f4"
  must "cp f4" cp "$src/f4" "$MNT/lib/f4"
  must "sync" sync -f "$MNT/lib/f4"
  out=$(t "${py[@]}" follow "$ADDRS" lib "$src" 2>&1) || fail "the library's follower: $out"
  log "$out"
  unmount_fs "$MNT" || fail "unmount of the holder failed"
  # Killed while it writes, three times: every file any round fsynced is there.
  : >"$manifest"
  for round in 1 2 3; do
    base=$(wc -l <"$manifest")
    "${py[@]}" killed "$ADDRS" libk "$manifest" "$round" 2>"$WORK/killed.err" &
    pid=$!
    must_within 60 "round $round: the killed holder's first 20 fsyncs" bash -c \
      "until [ \$(cat '$manifest' 2>/dev/null | wc -l) -ge $((base + 20)) ]; do sleep 0.1; done"
    kill -9 "$pid"
    wait "$pid" 2>/dev/null || true
    mount_fs "$MNT" "$ADDRS" --volume libk || fail "round $round: mounting the killed holder's volume failed"
    out=$(t "${py[@]}" manifest "$MNT" "$manifest" 2>&1) || fail "round $round, after the kill: $out"
    log "round $round: $out"
    unmount_fs "$MNT" || fail "unmount failed"
  done
  t "$BIN" volume rm lib --servers "$ADDRS" >/dev/null || fail "volume rm lib failed"
  t "$BIN" volume rm libk --servers "$ADDRS" >/dev/null || fail "volume rm libk failed"
}

# (servers 2 × 256M, no mount) The C ABI from C: a program built against capi/include/rmemfs.h
# holds a volume, writes and reads back a file, lists its directory, and reads with
# rmemfs_read_many; a follower mount reads the file identical. Skipped (loudly) without a C
# compiler.
test_library_c() {
  local so dir cc_bin
  so=$(library_so)
  cc_bin=$(command -v cc || command -v gcc || true)
  [ -n "$cc_bin" ] || skip "no C compiler (cc): the C ABI is not checked from C"
  dir=$(dirname "$so")
  must "build the C program" "$cc_bin" -O1 -Wall -Werror -o "$WORK/libc_check" \
    mount-tests/library_check.c -Icapi/include -L"$dir" -lrmemfs_c -Wl,-rpath,"$dir"
  out=$(t "$WORK/libc_check" "$ADDRS" libc 2>&1) || fail "the C program: $out"
  log "$out"
  mount_fs "$MNT" "$ADDRS" --volume libc --read-only || fail "mount --read-only failed"
  must "the file the C program wrote" python3 -c 'import sys
d = open(sys.argv[1], "rb").read()
assert d == bytes(i * 7 % 251 for i in range(3 << 20)), len(d)' "$MNT/c/data"
  unmount_fs "$MNT" || fail "unmount failed"
  t "$BIN" volume rm libc --servers "$ADDRS" >/dev/null || fail "volume rm failed"
}
