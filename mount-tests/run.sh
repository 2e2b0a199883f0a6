#!/usr/bin/env bash
# shellcheck disable=SC2016 # '$1' in bash -c scripts is meant literally
# Real-mount tests: the release binary mounts rmemfs over memory servers started as local
# processes (loopback only), and ordinary programs (cp, rsync, tar, git, sqlite3, fio) run on it.
#
#   mount-tests/run.sh              # every test
#   mount-tests/run.sh git sqlite   # only the named tests
#
# Needs root and /dev/fuse; installs missing tools with apt (Debian). Settings (environment):
#   RMEMFS_BIN              binary (default target/release/rmemfs)
#   RMEMFS_TEST_TIMEOUT     limit in seconds for each command on the mount (default 120)
#   RMEMFS_MOUNT_ARGS       extra arguments for every `rmemfs mount`, e.g. "--chunk-size 1M"
#   RMEMFS_SERVE_ARGS       extra arguments for every `rmemfs serve`, e.g. "--fabric verbs"
#   RMEMFS_EXPECT_FABRIC    every mount must report this fabric (tcp, verbs) in `rmemfs stats`
#   RMEMFS_EXPECT_FUSE      every mount must be served this way (io_uring, /dev/fuse)
#   RMEMFS_TEST_SERVER_SIZE arena of each shared memory server (default 256M)
#   RMEMFS_TEST_FIO_SIZE    file size per fio job in fio_verify (default 64M; half that in
#                           backed_restart's rounds)
#   RMEMFS_TEST_BACKED_SIZE arena of each server in backed_restart (default 512M)
#   RMEMFS_TEST_KEEP        1: keep the temporary directory (logs) after the run
#
# Each test gets a fresh mount (and fresh servers where it kills or fills them), runs in a
# subshell under `set -e` with its output in a log, and prints `ok NAME` or `FAIL NAME: reason`
# (then the end of its log). The last line is `N passed, M failed, K skipped`; the exit status is non-zero
# when a test failed.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=mount-tests/lib.sh
. mount-tests/lib.sh
# shellcheck source=mount-tests/shared.sh
. mount-tests/shared.sh

SHARED_SIZE=${RMEMFS_TEST_SERVER_SIZE:-256M}

# --- tests -----------------------------------------------------------------------------------
# Variables every test sees: MNT (the mount point, mounted unless the test says otherwise),
# WORK (scratch on local disk), SRC (the source tree on local disk), ADDRS (the servers, comma
# separated) and TEST_PIDS (their PIDs, in the same order).

# cp -a and rsync -a put a mixed tree into rmemfs with every byte, mode, size, mtime, type and
# symlink intact, and cp -a brings it back out unchanged.
test_cp_tree() {
  must "cp -a into the mount" cp -a "$SRC" "$MNT/tree"
  drop_caches "$MNT" || fail "drop caches failed"
  compare_trees "$SRC" "$MNT/tree" "after cp -a into the mount"
  # Every file cp closed was written back at close, yet FLUSH reached the daemon at most once:
  # its ENOSYS tells the kernel to stop asking (nothing is left to flush there).
  t "$BIN" stats --json "$MNT" | python3 -c '
import json, sys
n = json.load(sys.stdin)["requests"].get("flush", {"count": 0})["count"]
print(f"FLUSH requests after cp -a: {n}", file=sys.stderr)
sys.exit(0 if n <= 1 else 1)' || fail "FLUSH was sent on every close"
  must "rsync -a into the mount" rsync -a "$SRC/" "$MNT/rsync/"
  drop_caches "$MNT" || fail "drop caches failed"
  compare_trees "$SRC" "$MNT/rsync" "after rsync -a into the mount"
  must "cp -a back out" cp -a "$MNT/tree" "$WORK/back"
  compare_trees "$SRC" "$WORK/back" "after cp -a back out"
  # `ls -lR` with cold caches: names and attributes come with the directory reads
  # (READDIRPLUS), not a LOOKUP per entry.
  local before after entries
  drop_caches "$MNT" || fail "drop caches failed"
  before=$(t "$BIN" stats --json "$MNT")
  entries=$(t ls -lR "$MNT/tree" | grep -c '^[-dl]') || fail "ls -lR failed"
  after=$(t "$BIN" stats --json "$MNT")
  python3 - "$before" "$after" "$entries" <<'PY' || fail "ls -lR took a lookup per entry"
import json, sys
b, a = (json.loads(x)["requests"] for x in sys.argv[1:3])
delta = lambda op: a.get(op, {"count": 0})["count"] - b.get(op, {"count": 0})["count"]
entries = int(sys.argv[3])
print(f"ls -lR of {entries} entries: {delta('readdirplus')} readdirplus, {delta('lookup')} lookups",
      file=sys.stderr)
sys.exit(0 if delta("readdirplus") > 0 and delta("lookup") < entries / 2 else 1)
PY
}

# A tar archive streamed into rmemfs is byte-identical to one made on local disk, extracts
# inside the mount into an identical tree, and a tree in the mount tars back out intact.
test_tar_roundtrip() {
  must "tar create into the mount" tar -C "$SRC" -cf "$MNT/t.tar" .
  must "tar create on local disk" tar -C "$SRC" -cf "$WORK/ref.tar" .
  drop_caches "$MNT" || fail "drop caches failed"
  must "archive in the mount equals the local one" cmp "$WORK/ref.tar" "$MNT/t.tar"
  must "mkdir x" mkdir "$MNT/x"
  must "tar extract inside the mount" tar -C "$MNT/x" -xf "$MNT/t.tar"
  drop_caches "$MNT" || fail "drop caches failed"
  compare_trees "$SRC" "$MNT/x" "tree extracted in the mount"
  must "tar create from the mount to local disk" tar -C "$MNT/x" -cf "$WORK/out.tar" .
  mkdir "$WORK/out"
  must "tar extract on local disk" tar -C "$WORK/out" -xf "$WORK/out.tar"
  compare_trees "$SRC" "$WORK/out" "tree tarred out of the mount"
}

# git's object store, index and ref updates (lock files, renames, fsync) work: two commits,
# a clean fsck before and after gc, a clean status, and a clone that matches the work tree.
test_git() {
  local r=$MNT/repo out n
  export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
  must "git init" git init -q "$r"
  must "git config user.name" git -C "$r" config user.name "rmemfs test"
  must "git config user.email" git -C "$r" config user.email "test@example.invalid"
  must "copy files into the repo" cp -a "$SRC/a" "$r/a"
  put "$r/README" "first"
  must "git add (1)" git -C "$r" add -A
  must "git commit (1)" git -C "$r" commit -q -m first
  must "append to README" bash -c 'echo second >>"$1"' _ "$r/README"
  must "git rm" git -C "$r" rm -q "a/file1.bin"
  must "add a file" cp "$SRC/e/big-5MiB.bin" "$r/big.bin"
  must "git add (2)" git -C "$r" add -A
  must "git commit (2)" git -C "$r" commit -q -m second
  out=$(t git -C "$r" log --oneline) || fail "git log failed"
  n=$(printf '%s\n' "$out" | grep -c .)
  assert_eq "commits in git log --oneline" "$n" 2
  must "git fsck --full" git -C "$r" fsck --full
  out=$(t git -C "$r" status --porcelain) || fail "git status failed"
  assert_eq "git status --porcelain" "$out" ""
  must "git gc" git -C "$r" gc -q
  must "git fsck --full after gc" git -C "$r" fsck --full
  must "git clone to local disk" git clone -q "$r" "$WORK/clone"
  must "clone matches the work tree" diff -r -x .git "$r" "$WORK/clone"
}

# sqlite's rollback journal and page writes work: 5000 rows inserted in one transaction pass
# integrity_check, the content equals a database built the same way on local disk, a rolled-back
# delete leaves all rows, and VACUUM keeps the database intact.
test_sqlite() {
  local db=$MNT/test.db ref=$WORK/ref.db sql=$WORK/insert.sql out
  {
    echo "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT NOT NULL);"
    echo "BEGIN;"
    seq 1 5000 | awk '{ printf "INSERT INTO t(v) VALUES (\x27row %d %s\x27);\n", $1, substr("abcdefghijklmnopqrstuvwxyz0123456789", 1 + $1 % 36) }'
    echo "COMMIT;"
  } >"$sql"
  must "build the reference db on local disk" sqlite3 "$ref" ".read $sql"
  must "create table + insert 5000 rows in a transaction" sqlite3 "$db" ".read $sql"
  drop_caches "$MNT" || fail "drop caches failed"
  out=$(t sqlite3 "$db" "PRAGMA integrity_check;") || fail "integrity_check failed to run"
  assert_eq "PRAGMA integrity_check" "$out" ok
  out=$(t sqlite3 "$db" "SELECT count(*) FROM t;") || fail "count failed to run"
  assert_eq "row count" "$out" 5000
  t sqlite3 "$ref" .dump >"$WORK/ref.dump" || fail "dump of the reference db failed"
  t sqlite3 "$db" .dump >"$WORK/db.dump" || fail "dump of the db in the mount failed"
  must "db content equals the reference" cmp "$WORK/ref.dump" "$WORK/db.dump"
  must "rolled-back delete" sqlite3 "$db" "BEGIN; DELETE FROM t; ROLLBACK;"
  out=$(t sqlite3 "$db" "SELECT count(*) FROM t;") || fail "count failed to run"
  assert_eq "row count after a rolled-back delete" "$out" 5000
  must "VACUUM" sqlite3 "$db" "VACUUM;"
  drop_caches "$MNT" || fail "drop caches failed"
  out=$(t sqlite3 "$db" "PRAGMA integrity_check;") || fail "integrity_check failed to run"
  assert_eq "PRAGMA integrity_check after VACUUM" "$out" ok
  must "exists: test.db-journal removed" bash -c '! test -e "$1-journal"' _ "$db"
}

