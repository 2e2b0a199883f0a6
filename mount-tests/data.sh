# shellcheck shell=bash disable=SC2016 # '$1' in bash -c scripts is meant literally
# Real-mount tests of the data path: ordinary programs (cp, rsync, tar, git, sqlite3, fio) and
# the Linux semantics they rely on, access times, the writeback cache and FUSE over io_uring.
# Sourced by run.sh.

# cp -a and rsync -a put a mixed tree into rmemfs with every byte, mode, size, mtime, type and
# symlink intact, and cp -a brings it back out unchanged.
test_cp_tree() {
  must "cp -a into the mount" cp -a "$SRC" "$MNT/tree"
  drop_caches "$MNT" || fail "drop caches failed"
  compare_trees "$SRC" "$MNT/tree" "after cp -a into the mount"
  # Every file cp closed was written back at close, yet FLUSH reached the daemon at most once:
  # its ENOSYS tells the kernel to stop asking (nothing is left to flush there).
  local flushes
  flushes=$(stats_field "$MNT" 's["requests"].get("flush", {"count": 0})["count"]') ||
    fail "stats --json failed"
  log "FLUSH requests after cp -a: $flushes"
  [ "$flushes" -le 1 ] || fail "FLUSH was sent on every close"
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
  python3 mount-tests/lookups_check.py "$before" "$after" "$entries" ||
    fail "ls -lR took a lookup per entry"
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
  out=$(t python3 mount-tests/tmpfile_check.py "$m/tmpdir") || fail "O_TMPFILE: $out"
  assert_eq "O_TMPFILE: listed before linkat, linking an O_EXCL one" "$out" "[] ENOENT"
  assert_eq "the linked O_TMPFILE file" "$(cat "$m/tmpdir/named") $(stat -c '%a %h' "$m/tmpdir/named")" \
    "unnamed until now 640 1"
  assert_eq "what the directory holds" "$(ls "$m/tmpdir")" "named"

  # Birth time (FUSE_STATX): set when the file is made, kept when the other times move.
  # The file system's clock is the kernel's coarse one (a jiffy behind `date`'s at most): a
  # file made just after a second began may be born in the second before.
  local born_after
  born_after=$(($(date +%s) - 1))
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
  # Times come from the coarse clock (as the kernel's own: a tick of a few ms): wait for it to
  # pass the ctime before, or a chattr within the same tick would leave it equal.
  # (5: CLOCK_REALTIME_COARSE, which Python does not name.)
  python3 -c 'import sys, time
while time.clock_gettime(5) <= float(sys.argv[1]): time.sleep(0.001)' "$before"
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
# dd conv=fsync; ENOSPC from write() or fsync(), the test says which), and, with room for
# three of them again, by random 4 KiB writes under the cache (ENOSPC at fsync); every file
# acknowledged before reads back exactly after the caches are dropped.
test_writeback_room() {
  local m=$MNT st dev limit room i k rc out acked=0 where
  st=$(stats_field "$m" '" ".join(str(s["writeback"][k])
    for k in ("new_handles", "dirty_limit_bytes", "free_room_bytes"))') ||
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
  # Room for three files again (96 MiB or more): a new handle is cached. Random 4 KiB writes
  # over 256 MiB fill the pool under the cache: the write-backs are refused, the writer
  # learns it at fsync, and from the first refusal it is no longer throttled to a page (a
  # round trip per page until then: 2 minutes on a loaded machine).
  for ((k = 1; k <= 3; k++)); do
    t rm -f "$m/seq-$((acked - k))"
    rm -f "$WORK/ref-$((acked - k))"
  done
  t rm -f "$m/seq-$i"
  acked=$((acked - 3))
  # The removals' frees go out without waiting, and their answers bring the room back: a
  # statfs settles those in flight (CI once asked before they were answered: 'direct').
  for ((k = 0; k < 50; k++)); do
    t stat -f "$m" >/dev/null
    handles=$(stats_field "$m" 's["writeback"]["new_handles"]')
    [ "$handles" = cached ] && break
    sleep 0.1
  done
  assert_eq "new handles with room for three files" "$handles" cached
  out=$(t python3 mount-tests/random_fill.py "$m/rand" 256) || fail "random writes: $out"
  assert_eq "where random 4 KiB writes under the cache met the full pool" "$out" "fsync ENOSPC"
  limit=$(stats_field "$m" 'str(s["writeback"]["dirty_limit_bytes"])')
  [ "$limit" -ge $((32 << 20)) ] ||
    fail "the dirty limit of a pool that refused write-backs is $limit, under 32 MiB"
  t rm -f "$m/rand"
  # A writeback refused (ENOSPC at fsync) leaves its error on the file system too, unseen:
  # Linux reports it to the first syncfs after it (errseq_sample gives 0 for an unseen
  # error), as on any file system. That syncfs takes it; the one drop_caches runs must not
  # fail.
  timeout -k 5 60 sync -f "$m" 2>/dev/null || log "the refused writeback's error went to the first syncfs"
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
  before=$(stats_field "$m" 'sum(v["count"] for v in s["requests"].values())')
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
  after=$(stats_field "$m" 'sum(v["count"] for v in s["requests"].values())')
  [ "$after" -gt $((before + 1000)) ] || fail "requests answered: $before, then $after"
  must "rm -rf" rm -rf "$m/tree" "$m/big"
}