# The POSIX corner cases programs rely on: rename over a file and across directories, directory
# rename, hard links sharing data, symlinks, truncate shrink/grow (grown part reads as zeros),
# append, unlink while open, rmdir of a non-empty dir, chmod, utimes, and user xattrs.
test_posix_cases() {
  local m=$MNT out

  # rename over an existing file replaces its content; the old name is gone
  put "$m/a" "content-a"
  put "$m/b" "content-b"
  must "rename a over b" mv -f "$m/a" "$m/b"
  assert_eq "b after rename over it" "$(get "$m/b")" "content-a"
  ! exists "$m/a" || fail "a still exists after rename"

  # rename into another directory
  must "mkdir d1 d2" mkdir "$m/d1" "$m/d2"
  put "$m/d1/f" "moved"
  must "rename into another dir" mv "$m/d1/f" "$m/d2/g"
  assert_eq "d2/g after rename" "$(get "$m/d2/g")" "moved"
  ! exists "$m/d1/f" || fail "d1/f still exists after rename"

  # mv of a directory (with content) to a new name inside another directory
  must "mkdir -p dir/sub" mkdir -p "$m/dir/sub"
  put "$m/dir/sub/f" "deep"
  must "mv of a directory" mv "$m/dir" "$m/d2/dir-moved"
  assert_eq "file inside a moved directory" "$(get "$m/d2/dir-moved/sub/f")" "deep"
  ! exists "$m/dir" || fail "dir still exists after mv"

  # hard link: two names, one inode, shared data
  put "$m/h1" "one"
  must "ln" ln "$m/h1" "$m/h2"
  assert_eq "link count after ln" "$(t stat -c %h "$m/h1")" 2
  put "$m/h2" "two"
  assert_eq "h1 after writing through h2" "$(get "$m/h1")" "two"
  must "append through h1" bash -c 'echo three >>"$1"' _ "$m/h1"
  assert_eq "h2 after appending through h1" "$(get "$m/h2")" $'two\nthree'
  must "rm h2" rm "$m/h2"
  assert_eq "link count after rm of the other name" "$(t stat -c %h "$m/h1")" 1
  assert_eq "h1 after rm h2" "$(get "$m/h1")" $'two\nthree'

  # symlink + readlink
  must "ln -s" ln -s h1 "$m/s1"
  assert_eq "readlink" "$(t readlink "$m/s1")" "h1"
  assert_eq "file type of a symlink" "$(t stat -c %F "$m/s1")" "symbolic link"
  assert_eq "read through a symlink" "$(get "$m/s1")" $'two\nthree'

  # truncate shrink and grow: compare with a local file that went through the same steps
  head -c 3000000 /dev/urandom >"$WORK/tr"
  must "copy tr" cp "$WORK/tr" "$m/tr"
  truncate -s 10000 "$WORK/tr"
  must "truncate shrink" truncate -s 10000 "$m/tr"
  assert_eq "size after shrink" "$(t stat -c %s "$m/tr")" 10000
  drop_caches "$m" || fail "drop caches failed"
  must "content after shrink" cmp "$WORK/tr" "$m/tr"
  truncate -s 2500000 "$WORK/tr"
  must "truncate grow" truncate -s 2500000 "$m/tr"
  assert_eq "size after grow" "$(t stat -c %s "$m/tr")" 2500000
  drop_caches "$m" || fail "drop caches failed"
  must "content after grow (zeros past the old end)" cmp "$WORK/tr" "$m/tr"

  # append with >> twice
  put "$m/ap" "l1"
  must "append l2" bash -c 'echo l2 >>"$1"' _ "$m/ap"
  must "append l3" bash -c 'echo l3 >>"$1"' _ "$m/ap"
  assert_eq "appended file" "$(get "$m/ap")" $'l1\nl2\nl3'

  # an unlinked file stays readable through an fd opened before the rm
  head -c 2000000 /dev/urandom >"$WORK/open"
  must "copy open" cp "$WORK/open" "$m/open"
  must "read an unlinked file through an open fd" bash -c '
    exec 3<"$1" && rm "$1" && ! test -e "$1" || exit 1
    echo 3 >/proc/sys/vm/drop_caches || exit 1
    cmp "$2" - <&3' _ "$m/open" "$WORK/open"
  ! exists "$m/open" || fail "open still exists after rm"

  # rmdir of a non-empty directory fails; after emptying it, it works
  must "mkdir ne" mkdir "$m/ne"
  put "$m/ne/f" "x"
  must_fail "rmdir of a non-empty directory" "Directory not empty" rmdir "$m/ne"
  exists "$m/ne/f" || fail "ne/f vanished after a failed rmdir"
  must "rm ne/f" rm "$m/ne/f"
  must "rmdir of the emptied directory" rmdir "$m/ne"
  ! exists "$m/ne" || fail "ne still exists after rmdir"

  # ls -la lists the entries
  out=$(t ls -la "$m") || fail "ls -la failed"
  grep -q ' h1$' <<<"$out" || fail "ls -la does not list h1"
  grep -q ' s1 -> h1$' <<<"$out" || fail "ls -la does not show the symlink s1 -> h1"

  # chmod and utimes are stored (checked again after dropping the kernel's caches)
  must "chmod 640" chmod 640 "$m/ap"
  must "touch -d @1000000000" touch -d @1000000000 "$m/ap"
  assert_eq "mode after chmod" "$(t stat -c %a "$m/ap")" 640
  assert_eq "mtime after touch -d" "$(t stat -c %Y "$m/ap")" 1000000000
  drop_caches "$m" || fail "drop caches failed"
  assert_eq "mode after chmod (uncached)" "$(t stat -c %a "$m/ap")" 640
  assert_eq "mtime after touch -d (uncached)" "$(t stat -c %Y "$m/ap")" 1000000000

  # user xattrs: set, get, list, remove
  if command -v setfattr >/dev/null 2>&1; then
    must "setfattr user.test" setfattr -n user.test -v hello "$m/ap"
    assert_eq "getfattr user.test" "$(t getfattr --only-values -n user.test "$m/ap")" "hello"
    out=$(t getfattr -d "$m/ap") || fail "getfattr -d failed"
    grep -q '^user.test="hello"$' <<<"$out" || fail "getfattr -d does not list user.test"
    must "setfattr -x user.test" setfattr -x user.test "$m/ap"
    must_fail "getfattr of a removed xattr" "" getfattr -n user.test "$m/ap"
  else
    echo "setfattr missing: xattr checks skipped" >&2
  fi
}

# Eight writers copying 8 MiB each at the same time don't corrupt each other's data.
test_concurrent_writers() {
  local i rc pids=()
  for ((i = 0; i < 8; i++)); do
    dd if=/dev/urandom of="$WORK/w$i" bs=1M count=8 status=none
  done
  for ((i = 0; i < 8; i++)); do
    timeout -k 10 "$TMO" cp "$WORK/w$i" "$MNT/w$i" &
    pids+=($!)
  done
  for ((i = 0; i < 8; i++)); do
    rc=0
    wait "${pids[i]}" || rc=$?
    [ "$rc" -eq 0 ] || fail "writer $i: cp exited $rc"
  done
  drop_caches "$MNT" || fail "drop caches failed"
  for ((i = 0; i < 8; i++)); do
    must "cmp w$i" cmp "$WORK/w$i" "$MNT/w$i"
  done
}

# fio writes with per-block checksums and verifies them: 4 KiB random writes by two jobs, then
# 1 MiB sequential writes; any verify error fails fio.
test_fio_verify() {
  local size=${RMEMFS_TEST_FIO_SIZE:-64M}
  must_within 300 "fio 4k randwrite + crc32c verify" \
    fio --name=v --directory="$MNT" --size="$size" --bs=4k --rw=randwrite --ioengine=psync \
    --verify=crc32c --do_verify=1 --verify_fatal=1 --numjobs=2 --group_reporting
  must_within 300 "fio 1M sequential write + crc32c verify" \
    fio --name=s --directory="$MNT" --size="$size" --bs=1M --rw=write --ioengine=psync \
    --verify=crc32c --do_verify=1 --verify_fatal=1 --numjobs=2 --group_reporting
}

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

# A memory server started with a shared secret (`rmemfs keygen`, mode 0600) lets a mount in
# only with the same secret: without one, or with another, the mount fails at once with a
# message naming the server and the cause, leaves nothing mounted, and the server logs the
# refusal with the peer's address; with it, the mount works.
test_secret() {
  local addr pid
  must "rmemfs keygen" "$BIN" keygen "$WORK/secret"
  must "rmemfs keygen (another)" "$BIN" keygen "$WORK/other"
  assert_eq "mode of the secret file" "$(stat -c %a "$WORK/secret")" 600
  must_fail "keygen over an existing file" "exists" "$BIN" keygen "$WORK/secret"
  start_server 64M --secret-file "$WORK/secret" || fail "a server with a secret did not start"
  addr=$SERVER_ADDR
  pid=$SERVER_PID
  # "Fails at once": within 5 s (a handshake on loopback takes milliseconds).
  must_fail_within 5 "mount without the secret" "$addr requires a shared secret" \
    env -u RMEMFS_SECRET_FILE "$BIN" mount "$MNT" --servers "$addr"
  must_fail_within 5 "mount with another secret" "$addr does not hold this mount's secret" \
    "$BIN" mount "$MNT" --servers "$addr" --secret-file "$WORK/other"
  ! is_mounted "$MNT" || fail "a refused mount is mounted"
  grep -q "127.0.0.1.*gave up" "$SERVER_LOG" || fail "the server did not log the refusals"
  # The secret from the environment, as a systemd unit or fstab line would pass it.
  RMEMFS_SECRET_FILE=$WORK/secret mount_fs "$MNT" "$addr" || fail "mount with the secret failed"
  put "$MNT/f" "hello"
  drop_caches "$MNT" || fail "drop caches failed"
  assert_eq "read back" "$(get "$MNT/f")" "hello"
  # The server counted both refused mounts and the stats query without the secret (its
  # counters need its secret).
  must_fail "server stats without the secret" "requires a shared secret" \
    env -u RMEMFS_SECRET_FILE "$BIN" stats --server "$addr"
  # The refused clients exit before the server has read their refusal: give it 10 s.
  for _ in $(seq 50); do
    "$BIN" stats --server "$addr" --secret-file "$WORK/secret" >"$WORK/server-stats" ||
      fail "server stats with the secret failed"
    ! grep -qx "  handshakes refused: secrets differ: 3" "$WORK/server-stats" || break
    sleep 0.2
  done
  grep -qx "  handshakes refused: secrets differ: 3" "$WORK/server-stats" ||
    fail "the server did not count the three refusals: $(cat "$WORK/server-stats")"
  grep -qx "  clients 1, extents [1-9][0-9]*" "$WORK/server-stats" ||
    fail "the server does not show the mount and its extents: $(cat "$WORK/server-stats")"
  unmount_fs "$MNT" || fail "unmount failed"
  kill_servers "$pid"
}

# (servers 128M + 128M, one copy of each chunk) Killing one server fails reads of the data it held with EIO, quickly and
# without hanging; files on the surviving server still read back intact; metadata, new writes
# and unmount still work. File sizes alternate 1 and 2 MiB: with chunks placed on the server
# with the most free memory they alternate between the two equal servers, so every 2 MiB file
# touches both servers while the 1 MiB files land on one or the other; the test thus sees both
# lost and surviving files whichever way placement breaks ties.
test_server_death() {
  local i rc ok=0 eio=0 out n
  for ((i = 0; i < 20; i++)); do
    dd if=/dev/urandom of="$WORK/f$i" bs=1M count=$((1 + i % 2)) status=none
    must "write f$i" cp "$WORK/f$i" "$MNT/f$i"
  done
  must "sync" sync -f "$MNT"
  is_our_server "${TEST_PIDS[1]}" || fail "the second server is not running before the kill"
  kill -KILL "${TEST_PIDS[1]}"
  drop_caches "$MNT" || fail "drop caches failed"
  # EIO "within the op timeout" (10 s here): each read gets that plus a 5 s margin.
  for ((i = 0; i < 20; i++)); do
    rc=0
    timeout -k 5 15 cat "$MNT/f$i" >/dev/null 2>"$WORK/err$i" || rc=$?
    if [ "$rc" -eq 0 ]; then
      must "cmp surviving f$i" cmp "$WORK/f$i" "$MNT/f$i"
      ok=$((ok + 1))
    elif is_timeout "$rc"; then
      fail "reading f$i took over 15 s (the op timeout, 10 s, and a 5 s margin) after the server died"
    elif grep -q "Input/output error" "$WORK/err$i"; then
      eio=$((eio + 1))
    else
      fail "reading f$i failed with an unexpected error (exit $rc): $(head -c 200 "$WORK/err$i")"
    fi
  done
  echo "after the kill: $ok files readable, $eio failed with EIO" >&2
  [ "$eio" -ge 1 ] || fail "no read failed with EIO after a server died ($ok of 20 readable)"
  [ "$ok" -ge 1 ] || fail "no file stayed readable after one of two servers died ($eio EIO)"
  out=$(t ls -l "$MNT") || fail "ls -l after the server died failed"
  n=$(grep -c ' f[0-9]*$' <<<"$out" || true)
  assert_eq "files listed by ls -l after the server died" "$n" 20
  head -c 1M /dev/urandom >"$WORK/after"
  must "write a new file after the server died" cp "$WORK/after" "$MNT/after"
  drop_caches "$MNT" || fail "drop caches failed"
  must "cmp the new file" cmp "$WORK/after" "$MNT/after"
  unmount_fs "$MNT" || fail "unmount after the server died failed"
}

# (servers 3 × 256M, two copies of every chunk) A memory server killed (-9) while fio writes
# and verifies costs nothing: fio finishes with zero verify errors and zero EIO, every file
# written before reads back intact, `stats` shows the server down and no chunk lost, and new
# files get both copies on the servers left. The rebuild then restores every second copy
# (`stats`: nothing degraded), after which a second server may die with every file intact.
test_replica_failover() {
  local st
  seed_files 12
  start_fio_verify
  is_our_server "${TEST_PIDS[1]}" || fail "the second server is not running before the kill"
  kill -KILL "${TEST_PIDS[1]}"
  log "killed server 2 of 3 while fio was writing"
  finish_fio_verify "one of three servers killed"
  check_files 12 "after the kill"
  head -c 3M /dev/urandom >"$WORK/after"
  must "write a new file after the kill" cp "$WORK/after" "$MNT/after"
  drop_caches "$MNT" || fail "drop caches failed"
  must "cmp the new file" cmp "$WORK/after" "$MNT/after"
  st=$(t "$BIN" stats "$MNT") || fail "rmemfs stats failed"
  log "$(grep -E '^(server|chunks)' <<<"$st")"
  grep -q ": DOWN, since" <<<"$st" || fail "stats does not show the killed server down"
  grep -qE "^chunks: 2 copies each; .* lost 0$" <<<"$st" ||
    fail "stats: $(grep '^chunks' <<<"$st")"
  # The background rebuild restores the second copy of everything on the two servers left.
  st=$(wait_copies 2 60 "after the kill")
  log "$(grep -E '^(chunks|rebuild)' <<<"$st")"
  # So a second server may die too: every chunk still has a copy on the third.
  is_our_server "${TEST_PIDS[2]}" || fail "the third server is not running"
  kill -KILL "${TEST_PIDS[2]}"
  drop_caches "$MNT" || fail "drop caches failed"
  for ((i = 0; i < 12; i++)); do
    must "cmp f$i after a second kill" cmp "$WORK/f$i" "$MNT/f$i"
  done
  must "cmp the new file after a second kill" cmp "$WORK/after" "$MNT/after"
}

# (servers 3 × 256M, two copies) The copy count changed live (`rmemfs admin set-replicas`)
# while fio writes and verifies: 4 copies refused (3 at most); 3, then 1, reached by the
# background rebuild (stats: every chunk healthy at the count, none with extra copies, and a
# file's placement shows that many copies per chunk); fio ends with zero errors; every file
# reads back; the servers' used memory at one copy under half of what three held.
test_set_replicas() {
  local out st i total used3 used1 copies a
  seed_files 12
  start_fio_verify
  out=$(t "$BIN" admin set-replicas "$MNT" 4 2>&1) && fail "4 copies were accepted: $out"
  grep -q "between 1 and 3" <<<"$out" || fail "the refusal does not say why: $out"
  for copies in 3 1; do
    out=$(t "$BIN" admin set-replicas "$MNT" "$copies") || fail "set-replicas $copies: $out"
    log "$out"
    st=$(wait_copies "$copies" 120 "after set-replicas $copies")
    log "$(grep -E '^(chunks|rebuild)' <<<"$st")"
    must "f5 at $copies copies per chunk" python3 -c 'import json, os, sys
p = json.loads(os.getxattr(sys.argv[1], "user.rmemfs.placement"))
bad = [c for c in p if len(c[1]) != int(sys.argv[2])]
sys.exit(f"chunks with another count: {bad}" if bad else 0)' "$MNT/f5" "$copies"
    total=0
    for a in ${ADDRS//,/ }; do
      total=$((total + $(t "$BIN" stats --server "$a" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["total_bytes"])')))
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
  must "every server within 10% of the mean used fraction" python3 -c 'import json, subprocess, sys
used = []
for a in sys.argv[2].split(","):
    s = json.loads(subprocess.run([sys.argv[1], "stats", "--server", a, "--json"], check=True,
                                  capture_output=True).stdout)
    used.append((s["total_bytes"] - s["free_bytes"]) / s["total_bytes"])
mean = sum(used) / len(used)
print("used fractions", ["%.3f" % u for u in used], "mean %.3f" % mean)
sys.exit(0 if all(abs(u - mean) <= 0.1 * mean for u in used) else "not within 10% of the mean")' \
    "$BIN" "$ADDRS,$fourth"
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
  st=$(t "$BIN" stats --json "$MNT")
  python3 -c 'import json, sys
s = json.loads(sys.argv[1])["servers"]
up = sorted(x["addr"] for x in s if x["state"] == "up")
sys.exit(0 if up == sorted(sys.argv[2].split(",")) else f"servers up after the restart: {up}")' "$st" "$ADDRS" ||
    fail "not every server is back in the mount"
  check_files 12 "after the rolling restart"
}

# (its own three 512 MiB servers with --backing; no mount) Backed memory servers keep what they lent
# across a restart. A volume with two copies: one server restarted in place while the mount is
# quiet (SIGTERM) comes back with its extents and nothing is copied. Then tools/rolling-restart.sh
# restarts every server in place (SIGKILL) while fio writes and verifies and a volume writer fsyncs: fio verifies, every
# server's session is resumed (none admitted empty) and only chunks written while their
# server was away are copied (counted by the tool). Then the daemon and every server are
# killed (SIGKILL) and started again: the volume attaches, every fsynced file and state is
# there, and nothing is rebuilt.
test_backed_restart() {
  local addrs="" i a out writer manifest=$WORK/manifest copied mlog
  local writer_py=$PWD/mount-tests/volume_writer.py restart=$WORK/restart.sh bdir
  local size=${RMEMFS_TEST_BACKED_SIZE:-512M} fio_mib
  fio_mib=$(($(numfmt --from=iec "${RMEMFS_TEST_FIO_SIZE:-64M}") / 2097152))
  : >"$manifest"
  # The files on tmpfs where there is one (as persistent memory would be); the benchmark
  # measures a disk file's cost.
  bdir=$WORK
  [ -d /dev/shm ] && bdir=$(mktemp -d /dev/shm/rmemfs-backed.XXXXXX)
  for i in 0 1 2; do
    start_server "$size" --backing "$bdir/backing.$i" || fail "a backed server did not start"
    addrs+=${addrs:+,}$SERVER_ADDR
    echo "$SERVER_PID" >"$WORK/pid.$SERVER_ADDR"
    echo "--backing $bdir/backing.$i" >"$WORK/args.$SERVER_ADDR"
  done
  # shellcheck disable=SC2064 # the directory is meant to be expanded now
  trap 'for f in "$WORK"/pid.*; do kill -9 "$(cat "$f")" 2>/dev/null || true; done; '"rm -rf ${bdir@Q}/backing.*; [ ${bdir@Q} = ${WORK@Q} ] || rmdir ${bdir@Q}" EXIT
  ADDRS=$addrs
  write_restart_script "$restart" "$size"
  mlog=$WORK/daemon.log
  # A restart in place is caught up, not rebuilt around, when the server is back within the
  # mount's rebuild delay: that is the claim here, so the delay is set above the slowest
  # restart seen (about 9 s under the rxe VM's TCG, where locking a 160 MiB arena alone takes
  # that long) rather than left at its 5 s default.
  mount_fs "$MNT" "$addrs" --volume bk --create --replicas 2 --rebuild-delay 20 --log-file "$mlog" ||
    fail "mount --volume bk --create failed"
  seed_files 12
  must "fsync the seeded files" python3 -c 'import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY); os.fsync(fd); os.close(fd)' "$MNT"/f* "$MNT"

  # Quiet: a restart in place (SIGTERM, as `systemctl restart` sends) copies nothing.
  echo TERM >"$WORK/signal"
  a=${addrs%%,*}
  out=$(timeout -k 10 300 env RMEMFS_BIN="$BIN" tools/rolling-restart.sh "$MNT" "$restart {}" 2>&1 >/dev/null) ||
    fail "rolling restart (quiet): $out"
  log "$out"
  grep -q "^rolling-restart: $a: backed; restarting in place" <<<"$out" || fail "not restarted in place: $out"
  [ "$(grep -c "with its extents; 0 chunks written while it was away copied again" <<<"$out")" = 3 ] ||
    fail "a quiet restart copied chunks: $out"
  grep -q "restored [1-9][0-9]* extents" "$WORK/serve-$a.err" || fail "the restarted server restored nothing: $(head -3 "$WORK/serve-$a.err")"

  # Under load: fio writes and verifies round after round, the writer fsyncs, and every
  # server is killed (SIGKILL, as a crash) and started again.
  rm -f "$WORK/signal"
  (
    n=0
    while [ ! -e "$WORK/fio-stop" ]; do
      n=$((n + 1))
      timeout -k 10 300 fio --name="v$n" --directory="$MNT" --size="${fio_mib}M" --bs=64k --rw=randwrite \
        --ioengine=psync --verify=crc32c --do_verify=1 --verify_fatal=1 --numjobs=2 \
        --group_reporting >"$WORK/fio.$n.out" 2>&1 || { echo "$n" >"$WORK/fio-failed"; break; }
      rm -f "$MNT/v$n".*
    done
    echo "$n" >"$WORK/fio-rounds"
  ) &
  FIO_PID=$!
  python3 "$writer_py" write "$MNT" "$manifest" 7 2>"$WORK/writer.err" &
  writer=$!
  out=$(timeout -k 10 300 env RMEMFS_BIN="$BIN" tools/rolling-restart.sh "$MNT" "$restart {}" 2>&1 >/dev/null) ||
    fail "rolling restart under load: $out"
  log "$out"
  touch "$WORK/fio-stop"
  wait "$FIO_PID" || true
  [ ! -e "$WORK/fio-failed" ] || fail "fio round $(cat "$WORK/fio-failed") failed: $(tail -5 "$WORK/fio.$(cat "$WORK/fio-failed").out")"
  ! grep -qiE "verify.*(bad|fail)|Input/output error" "$WORK"/fio.*.out || fail "fio errors during the rolling restart"
  [ "$(cat "$WORK/fio-rounds")" -ge 2 ] || fail "fio ran $(cat "$WORK/fio-rounds") rounds: the restarts may have missed it"
  log "fio rounds verified across the rolling restart: $(cat "$WORK/fio-rounds")"
  [ "$(grep -c "with its extents; [0-9]* chunks written while it was away copied again" <<<"$out")" = 3 ] ||
    fail "not every server came back with its extents: $out"
  copied=$(grep -o "[0-9]* chunks written while it was away" <<<"$out" | awk '{n += $1} END {print n}')
  log "chunks copied again over the loaded rolling restart: $copied"
  [ "$copied" -gt 0 ] || fail "fio wrote throughout, yet no chunk written while its server was away was counted as copied"
  [ "$(grep -c "session resumed" "$mlog")" -ge 6 ] || fail "the mount did not resume every session: $(grep -E "is back" "$mlog" | tail -6)"
  ! grep -q "admitting it empty" "$mlog" || fail "a backed server came back empty: $(grep "admitting it empty" "$mlog")"
  check_files 12 "after the rolling restarts"

  # Everything stops at once (SIGKILL), starts again, and the volume attaches.
  kill -9 "$(daemon_pids "$MNT")" 2>/dev/null
  wait_daemon_gone "$MNT" 20 || fail "the daemon outlived its kill"
  wait "$writer" || true
  for a in ${addrs//,/ }; do kill -9 "$(cat "$WORK/pid.$a")"; done
  for a in ${addrs//,/ }; do
    "$restart" "$a" || fail "$a did not start again"
  done
  mount_fs "$MNT" "$addrs" --volume bk --replicas 2 --rebuild-delay 20 --log-file "$WORK/daemon2.log" ||
    fail "the volume did not attach after everything stopped"
  if ! out=$(t python3 "$writer_py" check "$MNT" "$manifest"); then
    # What the writer and the two daemons said, for the one who reads the failure.
    log "$(cat "$WORK/writer.err")"
    grep -hE "WARN|ERROR" "$mlog" "$WORK/daemon2.log" | tail -40 >&2
    fail "after the stop of everything: $out"
  fi
  log "writer: $out; $(cat "$WORK/writer.err")"
  check_files 12 "after every server and the daemon stopped"
  wait_copies 2 30 "after the restart of everything" >/dev/null
  out=$(t "$BIN" stats --json "$MNT" | python3 -c 'import json, sys; print(json.load(sys.stdin)["rebuild"]["chunks_rebuilt"])')
  assert_eq "chunks rebuilt after the restart of everything" "$out" 0
  unmount_fs "$MNT" || fail "unmount failed"
  t "$BIN" volume rm bk --servers "$addrs" >/dev/null || fail "volume rm failed"
}

# (servers 3 × 256M, two copies, --op-timeout=2) A memory server frozen (SIGSTOP) for longer
# than failure detection while fio writes and verifies: operations waiting on it move to the
# other copies once detection gives it up, fio finishes with zero errors, and after the thaw
# the mount still works, nothing is lost and the rebuild restores every second copy.
test_replica_freeze() {
  local i st
  seed_files 6
  start_fio_verify
  is_our_server "${TEST_PIDS[1]}" || fail "the second server is not running before the freeze"
  kill -STOP "${TEST_PIDS[1]}"
  log "froze server 2 of 3 while fio was writing"
  # "A pause of at most the detection time": a write of new data (two copies, so a frozen
  # server holds some of them) finishes within the detection time (2 s) and a 3 s margin.
  must_within 5 "a 4 MiB write right after the freeze" \
    dd if=/dev/urandom of="$MNT/during-freeze" bs=1M count=4 conv=fsync status=none
  # Frozen for twice the detection time (2 s), as a paused VM or a stuck host would be.
  sleep 4
  check_files 6 "while a server is frozen"
  kill -CONT "${TEST_PIDS[1]}"
  finish_fio_verify "across a server freeze"
  st=$(wait_copies 2 60 "after the freeze")
  log "$(grep -E '^(server|chunks|rebuild)' <<<"$st")"
  grep -qE "down [1-9][0-9]* times" <<<"$st" || fail "stats does not show the frozen server given up on"
  check_files 6 "after the thaw"
}

# (servers 2, two copies) One of two memory servers killed during fio write-and-verify: zero
# errors, every file intact from the copy left; `stats` shows it down and nothing lost.
test_replica_pair() {
  local st
  seed_files 6
  start_fio_verify 2048
  is_our_server "${TEST_PIDS[0]}" || fail "the first server is not running before the kill"
  kill -KILL "${TEST_PIDS[0]}"
  log "killed server 1 of 2 while fio was writing"
  finish_fio_verify "one of two servers killed"
  check_files 6 "after the kill"
  st=$(t "$BIN" stats "$MNT") || fail "rmemfs stats failed"
  log "$(grep -E '^(server|chunks)' <<<"$st")"
  grep -q ": DOWN, since" <<<"$st" || fail "stats does not show the killed server down"
  grep -qE "^chunks: 2 copies each; .* lost 0$" <<<"$st" || fail "stats: $(grep '^chunks' <<<"$st")"
}

# Unmount stops the daemon, leaves nothing mounted and gives the servers' memory back at once
# (a goodbye, not a 30 s lease: a second mount fills the same server right after); mounting
# on a missing directory or over an unreachable server fails with a message instead of
# hanging or leaving a mount behind.
test_unmount_cleanup() {
  local rc round m2=$BASE/mnt/unreachable missing=$WORK/does-not-exist
  start_server 64M || fail "a server did not start"
  # This subshell's server: the runner does not know it.
  # shellcheck disable=SC2064 # the pid is meant to be expanded now
  trap "kill_servers $SERVER_PID" EXIT
  for round in 1 2; do
    mount_fs "$MNT" "$SERVER_ADDR" || fail "mount $round failed"
    [ -n "$(daemon_pids "$MNT")" ] ||
      fail "no process has '$BIN_NAME mount $MNT' in its command line while mounted"
    must "mount $round: 48 MiB into a 64 MiB server" \
      dd if=/dev/zero of="$MNT/f" bs=1M count=48 conv=fsync status=none
    must "umount $round" umount "$MNT"
    wait_daemon_gone "$MNT" 10 ||
      fail "daemon still running 10 s after umount: $(daemon_pids "$MNT" | tr '\n' ' ')"
    rc=0
    timeout -k 5 10 mountpoint -q "$MNT" || rc=$?
    [ "$rc" -ne 0 ] || fail "$MNT is still a mount point after umount"
    is_timeout "$rc" && fail "mountpoint on $MNT hung after umount"
  done
  ! grep -q "left without goodbye" "$SERVER_LOG" ||
    fail "an unmounted daemon left without a goodbye: $(grep "left without goodbye" "$SERVER_LOG")"

  rc=0
  timeout -k 5 30 "$BIN" mount "$missing" --servers "$ADDRS" "${MOUNT_ARGS[@]}" \
    >"$WORK/missing.out" 2>"$WORK/missing.err" </dev/null || rc=$?
  cat "$WORK/missing.err" >&2
  if [ "$rc" -eq 0 ]; then
    fail "mount on a missing directory succeeded"
  fi
  is_timeout "$rc" && fail "mount on a missing directory did not return within 30 s"
  [ -s "$WORK/missing.err" ] || fail "mount on a missing directory failed (exit $rc) without a message on stderr"
  wait_daemon_gone "$missing" 5 || fail "a daemon for the missing directory is left running"

  mkdir -p "$m2"
  rc=0
  timeout -k 5 30 "$BIN" mount "$m2" --servers 127.0.0.1:1 "${MOUNT_ARGS[@]}" \
    >"$WORK/unreach.out" 2>"$WORK/unreach.err" </dev/null || rc=$?
  cat "$WORK/unreach.err" >&2
  [ "$rc" -ne 0 ] || fail "mount with an unreachable server (127.0.0.1:1) succeeded"
  is_timeout "$rc" && fail "mount with an unreachable server did not fail within 30 s"
  [ -s "$WORK/unreach.err" ] || fail "mount with an unreachable server failed (exit $rc) without a message on stderr"
  ! is_mounted "$m2" || fail "mount with an unreachable server left $m2 mounted"
  wait_daemon_gone "$m2" 5 || fail "mount with an unreachable server left a daemon running"
}

# The daemon's death leaves a clear state: after kill -9 the kernel answers ENOTCONN at the
# mount point, and `rmemfs mount` there detaches the dead mount (saying so) and mounts; a
# mount point with a live mount is refused, naming --force, and --force detaches it. A
# SIGTERM refused by open files (EBUSY) leaves the mount serving; a second one detaches it
# and the daemon exits within a few seconds.
test_daemon_death() {
  local pid out rc i dlog=$WORK/daemon.log
  mount_fs "$MNT" "$ADDRS" || fail "mount failed"
  put "$MNT/before" "lost with the daemon"
  pid=$(daemon_pids "$MNT")
  [ -n "$pid" ] || fail "no daemon for $MNT"
  kill -9 $pid
  wait_daemon_gone "$MNT" 10 || fail "the daemon outlived kill -9"
  # The kernel tears the connection down once the daemon's io_uring queues are cancelled,
  # which can finish after the process is gone: a stat waiting then is ended with
  # ECONNABORTED ("Software caused connection abort"). Every later one must be ENOTCONN.
  for ((i = 0; i < 50; i++)); do
    rc=0
    out=$(timeout -k 5 10 stat "$MNT" 2>&1) || rc=$?
    grep -q "Software caused connection abort" <<<"$out" || break
    sleep 0.2
  done
  grep -q "Transport endpoint is not connected" <<<"$out" ||
    fail "after kill -9 the mount point answers something else than ENOTCONN (exit $rc): $out"
  out=$(t "$BIN" mount "$MNT" --servers "$ADDRS" "${MOUNT_ARGS[@]}" --log-file "$dlog" 2>&1 </dev/null) ||
    fail "mount over a dead rmemfs mount: $out"
  grep -q "whose daemon is gone" <<<"$out" || fail "the mount did not say it cleaned up: $out"
  assert_eq "mounts at $MNT" "$(awk -v m="$MNT" '$2 == m' /proc/self/mounts | wc -l)" 1
  put "$MNT/after" "served again"
  assert_eq "a file on the new mount" "$(get "$MNT/after")" "served again"

  # A live mount is not taken over without --force.
  rc=0
  out=$(t "$BIN" mount "$MNT" --servers "$ADDRS" "${MOUNT_ARGS[@]}" 2>&1 </dev/null) || rc=$?
  [ "$rc" -ne 0 ] || fail "a second mount over a live one succeeded"
  grep -q -- "--force" <<<"$out" || fail "the refusal does not name --force: $out"
  assert_eq "the live mount still serves" "$(get "$MNT/after")" "served again"

  # SIGTERM with a file open: EBUSY, still serving; the second one detaches and exits.
  pid=$(daemon_pids "$MNT")
  exec 7<"$MNT/after"
  kill -TERM $pid
  wait_log "$dlog" "unmount failed" 10 || { exec 7<&-; fail "no 'unmount failed' after SIGTERM with a file open"; }
  is_mounted "$MNT" || { exec 7<&-; fail "a busy mount went away on the first SIGTERM"; }
  kill -TERM $pid
  wait_daemon_gone "$MNT" 5 || { exec 7<&-; fail "the daemon is still running 5 s after a second SIGTERM"; }
  exec 7<&-
  ! is_mounted "$MNT" || fail "the mount is still in the mount table after the second SIGTERM"
  grep -q "detaching the mount and exiting" "$dlog" || fail "the log does not say why it exited"

  # --force detaches a live mount and mounts over it; the old daemon ends.
  mount_fs "$MNT" "$ADDRS" || fail "mount failed"
  pid=$(daemon_pids "$MNT")
  out=$(t "$BIN" mount "$MNT" --servers "$ADDRS" "${MOUNT_ARGS[@]}" --force 2>&1 </dev/null) ||
    fail "mount --force over a live mount: $out"
  grep -q "live mount (--force)" <<<"$out" || fail "mount --force did not say what it did: $out"
  for ((rc = 0; rc < 50; rc++)); do kill -0 $pid 2>/dev/null || break; sleep 0.2; done
  ! kill -0 $pid 2>/dev/null || fail "the detached mount's daemon still runs 10 s later"
  put "$MNT/forced" "new mount"
  assert_eq "the forced mount serves" "$(get "$MNT/forced")" "new mount"
}

# servers_free: the free bytes of every server of $ADDRS, summed.
servers_free() {
  local a total=0 f
  for a in ${ADDRS//,/ }; do
    f=$(t "$BIN" stats --server "$a" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["free_bytes"])') ||
      return 1
    total=$((total + f))
  done
  echo "$total"
}

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
    total=$((total + $(t "$BIN" stats --server "$a" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["total_bytes"])')))
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
  local mnt2=$BASE/mnt/volume_follow2 want got used out
  local check_py=$PWD/mount-tests/follow_check.py
  mount_fs "$MNT" "$ADDRS" --volume fl --create || fail "mount --volume fl --create failed"
  mkdir -p "$MNT/d" "$mnt2"
  must "write d/big" dd if=/dev/urandom of="$MNT/d/big" bs=1M count=24 conv=fsync status=none
  must "write d/small" sh -c "echo small >'$MNT/d/small' && sync '$MNT/d/small'"
  want=$(cd "$MNT/d" && t sha256sum -- *) || fail "sha256sum on the holder failed"
  used=$(servers_free) || fail "servers' free bytes"
  mount_fs "$mnt2" "$ADDRS" --volume fl --read-only || fail "mount --read-only failed"
  got=$(cd "$mnt2/d" && t sha256sum -- *) || fail "sha256sum on the follower failed"
  assert_eq "checksums on the follower" "$got" "$want"
  assert_eq "servers' free bytes with a follower reading" "$(servers_free)" "$used"
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
  python3 - "$MNT" "$WORK/finished" "$WORK/stop" >"$WORK/writer.out" 2>&1 <<'PY' &
import os, sys
mnt, finished, stop = sys.argv[1:]
i = 0
with open(finished, "w") as log:
    while not os.path.exists(stop):
        i += 1
        data = (b"%d," % i) * (65536 // len(b"%d," % i))
        with open(f"{mnt}/f-{i}", "wb") as f:
            f.write(data)
        log.write(f"{i}\n")
        log.flush()
print(f"wrote {i} files without an error")
PY
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
  must "every file finished before the export, in the copy" python3 - "$mnt2" "$done_before" <<'PY'
import sys
mnt, n = sys.argv[1], int(sys.argv[2])
for i in range(1, n + 1):
    want = (b"%d," % i) * (65536 // len(b"%d," % i))
    with open(f"{mnt}/f-{i}", "rb") as f:
        if f.read() != want:
            sys.exit(f"f-{i} differs in the copy")
PY
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

# Linux semantics other users' programs rely on, checked as another user (nobody, through
# -o allow_other): a set-group-ID directory hands its group down (and its bit to
# subdirectories); a write or fallocate by someone outside a file's group drops its
# set-group-ID bit; a directory read that renames every entry it reads (away and back)
# ends, seeing each entry once.
test_linux_semantics() {
  local m=$MNT as_nobody out n free before
  as_nobody=(setpriv --reuid=65534 --regid=65534 --clear-groups)
  # nobody must be able to reach the mount point.
  chmod o+x "$BASE" "$BASE/mnt"
  mount_fs "$m" "$ADDRS" -o allow_other,relatime,lazytime || fail "mount -o allow_other failed"

  # Reads update access times (relatime): an access time before the last change moves.
  put "$m/timed" "x"
  must "set an old atime" touch -a -d '2 days ago' "$m/timed"
  before=$(stat -c %X "$m/timed")
  must "read" cat "$m/timed"
  [ "$(stat -c %X "$m/timed")" -gt "$before" ] || fail "a read did not update the access time"

  must "mkdir shared" mkdir "$m/shared"
  must "chgrp shared" chgrp 4242 "$m/shared"
  must "chmod 2777 shared" chmod 2777 "$m/shared"
  must "mkdir as nobody" "${as_nobody[@]}" mkdir "$m/shared/x"
  must "touch as nobody" "${as_nobody[@]}" touch "$m/shared/f"
  assert_eq "subdirectory of a setgid directory" "$(stat -c '%u %g %A' "$m/shared/x")" \
    "65534 4242 drwxr-sr-x"
  assert_eq "file in a setgid directory" "$(stat -c '%u %g %A' "$m/shared/f")" \
    "65534 4242 -rw-r--r--"

  for how in write fallocate; do
    put "$m/sgid-$how" "data"
    must "chgrp" chgrp 4242 "$m/sgid-$how"
    must "chmod 2666" chmod 2666 "$m/sgid-$how"
    if [ "$how" = write ]; then
      must "append as nobody" "${as_nobody[@]}" bash -c 'echo more >>"$1"' _ "$m/sgid-$how"
    else
      must "fallocate as nobody" "${as_nobody[@]}" fallocate -l 64K "$m/sgid-$how"
    fi
    assert_eq "mode after a $how by nobody" "$(stat -c '%a' "$m/sgid-$how")" 666
  done
  # Truncation by nobody and chown by root drop set-user-ID too (FUSE_HANDLE_KILLPRIV_V2
  # leaves both to rmemfs).
  put "$m/suid" "data"
  must "chmod 4777" chmod 4777 "$m/suid"
  must "truncate as nobody" "${as_nobody[@]}" truncate -s 1 "$m/suid"
  assert_eq "mode after a truncate by nobody" "$(stat -c '%a' "$m/suid")" 777
  must "chmod 4755" chmod 4755 "$m/suid"
  must "chown" chown 65534 "$m/suid"
  assert_eq "mode after chown" "$(stat -c '%a' "$m/suid")" 755

  # What statfs calls free can be allocated: after a small file, a fallocate of all of it.
  must "a 64 KiB file" dd if=/dev/zero of="$m/small" bs=64K count=1 status=none
  free=$(stat -f -c '%a %S' "$m" | awk '{print $1 * $2}')
  [ "$free" -gt 0 ] || fail "statfs reports no free space"
  must "fallocate what statfs reports free ($free bytes)" fallocate -l "$free" "$m/all-free"
  assert_eq "free after allocating it all" "$(stat -f -c '%a' "$m")" 0
  must "rm all-free" rm "$m/all-free"
  # A sparse file holds only the chunk written (1 MiB, the default chunk size).
  must "sparse file" dd if=/dev/zero of="$m/sparse" bs=4K count=1 seek=2560 status=none
  assert_eq "blocks of a sparse 10 MiB file" "$(stat -c '%b' "$m/sparse")" 2048

  # Punching a hole gives the memory back and reads zeros; zero-range zeroes and extends.
  must "a 4 MiB file" dd if=/dev/urandom of="$m/holes" bs=1M count=4 status=none
  must "punch 1M+2M" fallocate -p -o 1M -l 2M "$m/holes"
  assert_eq "size and blocks after the punch" "$(stat -c '%s %b' "$m/holes")" "4194304 4096"
  assert_eq "punched bytes" "$(dd if="$m/holes" bs=1M skip=1 count=2 status=none | tr -d '\0' | wc -c)" 0
  must "zero-range to 8M" fallocate -z -o 0 -l 8M "$m/holes"
  assert_eq "size after zero-range" "$(stat -c '%s' "$m/holes")" 8388608
  assert_eq "zeroed bytes" "$(tr -d '\0' <"$m/holes" | wc -c)" 0

  # POSIX ACLs, enforced by the kernel for another uid: a grant and a denial, a default
  # ACL inherited (overruling the umask), chmod moving the mask.
  put "$m/private" "secret"
  must "chmod 600" chmod 600 "$m/private"
  ! "${as_nobody[@]}" cat "$m/private" >/dev/null 2>&1 || fail "nobody read a 0600 file"
  must "setfacl u:nobody:r" setfacl -m u:nobody:r "$m/private"
  assert_eq "read granted by an ACL" "$("${as_nobody[@]}" cat "$m/private")" "secret"
  assert_eq "mode after setfacl" "$(stat -c %a "$m/private")" 640
  must "chmod 600 again" chmod 600 "$m/private"
  assert_eq "mask after chmod" "$(getfacl -cp "$m/private" | grep '^mask')" "mask::---"
  ! "${as_nobody[@]}" cat "$m/private" >/dev/null 2>&1 || fail "the masked ACL still granted"
  must "mkdir proj" mkdir "$m/proj"
  must "chmod 770 proj" chmod 770 "$m/proj"
  must "default ACL" setfacl -m u:nobody:rwx -d -m u:nobody:rwx "$m/proj"
  must "create as nobody through the ACL" "${as_nobody[@]}" touch "$m/proj/by-nobody"
  must "create under umask 077" bash -c 'umask 077; touch "$1"' _ "$m/proj/inherited"
  assert_eq "inherited mode" "$(stat -c %a "$m/proj/inherited")" 660
  getfacl -cp "$m/proj/inherited" | grep -qx "user:nobody:rwx.*" ||
    fail "the default ACL was not inherited: $(getfacl -cp "$m/proj/inherited")"
  # An ACL set by the owner outside the group, without CAP_FSETID, clears set-group-ID as
  # chmod does (the kernel's posix_acl_update_mode), on a file and on a directory; the mode is
  # the daemon's (read again after the caches are dropped).
  must "mkdir acl-sgid-d" mkdir "$m/acl-sgid-d"
  put "$m/acl-sgid-f" "x"
  for x in acl-sgid-f acl-sgid-d; do
    must "chown 100:100 $x" chown 100:100 "$m/$x"
    must "chmod 2755 $x" chmod 2755 "$m/$x"
    must "setfacl by the owner outside the group" setpriv --reuid=100 --regid=101 --clear-groups \
      setfacl -m u::rwx,g::rwx,o::rwx "$m/$x"
    assert_eq "mode of $x after the owner's setfacl" "$(stat -c %a "$m/$x")" 777
    drop_caches "$m" || fail "cannot drop caches"
    assert_eq "mode of $x from the daemon" "$(stat -c %a "$m/$x")" 777
  done

  # chattr: immutable and append-only are enforced, lsattr shows them.
  put "$m/locked" "base"
  must "chattr +i" chattr +i "$m/locked"
  assert_eq "lsattr" "$(lsattr "$m/locked" | cut -c1-22)" "----i-----------------"
  ! bash -c 'echo x >>"$1"' _ "$m/locked" 2>/dev/null || fail "wrote to an immutable file"
  ! rm -f "$m/locked" 2>/dev/null || fail "removed an immutable file"
  must "chattr -i +a" chattr -i +a "$m/locked"
  must "append to an append-only file" bash -c 'echo more >>"$1"' _ "$m/locked"
  ! bash -c 'echo x >"$1"' _ "$m/locked" 2>/dev/null || fail "overwrote an append-only file"
  assert_eq "append-only content" "$(cat "$m/locked" | tr '\n' ' ')" "base more "
  must "chattr -a" chattr -a "$m/locked"
  # SEEK_DATA/SEEK_HOLE and copy_file_range answered by rmemfs (python's os calls).
  out=$(t python3 -c '
import os, sys
f = os.open(sys.argv[1], os.O_RDONLY)
d, h = os.lseek(f, 0, os.SEEK_DATA), os.lseek(f, 0, os.SEEK_HOLE)
out = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT, 0o644)
n = os.copy_file_range(f, out, 1 << 30, 0, 0)
print(d, h, n)' "$m/sparse" "$m/sparse-copy") || fail "seek/copy: $out"
  assert_eq "SEEK_DATA, SEEK_HOLE, bytes copied" "$out" "10485760 0 10489856"
  must "cmp the copy" cmp "$m/sparse" "$m/sparse-copy"

  # A file handle outlives the kernel's caches (NFS export, open_by_handle_at).
  put "$m/shared/handled" "handle-data"
  out=$(t python3 mount-tests/handle.py "$m/shared/handled") || fail "open_by_handle_at: $out"
  assert_eq "read through a handle after drop_caches" "$out" "handle-data"

  # O_TMPFILE (FUSE_TMPFILE): an unnamed file, written, then named by linkat; one opened
  # with O_EXCL can never be named.
  must "mkdir tmpdir" mkdir "$m/tmpdir"
  out=$(t python3 -c '
import os, sys, errno, ctypes
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, AT_SYMLINK_FOLLOW = -100, 0x400
def name(fd, path):  # linkat through /proc, as the O_TMPFILE man page shows
    if libc.linkat(AT_FDCWD, b"/proc/self/fd/%d" % fd, AT_FDCWD, path.encode(), AT_SYMLINK_FOLLOW):
        return errno.errorcode[ctypes.get_errno()]
    return "linked"
d = sys.argv[1]
fd = os.open(d, os.O_TMPFILE | os.O_RDWR, 0o640)
os.write(fd, b"unnamed until now")
listed = os.listdir(d)
assert name(fd, d + "/named") == "linked"
ex = os.open(d, os.O_TMPFILE | os.O_RDWR | os.O_EXCL, 0o600)
refused = name(ex, d + "/never")
print(listed, refused)' "$m/tmpdir") || fail "O_TMPFILE: $out"
  assert_eq "O_TMPFILE: listed before linkat, linking an O_EXCL one" "$out" "[] ENOENT"
  assert_eq "the linked O_TMPFILE file" "$(cat "$m/tmpdir/named") $(stat -c '%a %h' "$m/tmpdir/named")" \
    "unnamed until now 640 1"
  assert_eq "what the directory holds" "$(ls "$m/tmpdir")" "named"

  # Birth time (FUSE_STATX): set when the file is made, kept when the other times move.
  local born_after
  born_after=$(date +%s)
  put "$m/born" "x"
  must "backdate born" touch -d '2 days ago' "$m/born"
  out=$(stat -c '%W %Y' "$m/born")
  [ "${out% *}" -ge "$born_after" ] && [ "${out#* }" -lt "$born_after" ] ||
    fail "birth and modification times of a backdated new file: $out (made after $born_after)"

  # rmemfs as overlayfs's upper layer: copy-up, whiteouts on delete, renames.
  local lower=$WORK/lower merged=$WORK/merged
  mkdir -p "$lower/sub" "$merged" "$m/upper" "$m/ovl-work"
  echo lower >"$lower/a"
  echo b >"$lower/b"
  echo c >"$lower/sub/c"
  must "mount overlay" mount -t overlay overlay \
    -o "lowerdir=$lower,upperdir=$m/upper,workdir=$m/ovl-work" "$merged"
  must "append (copy-up)" bash -c 'echo more >>"$1"' _ "$merged/a"
  must "rm a lower file" rm "$merged/b"
  must "rename a lower file" mv "$merged/sub/c" "$merged/c2"
  assert_eq "merged a" "$(cat "$merged/a" | tr '\n' ' ')" "lower more "
  ! exists "$merged/b" || fail "a deleted lower file shows through the overlay"
  assert_eq "merged listing" "$(ls "$merged" | tr '\n' ' ')" "a c2 sub "
  assert_eq "whiteout for b" "$(stat -c '%F %t:%T' "$m/upper/b")" "character special file 0:0"
  assert_eq "copied-up a" "$(cat "$m/upper/a" | tr '\n' ' ')" "lower more "
  must "umount overlay" umount "$merged"
  assert_eq "lower layer untouched" "$(cat "$lower/a") $(ls "$lower/sub")" "lower c"

  must "mkdir many away" mkdir "$m/many" "$m/away"
  n=5000
  must "create $n files" perl -e 'for (1..$ARGV[1]) { open(my $f, ">", "$ARGV[0]/f$_") or die "$!" }' \
    "$m/many" "$n"
  out=$(timeout -k 5 120 perl -e '
    my ($d, $away) = @ARGV; my (%seen, $reads);
    opendir(my $h, $d) or die "$!";
    while (defined(my $e = readdir $h)) {
      next if $e eq "." || $e eq "..";
      $seen{$e}++; $reads++;
      die "no end after $reads entries\n" if $reads > 3 * 5000;
      rename("$d/$e", "$away/$e") or die "$!"; rename("$away/$e", "$d/$e") or die "$!";
    }
    my $twice = grep { $seen{$_} > 1 } keys %seen;
    print scalar(keys %seen), " $reads $twice\n";' "$m/many" "$m/away") ||
    fail "reading a directory while renaming its entries failed: $out"
  assert_eq "entries, reads, entries seen twice" "$out" "$n $n 0"

  # chattr flags as on tmpfs: nothing leaves an immutable directory (EPERM before ENOTEMPTY);
  # an append-only file may be touched to now but not given times; chattr moves the ctime
  # (seen by stat at once); and a creation's birth time is never later than its mtime.
  must "dirs under an immutable one" mkdir -p "$m/imm/sub/deeper"
  must "chattr +i" chattr +i "$m/imm"
  out=$(rmdir "$m/imm/sub" 2>&1) && fail "rmdir inside an immutable directory succeeded"
  grep -q "Operation not permitted" <<<"$out" || fail "rmdir inside an immutable directory: $out"
  must "chattr -i" chattr -i "$m/imm"
  # (On a directory: under the writeback cache the kernel keeps a regular file's ctime itself
  # and FUSE's chattr path does not touch it, a kernel limit doc/SEMANTICS.md names.)
  before=$(stat -c %.9Z "$m/imm")
  must "chattr +d" chattr +d "$m/imm"
  python3 -c 'import sys; sys.exit(0 if float(sys.argv[2]) > float(sys.argv[1]) else 1)' \
    "$before" "$(stat -c %.9Z "$m/imm")" || fail "chattr +d did not move the directory's ctime"
  put "$m/appendonly" "a"
  must "chattr +a" chattr +a "$m/appendonly"
  must "touch (utime NULL) an append-only file" touch "$m/appendonly"
  out=$(touch -d '2001-01-01' "$m/appendonly" 2>&1) && fail "explicit times on an append-only file were set"
  must "chattr -a" chattr -a "$m/appendonly"
  for n in 1 2 3 4 5 6 7 8; do
    put "$m/born$n" "b"
    out=$(stat -c '%.9W %.9Y %.9Z' "$m/born$n")
    python3 -c 'import sys; b, m, c = map(float, sys.argv[1:]); sys.exit(0 if b <= m and b <= c else 1)' \
      $out || fail "born$n: birth time after mtime or ctime ($out)"
  done
  unmount_fs "$m" || fail "unmount failed"
}

# The writeback cache really on (low water 0: every handle cached): appends from two open
# handles, shared mmap writes, O_DIRECT beside buffered I/O, truncation of dirty data all
# stay exact after the caches are dropped; a pool that fills under cached writes reports
# ENOSPC at fsync rather than losing data silently.
# Access times follow the mount's flags, a remount included: the daemon reads them where the
# kernel keeps them (/proc/self/mountinfo), so `mount -o remount,noatime` reaches it. The
# sequence of Linux's own check, each value read from the daemon (caches dropped first, and
# times to the nanosecond, so no step waits for the clock); O_NOATIME at the end.
test_atime_remount() {
  local m=$MNT t0 t1 d0 m0 c0
  mount_fs "$m" "$ADDRS" -o relatime || fail "mount -o relatime failed"
  assert_eq "the rule at mount" "$("$BIN" stats "$m" | grep '^access times')" "access times: relatime"
  # at FILE FIELD: the field (X atime, Y mtime, Z ctime) as the daemon has it.
  at() { drop_caches "$m" || fail "cannot drop caches"; stat -c "%.9$2" "$1"; }
  rd() { drop_caches "$m" || fail "cannot drop caches"; must "read $1" cat "$1" >/dev/null; }
  # remount OPTION RULE: (RULE an extended regex of what `stats` names) the daemon learns of a remount from the mount table a moment after
  # it returns; `stats` says when it has (a barrier: the reads after it must follow RULE).
  remount() {
    local k
    # -i: the kernel's remount, not the mount.fuse helper (which would start a daemon).
    must "mount -o remount,$1" mount -i -o "remount,$1" "$m"
    for ((k = 0; k < 100; k++)); do
      "$BIN" stats "$m" | grep -qxE "access times: $2" && return 0
      sleep 0.1
    done
    fail "after remount,$1 stats says $("$BIN" stats "$m" | grep '^access times'), not $2"
  }
  must "mkdir" mkdir "$m/dir1" "$m/dir2"
  put "$m/dir1/file1" "one"
  # relatime: the first read after a change moves the access time, the next does not.
  t0=$(at "$m/dir1/file1" X)
  rd "$m/dir1/file1"
  t1=$(at "$m/dir1/file1" X)
  [[ "$t1" > "$t0" ]] || fail "relatime: the first read did not move the access time ($t0 -> $t1)"
  rd "$m/dir1/file1"
  assert_eq "relatime: a second read" "$(at "$m/dir1/file1" X)" "$t1"
  # nodiratime: nothing moves by the remount; a listing leaves the directory's atime.
  remount nodiratime relatime,nodiratime
  assert_eq "atime after remount,nodiratime" "$(at "$m/dir1/file1" X)" "$t1"
  d0=$(at "$m/dir2" X) m0=$(at "$m/dir2" Y) c0=$(at "$m/dir2" Z)
  put "$m/dir2/file2" "two"
  [[ "$(at "$m/dir2" Y)" > "$m0" && "$(at "$m/dir2" Z)" > "$c0" ]] ||
    fail "a create did not move the directory's mtime and ctime"
  t0=$(at "$m/dir2/file2" X)
  rd "$m/dir2/file2"
  [[ "$(at "$m/dir2/file2" X)" > "$t0" ]] || fail "nodiratime: a file's read did not move its atime"
  must "list dir2" ls "$m/dir2" >/dev/null
  assert_eq "nodiratime: the directory's atime after a listing" "$(at "$m/dir2" X)" "$d0"
  # noatime: nothing moves.
  remount noatime "noatime(,nodiratime)?"
  put "$m/dir2/file3" "three"
  t0=$(at "$m/dir2/file3" X)
  rd "$m/dir2/file3"
  assert_eq "noatime: atime after a read" "$(at "$m/dir2/file3" X)" "$t0"
  m0=$(at "$m/dir1/file1" Y) c0=$(at "$m/dir1/file1" Z)
  must "write file1" bash -c 'echo more >>"$1"' _ "$m/dir1/file1"
  [[ "$(at "$m/dir1/file1" Y)" > "$m0" && "$(at "$m/dir1/file1" Z)" > "$c0" ]] ||
    fail "a write did not move mtime and ctime"
  c0=$(at "$m/dir1/file1" Z)
  must "rename file1" mv "$m/dir1/file1" "$m/dir1/file1b"
  [[ "$(at "$m/dir1/file1b" Z)" > "$c0" ]] || fail "a rename did not move the ctime"
  # strictatime: every read moves it.
  remount strictatime "strictatime(,nodiratime)?"
  t0=$(at "$m/dir2/file3" X)
  rd "$m/dir2/file3"
  t1=$(at "$m/dir2/file3" X)
  [[ "$t1" > "$t0" ]] || fail "strictatime: the first read did not move the access time"
  rd "$m/dir2/file3"
  [[ "$(at "$m/dir2/file3" X)" > "$t1" ]] || fail "strictatime: the second read did not move it"
  # O_NOATIME (the owner may ask it): a read through such a handle leaves it.
  t0=$(at "$m/dir2/file3" X)
  drop_caches "$m" || fail "cannot drop caches"
  must "read with O_NOATIME" python3 -c 'import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NOATIME); os.read(fd, 100); os.close(fd)' "$m/dir2/file3"
  assert_eq "atime after an O_NOATIME read" "$(at "$m/dir2/file3" X)" "$t0"
  unmount_fs "$m" || fail "unmount failed"
}

test_writeback() {
  local m=$MNT out
  must "append 1" bash -c 'exec 3>>"$1"; echo one >&3; echo two >>"$1"; echo three >&3' _ "$m/log"
  must "mmap write" python3 -c '
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(fd, 8192)
m = mmap.mmap(fd, 8192)
m[4096:4101] = b"mmap!"
m.flush(); m.close(); os.close(fd)' "$m/mapped"
  must "O_DIRECT write" dd if=/dev/urandom of="$WORK/direct" bs=64K count=4 status=none
  must "O_DIRECT into the file" dd if="$WORK/direct" of="$m/direct" bs=64K oflag=direct status=none
  must "buffered overwrite of the middle" bash -c \
    'printf XXXX | dd of="$1" bs=1 seek=70000 conv=notrunc status=none' _ "$m/direct"
  printf XXXX | dd of="$WORK/direct" bs=1 seek=70000 conv=notrunc status=none
  must "dirty then truncate" bash -c 'head -c 300000 /dev/urandom >"$1"; truncate -s 1000 "$1"' \
    _ "$m/cut"
  drop_caches "$m" || fail "drop caches failed"
  assert_eq "appends from two handles" "$(cat "$m/log" | tr '\n' ' ')" "one two three "
  assert_eq "mmap bytes" "$(dd if="$m/mapped" bs=1 skip=4096 count=5 status=none)" "mmap!"
  must "O_DIRECT and buffered agree" cmp "$WORK/direct" "$m/direct"
  assert_eq "size after truncating dirty data" "$(stat -c %s "$m/cut")" 1000
  # Filling the pool (2 x 48 MiB, two copies) under the cache: fsync says ENOSPC.
  out=$(dd if=/dev/zero of="$m/big" bs=1M count=96 conv=fsync 2>&1) &&
    fail "96 MiB into a 48 MiB pool reported success"
  case $out in *"No space left on device"*) ;; *) fail "not ENOSPC: $out" ;; esac
  must "rm big" rm -f "$m/big"
  # The same without fsync: close (no FLUSH request behind it) still reports it.
  out=$(dd if=/dev/zero of="$m/big" bs=1M count=96 2>&1) &&
    fail "96 MiB into a 48 MiB pool reported success at close"
  case $out in *"No space left on device"*) ;; *) fail "not ENOSPC at close: $out" ;; esac
  must "rm big" rm -f "$m/big"
}

# The writeback cache on a small private pool (512 MiB, where the older rule wrote through
# below the mount's 1.9 GB dirty allowance): the kernel's dirty data for the mount is kept
# below the pool's free room (the bdi's max_bytes, which stats reports and the kernel shows),
# so new handles are cached. Then the pool is filled to ENOSPC by sequential files (each
# dd conv=fsync) and random 4 KiB writes: ENOSPC comes from write() or fsync() (the test says
# which), and every file acknowledged before reads back exactly after the caches are dropped.
test_writeback_room() {
  local m=$MNT st dev limit room i rc out acked=0 where
  st=$(t "$BIN" stats --json "$m" | python3 -c '
import json, sys
w = json.load(sys.stdin)["writeback"]
print(w["new_handles"], w["dirty_limit_bytes"], w["free_room_bytes"])') ||
    fail "stats --json has no writeback object"
  read -r handles limit room <<<"$st"
  assert_eq "new writable handles on a 512 MiB pool" "$handles" cached
  [ "$limit" -gt 0 ] && [ "$limit" -lt "$room" ] ||
    fail "dirty limit $limit not kept below the pool's room $room"
  dev=$(awk -v m="$m" '$5 == m { print $3 }' /proc/self/mountinfo | tail -n 1)
  [ -r "/sys/class/bdi/$dev/max_bytes" ] || fail "no max_bytes for bdi $dev"
  [ "$(cat "/sys/class/bdi/$dev/max_bytes")" -le "$room" ] ||
    fail "the kernel's max_bytes $(cat "/sys/class/bdi/$dev/max_bytes") above the room $room"
  # Sequential files of 32 MiB, each fsynced, until the pool is full.
  for ((i = 0; i < 40; i++)); do
    head -c 32M /dev/urandom >"$WORK/ref-$i"
    rc=0
    timeout -k 10 "$TMO" dd if="$WORK/ref-$i" of="$m/seq-$i" bs=1M conv=fsync \
      2>"$WORK/dd.err" || rc=$?
    is_timeout "$rc" && fail "dd into a filling pool timed out"
    if [ "$rc" -ne 0 ]; then
      grep -q "No space left on device" "$WORK/dd.err" ||
        fail "dd failed without ENOSPC: $(head -c 200 "$WORK/dd.err" | tr '\n' ' ')"
      where=$(grep -q "fsync failed" "$WORK/dd.err" && echo fsync || echo write)
      log "sequential fill: ENOSPC from $where() after $i files of 32 MiB"
      rm -f "$WORK/ref-$i"
      break
    fi
    acked=$((acked + 1))
  done
  [ "$acked" -ge 8 ] || fail "only $acked files of 32 MiB fitted a 512 MiB pool"
  [ "$i" -lt 40 ] || fail "40 files of 32 MiB fitted a 512 MiB pool"
  t rm -f "$m/seq-$i" "$m/seq-$((acked - 1))"
  rm -f "$WORK/ref-$((acked - 1))"
  acked=$((acked - 1))
  # Random 4 KiB writes over 64 MiB, into the room of one file (32 MiB): ENOSPC again.
  out=$(t python3 - "$m/rand" <<'PY'
import errno, os, random, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)
rng = random.Random(7)
block = os.urandom(4096)
try:
    for _ in range(64 * 256 * 2):
        os.pwrite(fd, block, rng.randrange(64 * 256) * 4096)
except OSError as e:
    print("write", errno.errorcode[e.errno]); sys.exit(0)
try:
    os.fsync(fd)
except OSError as e:
    print("fsync", errno.errorcode[e.errno]); sys.exit(0)
print("none")
PY
) || fail "random writes: $out"
  case $out in
    "write ENOSPC" | "fsync ENOSPC") log "random fill: ENOSPC from ${out%% *}()" ;;
    *) fail "random 4 KiB writes over 64 MiB into 32 MiB of room: $out (want ENOSPC)" ;;
  esac
  t rm -f "$m/rand"
  drop_caches "$m" || fail "drop caches failed"
  for ((i = 0; i < acked; i++)); do
    must "acknowledged file $i reads back" cmp "$WORK/ref-$i" "$m/seq-$i"
  done
}

# `-o io_uring`: where the kernel has FUSE over io_uring, requests come through the rings
# (stats says so, the daemon has ring threads, and they answer requests), and a tree, a large
# file and renames and removals round-trip exactly; where it has not, the mount says
# /dev/fuse and works the same.
test_io_uring() {
  local m=$MNT want pid rings before after
  if has_fuse_uring; then want=io_uring; else want=/dev/fuse; fi
  t "$BIN" stats "$m" | grep -qx "fuse: $want" ||
    fail "stats does not say fuse: $want: $(t "$BIN" stats "$m" | grep fuse)"
  pid=$(daemon_pids "$m" | head -1)
  rings=$(cat /proc/"$pid"/task/*/comm | grep -c '^fuser-ring' || true)
  if [ "$want" = io_uring ]; then
    [ "$rings" -gt 0 ] || fail "no ring threads in the daemon"
  else
    assert_eq "ring threads without kernel support" "$rings" 0
  fi
  before=$(t "$BIN" stats --json "$m" | python3 -c 'import json,sys; print(sum(v["count"] for v in json.load(sys.stdin)["requests"].values()))')
  make_src_tree "$WORK/src"
  must "cp -a into the mount" cp -a "$WORK/src" "$m/tree"
  must "a 64 MiB file" dd if=/dev/urandom of="$WORK/big" bs=1M count=64 status=none
  must "cp the 64 MiB file" cp "$WORK/big" "$m/big"
  must "rename" mv "$m/tree/a" "$m/tree/a2"
  must "rename back" mv "$m/tree/a2" "$m/tree/a"
  must "rm a file" rm "$m/tree/empty"
  rm "$WORK/src/empty"
  drop_caches "$m" || fail "drop caches failed"
  compare_trees "$WORK/src" "$m/tree" "tree through $want"
  must "the 64 MiB file" cmp "$WORK/big" "$m/big"
  after=$(t "$BIN" stats --json "$m" | python3 -c 'import json,sys; print(sum(v["count"] for v in json.load(sys.stdin)["requests"].values()))')
  [ "$after" -gt $((before + 1000)) ] || fail "requests answered: $before, then $after"
  must "rm -rf" rm -rf "$m/tree" "$m/big"
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
  out=$(t "${as_nobody[@]}" "$bin" stats --json "$pool" | python3 -c '
import json, sys
s = json.load(sys.stdin)
f = s["fabric"]
print(f["name"], f["bytes_written"] >= 64 << 20, type(f["unpinned_bytes"]) is int,
      s["requests"]["write"]["count"] > 0 and s["fabric_batches"]["read"]["count"] > 0,
      [x["state"] for x in s["servers"]])') ||
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
  deb=$(t tools/package.sh 2>"$WORK/package.log") || fail "tools/package.sh: $(tail -n 5 "$WORK/package.log")"
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
  out=$(t python3 - "$BIN" "$m" "$ADDRS" <<'PY'
import os, socket, subprocess, sys, tempfile
binary, mnt, addrs = sys.argv[1:4]
path = os.path.join(tempfile.mkdtemp(), "notify")
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
s.settimeout(60)
env = dict(os.environ, NOTIFY_SOCKET=path)
p = subprocess.Popen([binary, "mount", "-f", mnt, "--servers", addrs], env=env,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
msg = s.recv(256).decode()
live = os.path.ismount(mnt)
subprocess.run(["umount", mnt], check=True)
print(msg, live, p.wait(60))
PY
) || fail "mount -f under NOTIFY_SOCKET: $out"
  assert_eq "notification, mounted when told, exit status" "$out" "READY=1 True 0"
}

# --- runner ----------------------------------------------------------------------------------

# name, servers ("shared": two long-lived ${SHARED_SIZE} servers; else fresh ones of these
# sizes), whether the runner mounts before the test, and further mount options. Two or more
# servers mean two copies of every chunk unless the test says otherwise.
# Run only when named (stress, for tools/ scripts): not in the default run. None now (the
# shared storm joined the default run once 115 rounds under load passed).
STRESS_TESTS=()

ALL_TESTS=(
  "cp_tree shared mount"
  "tar_roundtrip shared mount"
  "git shared mount"
  "sqlite shared mount"
  "posix_cases shared mount"
  "concurrent_writers shared mount"
  "fio_verify shared mount"
  "larger_than_one_server 64M,64M mount --replicas=1"
  "enospc 32M,32M mount"
  "absurd_sizes 32M,32M mount"
  "server_death 128M,128M mount --replicas=1"
  "daemon_death shared nomount"
  "volume_crash 256M,256M nomount"
  "volume_export 256M,256M nomount"
  "volume_keep 256M nomount"
  "volume_frozen shared nomount"
  "volume_follow 256M,256M nomount"
  "volume_shared 256M,256M nomount"
  "volume_shared_check 256M,256M nomount"
  "volume_shared_storm 256M,256M nomount"
  "volume_export_s3 256M,256M nomount"
  "volume_export_live 256M,256M nomount"
  "replica_failover 256M,256M,256M mount"
  "replica_freeze 256M,256M,256M mount --op-timeout=2"
  "replica_pair 256M,256M mount --replicas=2"
  "set_replicas 256M,256M,256M mount"
  "add_server 256M,256M,256M mount --replicas=2"
  "rolling_restart 256M,256M,256M mount --replicas=2"
  "backed_restart shared nomount"
  "unmount_cleanup shared nomount"
  "secret shared nomount"
  "linux_semantics shared nomount"
  "atime_remount shared nomount"
  "writeback 48M,48M mount --writeback-low-water=0"
  "writeback_room 512M mount --replicas=1"
  "mount_helper shared nomount"
  "systemd shared nomount"
  "nonroot shared nomount"
  "metrics shared nomount"
  "package shared nomount"
  "io_uring shared mount -o io_uring"
)

SHARED_PIDS=()
SHARED_ADDRS=""
PASSED=0
FAILED=0
SKIPPED=0

# ensure_shared_servers: (re)starts the two shared servers unless both are running.
ensure_shared_servers() {
  local p alive=1
  for p in "${SHARED_PIDS[@]}"; do is_our_server "$p" || alive=0; done
  if [ ${#SHARED_PIDS[@]} -eq 2 ] && [ "$alive" -eq 1 ]; then return 0; fi
  kill_servers "${SHARED_PIDS[@]}"
  SHARED_PIDS=()
  SHARED_ADDRS=""
  for p in 1 2; do
    start_server "$SHARED_SIZE" || return 1
    SHARED_PIDS+=("$SERVER_PID")
    SHARED_ADDRS+=${SHARED_ADDRS:+,}$SERVER_ADDR
  done
}

# run_test NAME SERVERS MODE: sets up, runs test_NAME in a subshell, tears down, reports.
run_test() {
  local name=$1 servers=$2 mode=$3 reason="" size sizes tlog fresh=0 t0=$SECONDS
  shift 3
  local extra=("$@")
  tlog=$BASE/logs/$name.log
  MNT=$BASE/mnt/$name
  WORK=$BASE/work/$name
  REASON=$BASE/logs/$name.reason
  mkdir -p "$MNT" "$WORK"
  : >"$REASON"
  : >"$tlog"
  TEST_PIDS=()
  ADDRS=""

  if [ "$servers" = shared ]; then
    if ensure_shared_servers 2>>"$tlog"; then
      TEST_PIDS=("${SHARED_PIDS[@]}")
      ADDRS=$SHARED_ADDRS
    else
      reason="could not start the memory servers: $(tail -n 1 "$tlog")"
    fi
  else
    fresh=1
    IFS=, read -ra sizes <<<"$servers"
    for size in "${sizes[@]}"; do
      if ! start_server "$size" 2>>"$tlog"; then
        reason="could not start a $size memory server: $(tail -n 1 "$tlog")"
        break
      fi
      TEST_PIDS+=("$SERVER_PID")
      ADDRS+=${ADDRS:+,}$SERVER_ADDR
    done
  fi
  echo "servers: $ADDRS" >>"$tlog"

  if [ -z "$reason" ] && [ "$mode" = mount ] && ! mount_fs "$MNT" "$ADDRS" "${extra[@]}" 2>>"$tlog"; then
    reason="mount failed: $(tail -n 1 "$tlog")"
  fi

  if [ -z "$reason" ]; then
    reason=$(run_test_fn "$name" "$tlog")
  fi

  if is_mounted "$MNT" && ! unmount_fs "$MNT" 2>>"$tlog"; then
    [ -n "$reason" ] || reason="unmount after the test failed: $(tail -n 1 "$tlog")"
  fi
  if [ "$fresh" -eq 1 ]; then kill_servers "${TEST_PIDS[@]}"; fi

  if [ -z "$reason" ]; then
    echo "ok $name ($((SECONDS - t0)) s)"
    PASSED=$((PASSED + 1))
  elif [ "${reason#SKIPPED: }" != "$reason" ]; then
    echo "SKIPPED $name: ${reason#SKIPPED: }"
    SKIPPED=$((SKIPPED + 1))
  else
    echo "FAIL $name ($((SECONDS - t0)) s): $reason"
    tail -n 15 "$tlog" | sed 's/^/    | /'
    FAILED=$((FAILED + 1))
  fi
}

main() {
  local spec name found selected=()
  if [ $# -gt 0 ]; then
    for name in "$@"; do
      found=0
      for spec in "${ALL_TESTS[@]}" "${STRESS_TESTS[@]}"; do
        if [ "${spec%% *}" = "$name" ]; then
          selected+=("$spec")
          found=1
        fi
      done
      if [ "$found" -eq 0 ]; then
        echo "unknown test '$name'; tests: $(printf '%s\n' "${ALL_TESTS[@]}" | cut -d' ' -f1 | tr '\n' ' ')" >&2
        exit 2
      fi
    done
  else
    selected=("${ALL_TESTS[@]}")
  fi

  ensure_packages fio:fio sqlite3:sqlite3 git:git fusermount3:fuse3 rsync:rsync tar:tar \
    pgrep:procps mountpoint:util-linux fuser:psmisc setfattr:attr cmp:diffutils \
    python3:python3 perl:perl chattr:e2fsprogs systemd-analyze:systemd \
    setfacl:acl promtool:prometheus curl:curl prlimit:util-linux lintian:lintian
  check_prereqs mount serve || exit 2
  lib_init mt

  SRC=$BASE/src
  make_src_tree "$SRC"

  for spec in "${selected[@]}"; do
    # shellcheck disable=SC2086 # the spec is three words
    run_test $spec
  done

  cleanup
  echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
  [ "$FAILED" -eq 0 ] || exit 1
}

main "$@"
