//! What programs expect of a Linux file system beyond POSIX basics, in the core (no FUSE):
//! set-group-ID directories, set-ID bits dropped by unprivileged writes, stable directory
//! reads, handles, space accounting, fallocate modes, whiteouts, inode flags.

mod common;

use common::{TestFs, ME};
use rmemfs::fs::{Caller, SetAttr, SetTime};
use rmemfs::meta::ROOT_INO;

/// An unprivileged user, with no supplementary groups known (pid 0).
const USER: Caller = Caller {
    uid: 1000,
    gid: 1000,
    pid: 0,
    umask: 0,
    cap_fsetid: false,
};

fn chmod(t: &TestFs, path: &str, mode: u32) {
    let ino = t.resolve(path).unwrap();
    t.fs.setattr(
        ino,
        &SetAttr {
            mode: Some(mode),
            ..Default::default()
        },
        ME,
    )
    .unwrap();
}

fn chown(t: &TestFs, path: &str, uid: u32, gid: u32) {
    let ino = t.resolve(path).unwrap();
    t.fs.setattr(
        ino,
        &SetAttr {
            uid: Some(uid),
            gid: Some(gid),
            ..Default::default()
        },
        ME,
    )
    .unwrap();
}

#[test]
fn a_setgid_directory_hands_down_its_group_and_its_bit_to_subdirectories() {
    let t = TestFs::new(1, 8 << 20, 1 << 20);
    t.fs.mkdir(ROOT_INO, b"shared", 0o777, ME).unwrap();
    chown(&t, "shared", 0, 4242);
    chmod(&t, "shared", 0o2777);
    let d = t.resolve("shared").unwrap();
    let sub = t.fs.mkdir(d, b"x", 0o755, USER).unwrap();
    assert_eq!((sub.uid, sub.gid), (1000, 4242));
    assert_eq!(sub.perm, 0o2755, "a subdirectory inherits set-group-ID");
    let (f, fh) = t.fs.create(d, b"f", 0o644, libc::O_WRONLY, USER).unwrap();
    t.fs.release(fh);
    assert_eq!((f.uid, f.gid, f.perm), (1000, 4242, 0o644));
    let node =
        t.fs.mknod(d, b"fifo", libc::S_IFIFO | 0o600, 0, USER)
            .unwrap();
    assert_eq!(node.gid, 4242);
    let link = t.fs.symlink(d, b"l", b"f", USER).unwrap();
    assert_eq!(link.gid, 4242);
    let (tmp, fh) = t.fs.tmpfile(d, 0o600, libc::O_RDWR, USER).unwrap();
    t.fs.release(fh);
    assert_eq!(tmp.gid, 4242, "an O_TMPFILE file too");
    // And down the tree: the subdirectory is set-group-ID itself.
    let deeper = t.fs.mkdir(sub.ino, b"y", 0o700, USER).unwrap();
    assert_eq!((deeper.gid, deeper.perm), (4242, 0o2700));
    // A plain directory keeps the creator's group.
    let plain = t.fs.mkdir(ROOT_INO, b"plain", 0o777, USER).unwrap();
    let inner = t.fs.mkdir(plain.ino, b"z", 0o777, USER).unwrap();
    assert_eq!((inner.gid, inner.perm), (1000, 0o777));
}

#[test]
fn unprivileged_writes_and_fallocates_drop_set_id_bits() {
    let t = TestFs::new(1, 8 << 20, 1 << 20);
    let cases: [(u32, Caller, u32); 6] = [
        // A set-group-ID file without group execute, written by someone outside its group.
        (0o2666, USER, 0o666),
        // The same, written by a member of its group: kept (it marks mandatory locking).
        (0o2666, Caller { gid: 4242, ..USER }, 0o2666),
        // Group-executable: dropped even for a member.
        (0o2775, Caller { gid: 4242, ..USER }, 0o775),
        // Set-user-ID: always dropped.
        (0o4777, USER, 0o777),
        (0o6777, USER, 0o777),
        // Root (for CAP_FSETID) keeps them.
        (0o6777, ME, 0o6777),
    ];
    // The kernel caches modes: each drop is reported so the adapter can invalidate it.
    let told = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = told.clone();
    t.fs.on_attr_changed(Box::new(move |ino| log.lock().unwrap().push(ino)));
    let mut dropped = Vec::new();
    for (n, (mode, who, want)) in cases.into_iter().enumerate() {
        for via_fallocate in [false, true] {
            let name = format!("f{n}{via_fallocate}");
            t.create(&name).unwrap();
            chown(&t, &name, 0, 4242);
            chmod(&t, &name, mode);
            let ino = t.resolve(&name).unwrap();
            let fh = t.fs.open(ino, libc::O_WRONLY).unwrap();
            if via_fallocate {
                t.fs.fallocate(ino, fh, 0, 4096, 0, who).unwrap();
            } else {
                t.fs.write(ino, fh, 0, b"x", who).unwrap();
            }
            t.fs.release(fh);
            if want != mode {
                dropped.push(ino);
            }
            assert_eq!(
                t.fs.getattr(ino).unwrap().perm as u32,
                want,
                "mode {mode:o} by uid {} gid {}, fallocate {via_fallocate}",
                who.uid,
                who.gid
            );
        }
    }
    assert_eq!(*told.lock().unwrap(), dropped);
}

#[test]
fn group_membership_counts_supplementary_groups() {
    // This process's own groups, as /proc shows them: the first supplementary one (if any)
    // makes it a member beside its primary group.
    let me = Caller {
        uid: 1000,
        gid: u32::MAX - 1,
        pid: std::process::id(),
        umask: 0,
        cap_fsetid: false,
    };
    assert!(me.in_group(u32::MAX - 1));
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let groups: Vec<u32> = status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .unwrap()
        .split_whitespace()
        .map(|g| g.parse().unwrap())
        .collect();
    for g in &groups {
        assert!(me.in_group(*g), "supplementary group {g}");
    }
    let stranger = (1..).find(|g| !groups.contains(g)).unwrap();
    assert!(!me.in_group(stranger));
}

/// Reads a whole directory stream in batches of `batch`, calling `each` on every entry read
/// (not "." or "..") before the next batch; stops after `limit` entries.
fn read_stream(
    t: &TestFs,
    dir: u64,
    batch: usize,
    limit: usize,
    each: &mut dyn FnMut(&str),
) -> Vec<String> {
    let fh = t.fs.opendir(dir).unwrap();
    let mut seen = Vec::new();
    let mut offset = 0;
    loop {
        let mut got = Vec::new();
        t.fs.readdir(dir, fh, offset, &mut |e| {
            got.push(e);
            got.len() < batch
        })
        .unwrap();
        if got.is_empty() || seen.len() > limit {
            break;
        }
        offset = got.last().unwrap().offset;
        for e in got {
            let name = String::from_utf8(e.name).unwrap();
            if name != "." && name != ".." {
                each(&name);
                seen.push(name);
            }
        }
    }
    t.fs.releasedir(fh);
    seen
}

#[test]
fn a_directory_read_ends_while_every_entry_is_renamed_away_and_back() {
    let t = TestFs::new(1, 8 << 20, 1 << 20);
    t.fs.mkdir(ROOT_INO, b"d", 0o755, ME).unwrap();
    t.fs.mkdir(ROOT_INO, b"elsewhere", 0o755, ME).unwrap();
    let d = t.resolve("d").unwrap();
    let away = t.resolve("elsewhere").unwrap();
    const N: usize = 500;
    for i in 0..N {
        t.create(&format!("d/f{i}")).unwrap();
    }
    // Each entry read is renamed into another directory and back (a new cookie each time),
    // and also to another name in the same directory and back.
    let seen = read_stream(&t, d, 64, 3 * N, &mut |name| {
        let n = name.as_bytes();
        t.fs.rename(d, n, away, n, 0, ME).unwrap();
        t.fs.rename(away, n, d, n, 0, ME).unwrap();
        t.fs.rename(d, n, d, b"tmp", 0, ME).unwrap();
        t.fs.rename(d, b"tmp", d, n, 0, ME).unwrap();
    });
    assert_eq!(seen.len(), N, "each entry once, and the read ends");
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), N);
}

#[test]
fn a_stream_skips_removed_entries_and_a_rewind_sees_new_ones() {
    let t = TestFs::new(1, 8 << 20, 1 << 20);
    for i in 0..20 {
        t.create(&format!("f{i:02}")).unwrap();
    }
    let fh = t.fs.opendir(ROOT_INO).unwrap();
    let read = |offset: u64| {
        let mut names = Vec::new();
        t.fs.readdir(ROOT_INO, fh, offset, &mut |e| {
            names.push((e.offset, String::from_utf8(e.name).unwrap()));
            true
        })
        .unwrap();
        names
    };
    let all = read(0);
    assert_eq!(all.len(), 22);
    let (mid, _) = all[10].clone();
    t.fs.unlink(ROOT_INO, b"f19").unwrap();
    t.create("new").unwrap();
    let rest: Vec<String> = read(mid).into_iter().map(|(_, n)| n).collect();
    assert!(
        !rest.contains(&"f19".to_string()),
        "a removed entry is skipped"
    );
    assert!(
        !rest.contains(&"new".to_string()),
        "a new one waits for a rewind"
    );
    assert_eq!(rest.len(), 22 - 11 - 1);
    let rewound: Vec<String> = read(0).into_iter().map(|(_, n)| n).collect();
    assert!(rewound.contains(&"new".to_string()));
    t.fs.releasedir(fh);
    assert_eq!(
        t.fs.readdir(ROOT_INO, fh, 0, &mut |_| true)
            .unwrap_err()
            .errno,
        libc::EBADF
    );
}

#[test]
fn placeable_chunks_puts_copies_on_distinct_servers() {
    use rmemfs::fs::placeable_chunks;
    assert_eq!(placeable_chunks(&[10, 10], 1), 20);
    assert_eq!(placeable_chunks(&[10, 10], 2), 10);
    assert_eq!(placeable_chunks(&[10, 0], 2), 0);
    assert_eq!(placeable_chunks(&[5, 5, 5], 2), 7);
    assert_eq!(placeable_chunks(&[100, 1, 1], 2), 2);
    assert_eq!(placeable_chunks(&[100, 1, 1], 3), 1);
    assert_eq!(placeable_chunks(&[], 1), 0);
}

#[test]
fn st_blocks_counts_what_a_file_holds_and_holes_hold_nothing() {
    const MIB: u64 = 1 << 20;
    let t = TestFs::new(1, 32 * MIB, MIB);
    t.create("small").unwrap();
    t.write_file("small", 0, &[1; 64 << 10]).unwrap();
    let blocks = |p: &str| t.fs.getattr(t.resolve(p).unwrap()).unwrap().blocks;
    assert_eq!(blocks("small"), (64 << 10) / 512);
    t.create("sparse").unwrap();
    t.write_file("sparse", 10 * MIB, b"tail").unwrap();
    let a = t.fs.getattr(t.resolve("sparse").unwrap()).unwrap();
    assert_eq!(a.size, 10 * MIB + 4);
    assert_eq!(
        a.blocks,
        MIB / 512,
        "one chunk held; the ten before it are a hole"
    );
    let ino = t.resolve("sparse").unwrap();
    let fh = t.fs.open(ino, libc::O_WRONLY).unwrap();
    t.fs.fallocate(ino, fh, 0, 2 * MIB, 0, ME).unwrap();
    t.fs.release(fh);
    assert_eq!(blocks("sparse"), 3 * MIB / 512);
    t.fs.setattr(
        ino,
        &SetAttr {
            size: Some(MIB),
            ..Default::default()
        },
        ME,
    )
    .unwrap();
    assert_eq!(blocks("sparse"), MIB / 512);
    t.fs.setattr(
        ino,
        &SetAttr {
            size: Some(0),
            ..Default::default()
        },
        ME,
    )
    .unwrap();
    assert_eq!(blocks("sparse"), 0);
    t.fs.mkdir(ROOT_INO, b"d", 0o755, ME).unwrap();
    assert_eq!(blocks("d"), 0);
}

/// What `statfs` calls free can be allocated, and no more: after a small file, a fallocate
/// of exactly the free blocks succeeds and one more chunk is ENOSPC; with two copies over
/// three servers, free space counts each chunk's copies on distinct servers.
#[test]
fn statfs_free_space_can_be_allocated() {
    const MIB: u64 = 1 << 20;
    for (servers, replicas) in [(1, 1), (2, 1), (3, 2)] {
        let t = TestFs::replicated(
            servers,
            16 * MIB,
            MIB,
            rmemfs::data::WritePath::Frrwp,
            replicas,
        );
        t.create("small").unwrap();
        t.write_file("small", 0, &[7; 64 << 10]).unwrap();
        let s = t.fs.statfs();
        let free = s.blocks_free * s.block_size as u64;
        assert!(free > 0);
        t.create("big").unwrap();
        let ino = t.resolve("big").unwrap();
        let fh = t.fs.open(ino, libc::O_WRONLY).unwrap();
        t.fs.fallocate(ino, fh, 0, free, 0, ME)
            .unwrap_or_else(|e| panic!("{servers} servers, {replicas} copies: {free}: {e}"));
        assert_eq!(
            t.fs.statfs().blocks_free,
            0,
            "{servers} servers, {replicas} copies"
        );
        let more = t.fs.fallocate(ino, fh, free, MIB, 0, ME).unwrap_err();
        assert_eq!(more.errno, libc::ENOSPC);
        t.fs.release(fh);
    }
}

/// Bytes `0..len` with a pattern that tells positions apart.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i / 4096 * 7 + i % 251) as u8).collect()
}

fn falloc(t: &TestFs, path: &str, mode: i32, offset: u64, len: u64) -> Result<(), i32> {
    let ino = t.resolve(path).unwrap();
    let fh = t.fs.open(ino, libc::O_WRONLY).unwrap();
    let r = t.fs.fallocate(ino, fh, offset, len, mode, ME);
    t.fs.release(fh);
    r.map_err(|e| e.errno)
}

fn remote_used(t: &TestFs) -> u64 {
    t.remote_used()
}

#[test]
fn punching_a_hole_gives_its_chunks_back_and_zeroes_the_edges() {
    const MIB: u64 = 1 << 20;
    let t = TestFs::new(2, 16 * MIB, MIB);
    t.create("f").unwrap();
    let data = pattern(4 * MIB as usize);
    t.write_file("f", 0, &data).unwrap();
    assert_eq!(remote_used(&t), 4 * MIB);
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // From the middle of chunk 0 to the middle of chunk 2: chunk 1 is given back.
    falloc(&t, "f", punch, MIB / 2, 2 * MIB).unwrap();
    assert_eq!(
        remote_used(&t),
        3 * MIB,
        "the punched MiB went back to its server"
    );
    let mut want = data.clone();
    want[(MIB / 2) as usize..(5 * MIB / 2) as usize].fill(0);
    assert_eq!(t.read_file("f").unwrap(), want);
    let ino = t.resolve("f").unwrap();
    assert_eq!(t.fs.getattr(ino).unwrap().size, 4 * MIB, "the size stays");
    assert_eq!(t.fs.getattr(ino).unwrap().blocks, 3 * MIB / 512);
    // Without KEEP_SIZE a punch is refused, as by the kernel; a zero length is EINVAL.
    assert_eq!(
        falloc(&t, "f", libc::FALLOC_FL_PUNCH_HOLE, 0, 4096),
        Err(libc::EOPNOTSUPP)
    );
    assert_eq!(falloc(&t, "f", punch, 0, 0), Err(libc::EINVAL));
    // A punch far past the end, over a petabyte, costs nothing and changes nothing.
    falloc(&t, "f", punch, 8 * MIB, 1 << 50).unwrap();
    assert_eq!(t.read_file("f").unwrap(), want);
}

#[test]
fn zero_range_zeroes_and_reserves() {
    const MIB: u64 = 1 << 20;
    let t = TestFs::new(1, 16 * MIB, MIB);
    t.create("f").unwrap();
    let data = pattern(MIB as usize);
    t.write_file("f", 0, &data).unwrap();
    falloc(&t, "f", libc::FALLOC_FL_ZERO_RANGE, MIB / 4, 2 * MIB).unwrap();
    let mut want = data.clone();
    want.truncate((MIB / 4) as usize);
    want.resize((MIB / 4 + 2 * MIB) as usize, 0);
    assert_eq!(t.read_file("f").unwrap(), want);
    assert_eq!(remote_used(&t), 3 * MIB, "the zeroed range is reserved");
    let keep = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
    falloc(&t, "f", keep, 0, 8 * MIB).unwrap();
    assert_eq!(t.read_file("f").unwrap(), vec![0; want.len()]);
}

#[test]
fn collapse_and_insert_move_what_follows() {
    const MIB: u64 = 1 << 20;
    const BLOCK: u64 = rmemfs::fs::BLOCK;
    let t = TestFs::new(2, 32 * MIB, MIB);
    let data = pattern(5 * MIB as usize);
    // Whole chunks (renumbered) and blocks inside chunks (copied).
    for (offset, len) in [(MIB, 2 * MIB), (3 * BLOCK, 5 * BLOCK), (MIB - BLOCK, MIB)] {
        t.create("f").unwrap();
        t.write_file("f", 0, &data).unwrap();
        falloc(&t, "f", libc::FALLOC_FL_COLLAPSE_RANGE, offset, len).unwrap();
        let mut want = data.clone();
        want.drain(offset as usize..(offset + len) as usize);
        assert_eq!(t.read_file("f").unwrap(), want, "collapse {offset}+{len}");
        falloc(&t, "f", libc::FALLOC_FL_INSERT_RANGE, offset, len).unwrap();
        want.splice(
            offset as usize..offset as usize,
            std::iter::repeat_n(0, len as usize),
        );
        assert_eq!(t.read_file("f").unwrap(), want, "insert {offset}+{len}");
        t.fs.unlink(ROOT_INO, b"f").unwrap();
        assert_eq!(remote_used(&t), 0, "nothing leaked ({offset}+{len})");
    }
    t.create("f").unwrap();
    t.write_file("f", 0, &data).unwrap();
    let collapse = libc::FALLOC_FL_COLLAPSE_RANGE;
    let insert = libc::FALLOC_FL_INSERT_RANGE;
    assert_eq!(falloc(&t, "f", collapse, 100, BLOCK), Err(libc::EINVAL));
    assert_eq!(falloc(&t, "f", collapse, 0, 5 * MIB), Err(libc::EINVAL));
    assert_eq!(falloc(&t, "f", insert, 5 * MIB, BLOCK), Err(libc::EINVAL));
    assert_eq!(
        falloc(&t, "f", collapse | libc::FALLOC_FL_KEEP_SIZE, 0, BLOCK),
        Err(libc::EOPNOTSUPP)
    );
    assert_eq!(falloc(&t, "f", 0x40, 0, BLOCK), Err(libc::EOPNOTSUPP));
    assert_eq!(
        t.read_file("f").unwrap(),
        data,
        "refused calls change nothing"
    );
}

#[test]
fn rename_whiteout_leaves_a_whiteout_device_behind() {
    use rmemfs::fs::{RENAME_EXCHANGE, RENAME_NOREPLACE, RENAME_WHITEOUT};
    use rmemfs::meta::Kind;
    let t = TestFs::new(1, 8 << 20, 1 << 20);
    t.create("a").unwrap();
    t.write_file("a", 0, b"moved").unwrap();
    t.fs.rename(ROOT_INO, b"a", ROOT_INO, b"b", RENAME_WHITEOUT, USER)
        .unwrap();
    assert_eq!(t.read_file("b").unwrap(), b"moved");
    let w = t.fs.lookup(ROOT_INO, b"a").unwrap();
    assert_eq!(
        (w.kind, w.rdev, w.perm, w.uid, w.gid),
        (Kind::CharDevice, 0, 0, 1000, 1000),
        "a 0/0 character device owned by the caller"
    );
    // With NOREPLACE: refused over an existing name, the whiteout then not made either.
    t.create("c").unwrap();
    let both = RENAME_WHITEOUT | RENAME_NOREPLACE;
    assert_eq!(
        t.fs.rename(ROOT_INO, b"b", ROOT_INO, b"c", both, ME)
            .unwrap_err()
            .errno,
        libc::EEXIST
    );
    assert_eq!(t.read_file("b").unwrap(), b"moved");
    t.fs.rename(ROOT_INO, b"b", ROOT_INO, b"d", both, ME)
        .unwrap();
    assert_eq!(t.fs.lookup(ROOT_INO, b"b").unwrap().kind, Kind::CharDevice);
    assert_eq!(
        t.fs.rename(
            ROOT_INO,
            b"d",
            ROOT_INO,
            b"c",
            RENAME_WHITEOUT | RENAME_EXCHANGE,
            ME
        )
        .unwrap_err()
        .errno,
        libc::EINVAL
    );
}

#[test]
fn trusted_and_security_attributes_are_kept_user_ones_only_on_files_and_dirs() {
    let t = TestFs::new(1, 8 << 20, 1 << 20);
    t.create("f").unwrap();
    let f = t.resolve("f").unwrap();
    for name in [
        &b"trusted.overlay.opaque"[..],
        b"security.selinux",
        b"user.note",
    ] {
        t.fs.setxattr(f, name, b"y", 0, ME).unwrap();
        assert_eq!(t.fs.getxattr(f, name).unwrap(), b"y");
    }
    let list = t.fs.listxattr(f).unwrap();
    assert_eq!(
        list,
        b"security.selinux\0trusted.overlay.opaque\0user.note\0".to_vec()
    );
    for bad in [&b"trusted."[..], b"os2.x", b"system.foo"] {
        assert_eq!(
            t.fs.setxattr(f, bad, b"y", 0, ME).unwrap_err().errno,
            libc::EOPNOTSUPP,
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    let l = t.fs.symlink(ROOT_INO, b"l", b"f", ME).unwrap();
    assert_eq!(
        t.fs.setxattr(l.ino, b"user.x", b"y", 0, ME)
            .unwrap_err()
            .errno,
        libc::EPERM
    );
    t.fs.setxattr(l.ino, b"trusted.x", b"y", 0, ME).unwrap();
}

#[test]
fn a_file_handle_resolves_through_dot_and_dotdot() {
    let t = TestFs::new(1, 8 << 20, 1 << 20);
    let d = t.fs.mkdir(ROOT_INO, b"d", 0o755, ME).unwrap();
    t.create("d/f").unwrap();
    let f = t.resolve("d/f").unwrap();
    // What the kernel does for a handle whose inode it dropped: LOOKUP "." on the inode,
    // ".." on a directory for its parent.
    assert_eq!(t.fs.lookup(f, b".").unwrap().ino, f);
    assert_eq!(t.fs.lookup(d.ino, b"..").unwrap().ino, ROOT_INO);
    assert_eq!(t.fs.lookup(f, b"..").unwrap_err().errno, libc::ENOTDIR);
    // An unlinked inode's handle is stale (as on ext4), then gone once forgotten.
    t.fs.unlink(d.ino, b"f").unwrap();
    assert_eq!(t.fs.lookup(f, b".").unwrap_err().errno, libc::ESTALE);
    t.fs.forget(f, u64::MAX);
    assert_eq!(t.fs.lookup(f, b".").unwrap_err().errno, libc::ENOENT);
}

#[test]
fn reads_update_access_times_as_the_mount_says() {
    use rmemfs::fs::{Atime, FsConfig};
    for atime in [Atime::Relative, Atime::Strict, Atime::Never] {
        let t = TestFs::with_config(FsConfig {
            atime,
            dir_atime: true,
            ..FsConfig::default()
        });
        t.create("f").unwrap();
        t.write_file("f", 0, b"x").unwrap();
        let ino = t.resolve("f").unwrap();
        let read_moves_atime = || {
            // Times come from a coarse clock: a moved one must differ from the last.
            next_tick();
            let before = t.fs.getattr(ino).unwrap().atime;
            t.read_file("f").unwrap();
            t.fs.getattr(ino).unwrap().atime > before
        };
        // A first read after the write, a second read, a read after another write.
        let first = read_moves_atime();
        let second = read_moves_atime();
        t.write_file("f", 0, b"y").unwrap();
        let after_write = read_moves_atime();
        let want = match atime {
            Atime::Relative => [true, false, true],
            Atime::Strict => [true, true, true],
            Atime::Never => [false, false, false],
        };
        assert_eq!([first, second, after_write], want, "{atime:?}");
        // A directory read counts as an access of the directory.
        next_tick();
        let dir_before = t.fs.getattr(ROOT_INO).unwrap().atime;
        t.list("").unwrap();
        let dir_moved = t.fs.getattr(ROOT_INO).unwrap().atime > dir_before;
        assert_eq!(dir_moved, atime != Atime::Never, "{atime:?}: directory");
    }
    // nodiratime leaves directories alone.
    let t = TestFs::with_config(FsConfig {
        atime: Atime::Strict,
        dir_atime: false,
        ..FsConfig::default()
    });
    let before = t.fs.getattr(ROOT_INO).unwrap().atime;
    t.list("").unwrap();
    assert_eq!(t.fs.getattr(ROOT_INO).unwrap().atime, before);
}

#[test]
fn immutable_and_append_only_inodes_are_enforced() {
    use rmemfs::fs::{FS_APPEND_FL, FS_IMMUTABLE_FL, FS_NOATIME_FL};
    let t = TestFs::new(1, 8 << 20, 1 << 20);
    t.create("f").unwrap();
    t.write_file("f", 0, b"base").unwrap();
    let f = t.resolve("f").unwrap();
    let eperm = |r: Result<(), i32>| assert_eq!(r, Err(libc::EPERM));
    let open = |flags| t.fs.open(f, flags).map_err(|e| e.errno);
    // Immutable: no writing open, truncation, chmod, rename, link, unlink, xattr.
    t.fs.set_flags(f, FS_IMMUTABLE_FL).unwrap();
    assert_eq!(t.fs.get_flags(f).unwrap(), FS_IMMUTABLE_FL);
    assert_eq!(open(libc::O_WRONLY).unwrap_err(), libc::EPERM);
    let chmod = SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    eperm(t.fs.setattr(f, &chmod, ME).map(|_| ()).map_err(|e| e.errno));
    eperm(
        t.fs.rename(ROOT_INO, b"f", ROOT_INO, b"g", 0, ME)
            .map_err(|e| e.errno),
    );
    eperm(
        t.fs.link(f, ROOT_INO, b"g")
            .map(|_| ())
            .map_err(|e| e.errno),
    );
    eperm(t.fs.unlink(ROOT_INO, b"f").map_err(|e| e.errno));
    eperm(
        t.fs.setxattr(f, b"user.x", b"1", 0, ME)
            .map_err(|e| e.errno),
    );
    // A handle opened before the flag cannot write either.
    t.fs.set_flags(f, 0).unwrap();
    let fh = t.fs.open(f, libc::O_WRONLY).unwrap();
    t.fs.set_flags(f, FS_IMMUTABLE_FL).unwrap();
    eperm(
        t.fs.write(f, fh, 0, b"x", ME)
            .map(|_| ())
            .map_err(|e| e.errno),
    );
    t.fs.release(fh);
    // Append-only: opens only with O_APPEND, writes land at the end, no truncation.
    t.fs.set_flags(f, FS_APPEND_FL).unwrap();
    assert_eq!(open(libc::O_WRONLY).unwrap_err(), libc::EPERM);
    assert_eq!(
        open(libc::O_WRONLY | libc::O_APPEND | libc::O_TRUNC).unwrap_err(),
        libc::EPERM
    );
    let fh = open(libc::O_WRONLY | libc::O_APPEND).unwrap();
    t.fs.write(f, fh, 0, b"+more", ME).unwrap();
    eperm(
        t.fs.fallocate(
            f,
            fh,
            0,
            4096,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            ME,
        )
        .map_err(|e| e.errno),
    );
    t.fs.release(fh);
    assert_eq!(t.read_file("f").unwrap(), b"base+more");
    let trunc = SetAttr {
        size: Some(0),
        ..Default::default()
    };
    eperm(t.fs.setattr(f, &trunc, ME).map(|_| ()).map_err(|e| e.errno));
    eperm(t.fs.unlink(ROOT_INO, b"f").map_err(|e| e.errno));
    // An append-only directory takes new entries but loses none; an immutable one neither.
    t.fs.mkdir(ROOT_INO, b"log", 0o755, ME).unwrap();
    let log = t.resolve("log").unwrap();
    t.create("log/a").unwrap();
    t.fs.set_flags(log, FS_APPEND_FL).unwrap();
    t.create("log/b").unwrap();
    eperm(t.fs.unlink(log, b"a").map_err(|e| e.errno));
    t.fs.set_flags(log, FS_IMMUTABLE_FL).unwrap();
    assert_eq!(t.create("log/c"), Err(libc::EPERM));
    // Unsupported flags (compression) are refused; cleared flags free the file again.
    assert_eq!(t.fs.set_flags(f, 0x4).unwrap_err().errno, libc::EOPNOTSUPP);
    t.fs.set_flags(f, FS_NOATIME_FL).unwrap();
    let before = t.fs.getattr(f).unwrap().atime;
    t.read_file("f").unwrap();
    assert_eq!(t.fs.getattr(f).unwrap().atime, before, "noatime");
    t.fs.set_flags(f, 0).unwrap();
    t.fs.unlink(ROOT_INO, b"f").unwrap();
}

#[test]
fn seek_data_and_hole_follow_the_chunks() {
    const MIB: u64 = 1 << 20;
    let t = TestFs::new(1, 32 * MIB, MIB);
    t.create("f").unwrap();
    // Data in chunks 2 and 3, a hole before, a hole after up to the end (6 MiB + 1).
    t.write_file("f", 2 * MIB + 10, &[1; 100]).unwrap();
    t.write_file("f", 3 * MIB, &[1; 100]).unwrap();
    t.write_file("f", 6 * MIB, &[1]).unwrap();
    let f = t.resolve("f").unwrap();
    let fh = t.fs.open(f, libc::O_RDONLY).unwrap();
    let data = |o| t.fs.seek_data_hole(f, fh, o, true).map_err(|e| e.errno);
    let hole = |o| t.fs.seek_data_hole(f, fh, o, false).map_err(|e| e.errno);
    assert_eq!(data(0), Ok(2 * MIB));
    assert_eq!(data(2 * MIB + 5), Ok(2 * MIB + 5));
    assert_eq!(hole(0), Ok(0));
    assert_eq!(hole(2 * MIB), Ok(4 * MIB));
    assert_eq!(data(4 * MIB), Ok(6 * MIB));
    assert_eq!(hole(6 * MIB), Ok(6 * MIB + 1), "the end is a hole");
    assert_eq!(data(6 * MIB + 1), Err(libc::ENXIO));
    assert_eq!(hole(7 * MIB), Err(libc::ENXIO));
    t.fs.release(fh);
}

#[test]
fn copy_file_range_copies_through_the_daemon() {
    const MIB: u64 = 1 << 20;
    let t = TestFs::new(2, 32 * MIB, MIB);
    t.create("src").unwrap();
    t.create("dst").unwrap();
    let data = pattern(3 * MIB as usize + 77);
    t.write_file("src", 0, &data).unwrap();
    let (s, d) = (t.resolve("src").unwrap(), t.resolve("dst").unwrap());
    let sfh = t.fs.open(s, libc::O_RDWR).unwrap();
    let dfh = t.fs.open(d, libc::O_WRONLY).unwrap();
    // Asking for more than there is copies to the source's end.
    let n =
        t.fs.copy_file_range(s, sfh, 100, d, dfh, 5, 10 * MIB, ME)
            .unwrap();
    assert_eq!(n, data.len() as u64 - 100);
    let mut want = vec![0u8; 5];
    want.extend_from_slice(&data[100..]);
    assert_eq!(t.read_file("dst").unwrap(), want);
    // Overlapping ranges of one file are refused.
    assert_eq!(
        t.fs.copy_file_range(s, sfh, 0, s, sfh, 10, 100, ME)
            .unwrap_err()
            .errno,
        libc::EINVAL
    );
    t.fs.release(sfh);
    t.fs.release(dfh);
}

#[test]
fn a_tmpfile_lives_unnamed_until_linked_or_closed() {
    let t = TestFs::new(1, 8 << 20, 1 << 20);
    t.fs.mkdir(ROOT_INO, b"d", 0o755, ME).unwrap();
    let d = t.resolve("d").unwrap();
    let (a, fh) = t.fs.tmpfile(d, 0o600, libc::O_RDWR, USER).unwrap();
    assert_eq!((a.nlink, a.uid, a.perm), (0, 1000, 0o600));
    t.fs.write(a.ino, fh, 0, b"staged", USER).unwrap();
    assert!(t.list("d").unwrap().is_empty(), "no name yet");
    t.fs.link(a.ino, d, b"final").unwrap();
    t.fs.release(fh);
    assert_eq!(t.read_file("d/final").unwrap(), b"staged");
    assert_eq!(t.fs.getattr(a.ino).unwrap().nlink, 1);

    // Closed unlinked: its memory goes back. O_EXCL: never linkable.
    let (b, fh) =
        t.fs.tmpfile(d, 0o600, libc::O_WRONLY | libc::O_EXCL, ME)
            .unwrap();
    t.fs.write(b.ino, fh, 0, &[1; 1 << 20], ME).unwrap();
    assert_eq!(
        t.fs.link(b.ino, d, b"nope").unwrap_err().errno,
        libc::ENOENT
    );
    t.fs.release(fh);
    t.fs.forget(b.ino, 1);
    assert_eq!(remote_used(&t), 4096, "only final's page is held");
    // An ordinary unlinked file cannot be brought back by link either.
    t.create("gone").unwrap();
    let g = t.resolve("gone").unwrap();
    let fh = t.fs.open(g, libc::O_RDONLY).unwrap();
    t.fs.unlink(ROOT_INO, b"gone").unwrap();
    assert_eq!(
        t.fs.link(g, ROOT_INO, b"back").unwrap_err().errno,
        libc::ENOENT
    );
    t.fs.release(fh);
    assert_eq!(
        t.fs.tmpfile(d, 0o600, libc::O_RDONLY, ME)
            .unwrap_err()
            .errno,
        libc::EINVAL
    );
    assert_eq!(
        t.fs.tmpfile(a.ino, 0o600, libc::O_RDWR, ME)
            .unwrap_err()
            .errno,
        libc::ENOTDIR
    );
}

/// An ACL's xattr form from (tag, perm, id) entries.
fn acl_xattr(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

const ACL_USER_OBJ: u16 = 0x01;
const ACL_USER: u16 = 0x02;
const ACL_GROUP_OBJ: u16 = 0x04;
const ACL_MASK: u16 = 0x10;
const ACL_OTHER: u16 = 0x20;
const NO_ID: u32 = u32::MAX;

/// An access ACL set by the owner, outside the file's group and without CAP_FSETID, clears
/// set-group-ID as chmod does (the kernel's posix_acl_update_mode); a member keeps it.
#[test]
fn an_acl_set_by_an_owner_outside_the_group_clears_set_group_id() {
    use rmemfs::fs::acl::ACCESS_XATTR;
    let t = TestFs::new(1, 8 << 20, 1 << 20);
    t.create("f").unwrap();
    t.fs.mkdir(ROOT_INO, b"d", 0o755, ME).unwrap();
    let all = acl_xattr(&[
        (ACL_USER_OBJ, 7, NO_ID),
        (ACL_GROUP_OBJ, 7, NO_ID),
        (ACL_OTHER, 7, NO_ID),
    ]);
    let owner = |gid| Caller {
        uid: 100,
        gid,
        pid: 0,
        umask: 0,
        cap_fsetid: false,
    };
    for name in ["f", "d"] {
        let ino = t.resolve(name).unwrap();
        chown(&t, name, 100, 100);
        chmod(&t, name, 0o2755);
        t.fs.setxattr(ino, ACCESS_XATTR, &all, 0, owner(101))
            .unwrap();
        assert_eq!(
            t.fs.getattr(ino).unwrap().perm,
            0o777,
            "{name}: outside the group"
        );
        chmod(&t, name, 0o2755);
        t.fs.setxattr(ino, ACCESS_XATTR, &all, 0, owner(100))
            .unwrap();
        assert_eq!(t.fs.getattr(ino).unwrap().perm, 0o2777, "{name}: a member");
        chmod(&t, name, 0o2755);
        t.fs.setxattr(ino, ACCESS_XATTR, &all, 0, ME).unwrap();
        assert_eq!(
            t.fs.getattr(ino).unwrap().perm,
            0o2777,
            "{name}: CAP_FSETID"
        );
    }
}

#[test]
fn acls_and_modes_stay_in_step() {
    use rmemfs::fs::acl::{Acl, ACCESS_XATTR, DEFAULT_XATTR};
    let t = TestFs::new(1, 8 << 20, 1 << 20);
    t.create("f").unwrap();
    let f = t.resolve("f").unwrap();
    chmod(&t, "f", 0o600);
    // setfacl -m u:1000:r: the mask becomes the group bits of the mode.
    let with_user = acl_xattr(&[
        (ACL_USER_OBJ, 6, NO_ID),
        (ACL_USER, 4, 1000),
        (ACL_GROUP_OBJ, 0, NO_ID),
        (ACL_MASK, 4, NO_ID),
        (ACL_OTHER, 0, NO_ID),
    ]);
    t.fs.setxattr(f, ACCESS_XATTR, &with_user, 0, ME).unwrap();
    assert_eq!(t.fs.getattr(f).unwrap().perm, 0o640);
    assert_eq!(t.fs.getxattr(f, ACCESS_XATTR).unwrap(), with_user);
    // chmod moves the mask with the group bits; the named entry stays.
    chmod(&t, "f", 0o660);
    let acl = Acl::parse(&t.fs.getxattr(f, ACCESS_XATTR).unwrap()).unwrap();
    assert_eq!(acl.mode_bits(), 0o660);
    assert!(acl.0.iter().any(|e| e.tag == ACL_USER && e.perm == 4));
    // A minimal ACL is only a mode: no ACL is kept.
    let minimal = acl_xattr(&[
        (ACL_USER_OBJ, 7, NO_ID),
        (ACL_GROUP_OBJ, 5, NO_ID),
        (ACL_OTHER, 1, NO_ID),
    ]);
    t.fs.setxattr(f, ACCESS_XATTR, &minimal, 0, ME).unwrap();
    assert_eq!(t.fs.getattr(f).unwrap().perm, 0o751);
    assert_eq!(
        t.fs.getxattr(f, ACCESS_XATTR).unwrap_err().errno,
        libc::ENODATA
    );
    // Malformed ACLs and default ACLs on files are refused.
    assert_eq!(
        t.fs.setxattr(f, ACCESS_XATTR, &[2, 0, 0, 0, 1], 0, ME)
            .unwrap_err()
            .errno,
        libc::EINVAL
    );
    assert_eq!(
        t.fs.setxattr(f, DEFAULT_XATTR, &minimal, 0, ME)
            .unwrap_err()
            .errno,
        libc::EACCES
    );
}

#[test]
fn a_default_acl_is_inherited_and_overrules_the_umask() {
    use rmemfs::fs::acl::{Acl, ACCESS_XATTR, DEFAULT_XATTR};
    let t = TestFs::new(1, 8 << 20, 1 << 20);
    let d = t.fs.mkdir(ROOT_INO, b"proj", 0o770, ME).unwrap().ino;
    let default = acl_xattr(&[
        (ACL_USER_OBJ, 7, NO_ID),
        (ACL_USER, 7, 1000),
        (ACL_GROUP_OBJ, 5, NO_ID),
        (ACL_MASK, 7, NO_ID),
        (ACL_OTHER, 0, NO_ID),
    ]);
    t.fs.setxattr(d, DEFAULT_XATTR, &default, 0, ME).unwrap();
    let masked = Caller { umask: 0o077, ..ME };
    let (f, fh) = t.fs.create(d, b"f", 0o666, libc::O_WRONLY, masked).unwrap();
    t.fs.release(fh);
    assert_eq!(f.perm, 0o660, "the default ACL decides, not the umask");
    let acl = Acl::parse(&t.fs.getxattr(f.ino, ACCESS_XATTR).unwrap()).unwrap();
    assert!(acl
        .0
        .iter()
        .any(|e| e.tag == ACL_USER && e.id == 1000 && e.perm == 7));
    assert_eq!(acl.mode_bits(), 0o660);
    assert_eq!(
        t.fs.getxattr(f.ino, DEFAULT_XATTR).unwrap_err().errno,
        libc::ENODATA,
        "files get no default ACL"
    );
    let sub = t.fs.mkdir(d, b"sub", 0o777, masked).unwrap();
    assert_eq!(sub.perm, 0o770);
    assert_eq!(t.fs.getxattr(sub.ino, DEFAULT_XATTR).unwrap(), default);
    let link = t.fs.symlink(d, b"l", b"f", masked).unwrap();
    assert_eq!(link.perm, 0o777);
    // Without a default ACL the umask applies.
    let (g, fh) =
        t.fs.create(ROOT_INO, b"g", 0o666, libc::O_WRONLY, masked)
            .unwrap();
    t.fs.release(fh);
    assert_eq!(g.perm, 0o600);
    // O_TMPFILE files take the same from their directory as created ones.
    let (tmp, fh) = t.fs.tmpfile(d, 0o666, libc::O_RDWR, masked).unwrap();
    t.fs.release(fh);
    assert_eq!(tmp.perm, 0o660, "the default ACL decides for a tmpfile too");
    assert!(t.fs.getxattr(tmp.ino, ACCESS_XATTR).is_ok());
    let (tmp, fh) = t.fs.tmpfile(ROOT_INO, 0o666, libc::O_RDWR, masked).unwrap();
    t.fs.release(fh);
    assert_eq!(tmp.perm, 0o600, "the umask applies to a tmpfile");
}

#[test]
fn the_birth_time_is_set_once_and_kept() {
    use std::time::{Duration, SystemTime};
    let t = TestFs::new(1, 8 << 20, 1 << 20);
    let before = kernel_now();
    t.create("f").unwrap();
    let f = t.resolve("f").unwrap();
    let born = t.fs.getattr(f).unwrap().btime;
    assert!(born >= before && born <= kernel_now());
    let long_ago = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    t.fs.setattr(
        f,
        &SetAttr {
            atime: Some(SetTime::At(long_ago)),
            mtime: Some(SetTime::At(long_ago)),
            ..Default::default()
        },
        ME,
    )
    .unwrap();
    t.fs.write(f, t.fs.open(f, libc::O_WRONLY).unwrap(), 0, b"x", ME)
        .unwrap();
    let a = t.fs.getattr(f).unwrap();
    assert_eq!(a.btime, born, "neither times set nor a write move it");
    assert!(a.mtime > long_ago && a.atime == long_ago);
}

#[test]
fn noacl_refuses_acl_attributes() {
    use rmemfs::fs::FsConfig;
    let t = TestFs::with_config(FsConfig::default());
    t.create("f").unwrap();
    let f = t.resolve("f").unwrap();
    let minimal = acl_xattr(&[
        (ACL_USER_OBJ, 7, NO_ID),
        (ACL_GROUP_OBJ, 5, NO_ID),
        (ACL_OTHER, 1, NO_ID),
    ]);
    assert_eq!(
        t.fs.setxattr(f, rmemfs::fs::acl::ACCESS_XATTR, &minimal, 0, ME)
            .unwrap_err()
            .errno,
        libc::EOPNOTSUPP
    );
}

#[test]
fn truncation_and_chown_drop_set_id_bits_as_the_kernel_expects() {
    let t = TestFs::new(1, 8 << 20, 1 << 20);
    let size = |n| SetAttr {
        size: Some(n),
        ..Default::default()
    };
    for (who, mode, want) in [
        (USER, 0o6755, 0o755),
        (ME, 0o6755, 0o6755),
        (USER, 0o2644, 0o644),
    ] {
        t.create("f").unwrap();
        chown(&t, "f", 0, 4242);
        chmod(&t, "f", mode);
        let f = t.resolve("f").unwrap();
        t.fs.setattr(f, &size(10), who).unwrap();
        assert_eq!(t.fs.getattr(f).unwrap().perm, want, "truncate of {mode:o}");
        t.fs.unlink(ROOT_INO, b"f").unwrap();
    }
    // chown: set-user-ID goes whoever changes the owner; set-group-ID only from a
    // group-executable file; directories keep both.
    for (mode, want) in [(0o6755, 0o755), (0o6745, 0o2745)] {
        t.create("g").unwrap();
        chmod(&t, "g", mode);
        chown(&t, "g", 1000, 1000);
        let g = t.resolve("g").unwrap();
        assert_eq!(t.fs.getattr(g).unwrap().perm, want, "chown of {mode:o}");
        t.fs.unlink(ROOT_INO, b"g").unwrap();
    }
    t.fs.mkdir(ROOT_INO, b"d", 0o755, ME).unwrap();
    chmod(&t, "d", 0o2775);
    chown(&t, "d", 1000, 1000);
    assert_eq!(t.fs.getattr(t.resolve("d").unwrap()).unwrap().perm, 0o2775);
}

#[test]
fn readdirplus_gives_attributes_and_counts_a_reference_per_entry_taken() {
    let t = TestFs::new(1, 8 << 20, 1 << 20);
    let d = t.fs.mkdir(ROOT_INO, b"d", 0o755, ME).unwrap().ino;
    for name in ["a", "b", "c"] {
        t.create(&format!("d/{name}")).unwrap();
    }
    t.write_file("d/b", 0, b"twelve bytes").unwrap();
    let e = t.fs.mkdir(d, b"e", 0o700, ME).unwrap().ino;
    let ino = |name: &str| t.resolve(&format!("d/{name}")).unwrap();
    let (a, b_ino, c) = (ino("a"), ino("b"), ino("c"));
    // Start from no kernel references (creations and lookups counted some).
    for i in [a, b_ino, c, e] {
        t.fs.forget(i, u64::MAX);
    }
    let fh = t.fs.opendir(d).unwrap();
    // A reply with room for ".", "..", "a" and "b" only: "c" does not fit.
    let mut got = Vec::new();
    t.fs.readdirplus(d, fh, 0, &mut |entry, attr| {
        if got.len() == 4 {
            return false;
        }
        assert_eq!(attr.ino, entry.ino, "attributes of the entry itself");
        got.push((
            String::from_utf8(entry.name).unwrap(),
            entry.offset,
            attr.clone(),
        ));
        true
    })
    .unwrap();
    let names: Vec<&str> = got.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(names, [".", "..", "a", "b"]);
    assert_eq!(got[0].2.ino, d);
    assert_eq!(got[1].2.ino, ROOT_INO);
    let b = &got[3].2;
    assert_eq!((b.size, b.perm), (12, 0o644));
    assert_eq!(
        b,
        &t.fs.getattr(b_ino).unwrap(),
        "the same attributes getattr gives"
    );
    // The rest, from the last entry taken: "c" and "e".
    let mut rest = Vec::new();
    t.fs.readdirplus(d, fh, got[3].1, &mut |entry, _| {
        rest.push(String::from_utf8(entry.name).unwrap());
        true
    })
    .unwrap();
    assert_eq!(rest, ["c", "e"]);
    t.fs.releasedir(fh);

    // "a" was taken once: unlinked, it lives (a handle to it is stale) until forgotten once.
    t.fs.unlink(d, b"a").unwrap();
    assert_eq!(t.fs.lookup(a, b".").unwrap_err().errno, libc::ESTALE);
    t.fs.forget(a, 1);
    assert_eq!(t.fs.lookup(a, b".").unwrap_err().errno, libc::ENOENT);
    // "c" did not fit the first reply but was taken by the second: also one reference.
    t.fs.unlink(d, b"c").unwrap();
    assert_eq!(t.fs.lookup(c, b".").unwrap_err().errno, libc::ESTALE);
    t.fs.forget(c, 1);
    assert_eq!(t.fs.lookup(c, b".").unwrap_err().errno, libc::ENOENT);

    // "." and ".." are never references: e listed as "." is gone as soon as it is removed.
    t.fs.forget(e, u64::MAX);
    let fh = t.fs.opendir(e).unwrap();
    let mut dots = 0;
    t.fs.readdirplus(e, fh, 0, &mut |_, _| {
        dots += 1;
        true
    })
    .unwrap();
    t.fs.releasedir(fh);
    assert_eq!(dots, 2);
    t.fs.rmdir(d, b"e").unwrap();
    assert_eq!(t.fs.lookup(e, b".").unwrap_err().errno, libc::ENOENT);
}

/// The clock the kernel stamps a FUSE inode's times with (`current_time` of a file system
/// without multigrain timestamps): CLOCK_REALTIME_COARSE.
fn kernel_now() -> std::time::SystemTime {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`, which lives across the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    assert_eq!(rc, 0);
    std::time::UNIX_EPOCH + std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Returns once the kernel's clock has moved on: a time taken after this differs from every
/// time taken before (it waits for the clock, not for another thread).
fn next_tick() {
    let start = kernel_now();
    while kernel_now() == start {
        std::hint::spin_loop();
    }
}

#[test]
fn chattr_flags_on_a_directory_refuse_entry_changes_before_other_errors() {
    use rmemfs::fs::{FS_APPEND_FL, FS_IMMUTABLE_FL, RENAME_NOREPLACE};
    let t = TestFs::new(1, 8 << 20, 1 << 20);
    let errno = |r: rmemfs::error::Result<()>| r.map_err(|e| e.errno);
    let made = |r: rmemfs::error::Result<rmemfs::fs::Attr>| r.map(|_| ()).map_err(|e| e.errno);
    for (dir, flag) in [("imm", FS_IMMUTABLE_FL), ("log", FS_APPEND_FL)] {
        let d = t.fs.mkdir(ROOT_INO, dir.as_bytes(), 0o755, ME).unwrap().ino;
        t.fs.mkdir(d, b"full", 0o755, ME).unwrap();
        t.create(&format!("{dir}/full/x")).unwrap();
        t.fs.mkdir(d, b"empty", 0o755, ME).unwrap();
        t.create(&format!("{dir}/f")).unwrap();
        t.create(&format!("{dir}/g")).unwrap();
        t.create(&format!("out-{dir}")).unwrap();
        let f = t.resolve(&format!("{dir}/f")).unwrap();
        t.fs.set_flags(d, flag).unwrap();
        // Removing an entry: EPERM before the directory's emptiness is looked at (the
        // kernel's may_delete runs before the file system's rmdir).
        assert_eq!(errno(t.fs.rmdir(d, b"empty")), Err(libc::EPERM), "{dir}");
        assert_eq!(errno(t.fs.rmdir(d, b"full")), Err(libc::EPERM), "{dir}");
        assert_eq!(errno(t.fs.unlink(d, b"f")), Err(libc::EPERM), "{dir}");
        let out = format!("out-{dir}");
        for (from, name, to, new) in [
            (d, &b"f"[..], ROOT_INO, &b"moved"[..]),
            (d, b"f", d, b"renamed"),
            (d, b"full", ROOT_INO, b"moved"),
        ] {
            let r = t.fs.rename(from, name, to, new, 0, ME);
            assert_eq!(errno(r), Err(libc::EPERM), "{dir}: rename out");
        }
        // A name that exists answers EEXIST first, as the kernel's lookups do.
        assert_eq!(
            errno(t.fs.rename(ROOT_INO, out.as_bytes(), d, b"g", RENAME_NOREPLACE, ME)),
            Err(libc::EEXIST),
            "{dir}"
        );
        assert_eq!(
            made(t.fs.mkdir(d, b"empty", 0o755, ME)),
            Err(libc::EEXIST),
            "{dir}"
        );
        // Replacing an entry removes one.
        assert_eq!(
            errno(t.fs.rename(ROOT_INO, out.as_bytes(), d, b"g", 0, ME)),
            Err(libc::EPERM),
            "{dir}"
        );
        let (new_file, new_dir, new_link) = (
            t.create(&format!("{dir}/new")),
            made(t.fs.mkdir(d, b"newdir", 0o755, ME)),
            made(t.fs.link(t.resolve(&out).unwrap(), d, b"hard")),
        );
        let tmp = t.fs.tmpfile(d, 0o600, libc::O_RDWR, ME).map(|(_, fh)| fh);
        if flag == FS_IMMUTABLE_FL {
            // No new entries at all.
            assert_eq!(new_file, Err(libc::EPERM));
            assert_eq!(new_dir, Err(libc::EPERM));
            assert_eq!(new_link, Err(libc::EPERM));
            assert_eq!(made(t.fs.symlink(d, b"sym", b"f", ME)), Err(libc::EPERM));
            assert_eq!(
                made(t.fs.mknod(d, b"fifo", libc::S_IFIFO | 0o600, 0, ME)),
                Err(libc::EPERM)
            );
            assert_eq!(tmp.map_err(|e| e.errno), Err(libc::EPERM));
            assert_eq!(
                errno(t.fs.rename(ROOT_INO, out.as_bytes(), d, b"in", 0, ME)),
                Err(libc::EPERM)
            );
        } else {
            // An append-only directory takes new entries, moved ones too.
            assert_eq!((new_file, new_dir, new_link), (Ok(()), Ok(()), Ok(())));
            t.fs.release(tmp.unwrap());
            t.fs.rename(ROOT_INO, out.as_bytes(), d, b"in", 0, ME)
                .unwrap();
        }
        // The directory itself: an immutable or append-only directory is not removed,
        // whatever it holds.
        assert_eq!(
            errno(t.fs.rmdir(ROOT_INO, dir.as_bytes())),
            Err(libc::EPERM),
            "{dir}"
        );
        assert_eq!(t.fs.getattr(f).unwrap().nlink, 1);
    }
}

#[test]
fn touching_an_append_only_file_to_now_is_allowed_and_explicit_times_are_not() {
    use rmemfs::fs::{FS_APPEND_FL, FS_IMMUTABLE_FL};
    use std::time::{Duration, UNIX_EPOCH};
    let t = TestFs::new(1, 8 << 20, 1 << 20);
    t.create("f").unwrap();
    chown(&t, "f", 1000, 1000);
    let f = t.resolve("f").unwrap();
    let past = UNIX_EPOCH + Duration::from_secs(1_000_000);
    let setattr = |set: SetAttr| t.fs.setattr(f, &set, USER).map(|_| ()).map_err(|e| e.errno);
    // utime(path, NULL): both times to now. Without the writeback cache the kernel says
    // "now" outright; with it (a regular file's times are the kernel's then) it sends its own
    // current time as the new mtime and the same time as the new ctime; and writing back a
    // written file's times sends mtime and ctime, both from that write.
    let touches = || {
        let k = kernel_now();
        [
            SetAttr {
                atime: Some(SetTime::Now),
                mtime: Some(SetTime::Now),
                ..Default::default()
            },
            SetAttr {
                atime: Some(SetTime::Now),
                mtime: Some(SetTime::At(k)),
                ctime: Some(k),
                ..Default::default()
            },
            SetAttr {
                mtime: Some(SetTime::At(k)),
                ctime: Some(k),
                ..Default::default()
            },
        ]
    };
    let explicit = || {
        let k = kernel_now();
        [
            SetAttr {
                atime: Some(SetTime::At(past)),
                ..Default::default()
            },
            SetAttr {
                atime: Some(SetTime::Now),
                mtime: Some(SetTime::At(past)),
                ctime: Some(k),
                ..Default::default()
            },
            SetAttr {
                atime: Some(SetTime::At(past)),
                mtime: Some(SetTime::At(past)),
                ctime: Some(k),
                ..Default::default()
            },
        ]
    };
    t.fs.set_flags(f, FS_APPEND_FL).unwrap();
    for (n, set) in touches().into_iter().enumerate() {
        assert_eq!(setattr(set), Ok(()), "append-only, touch {n}");
    }
    for (n, set) in explicit().into_iter().enumerate() {
        assert_eq!(setattr(set), Err(libc::EPERM), "append-only, explicit {n}");
    }
    t.fs.set_flags(f, FS_IMMUTABLE_FL).unwrap();
    for (n, set) in touches().into_iter().chain(explicit()).enumerate() {
        assert_eq!(setattr(set), Err(libc::EPERM), "immutable, {n}");
    }
}

#[test]
fn chattr_changes_the_ctime_and_tells_the_kernel() {
    use rmemfs::fs::FS_NODUMP_FL;
    use std::time::{Duration, UNIX_EPOCH};
    let t = TestFs::new(1, 8 << 20, 1 << 20);
    let told = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = told.clone();
    t.fs.on_attr_changed(Box::new(move |ino| log.lock().unwrap().push(ino)));
    t.create("f").unwrap();
    let f = t.resolve("f").unwrap();
    let long_ago = UNIX_EPOCH + Duration::from_secs(1_000_000);
    let age = || {
        t.fs.setattr(
            f,
            &SetAttr {
                ctime: Some(long_ago),
                ..Default::default()
            },
            ME,
        )
        .unwrap();
        assert_eq!(t.fs.getattr(f).unwrap().ctime, long_ago);
    };
    // The kernel keeps no inode flags for FUSE and does not refresh its cached attributes
    // after the ioctl: the file system must tell it that the ctime moved.
    for flags in [FS_NODUMP_FL, FS_NODUMP_FL, 0] {
        age();
        told.lock().unwrap().clear();
        t.fs.set_flags(f, flags).unwrap();
        assert!(
            t.fs.getattr(f).unwrap().ctime > long_ago,
            "flags {flags:#x}"
        );
        assert_eq!(*told.lock().unwrap(), [f], "flags {flags:#x}");
    }
}

#[test]
fn chmod_by_an_owner_outside_the_group_drops_set_group_id() {
    let t = TestFs::new(1, 8 << 20, 1 << 20);
    let mode = |n: u32| SetAttr {
        mode: Some(n),
        ..Default::default()
    };
    let member = Caller { gid: 4242, ..USER };
    for dir in [false, true] {
        // (file group, caller, requested mode, resulting mode)
        for (n, (group, who, want)) in [
            (4242, USER, 0o755),
            (1000, USER, 0o2755),
            (4242, member, 0o2755),
            (4242, ME, 0o2755),
        ]
        .into_iter()
        .enumerate()
        {
            let name = format!("x{n}{dir}");
            if dir {
                t.fs.mkdir(ROOT_INO, name.as_bytes(), 0o755, ME).unwrap();
            } else {
                t.create(&name).unwrap();
            }
            chown(&t, &name, 1000, group);
            let ino = t.resolve(&name).unwrap();
            let got = t.fs.setattr(ino, &mode(0o2755), who).unwrap().perm;
            assert_eq!(
                got, want,
                "dir {dir}, group {group}, caller gid {}",
                who.gid
            );
            assert_eq!(t.fs.getattr(ino).unwrap().perm, want);
        }
    }
    // With the group changed in the same call, the new group is the one that counts.
    t.create("g").unwrap();
    chown(&t, "g", 1000, 1000);
    let g = t.resolve("g").unwrap();
    let both = SetAttr {
        gid: Some(4242),
        ..mode(0o2755)
    };
    assert_eq!(t.fs.setattr(g, &both, USER).unwrap().perm, 0o755);
}

#[test]
fn the_times_of_a_creation_are_one_stamp_of_the_kernels_clock() {
    let t = TestFs::new(1, 8 << 20, 1 << 20);
    let d = t.fs.mkdir(ROOT_INO, b"d", 0o755, ME).unwrap().ino;
    for n in 0..20 {
        let name = format!("f{n}");
        let made = [
            {
                let (a, fh) =
                    t.fs.create(d, name.as_bytes(), 0o644, libc::O_WRONLY, ME)
                        .unwrap();
                t.fs.release(fh);
                a
            },
            t.fs.mkdir(d, format!("d{n}").as_bytes(), 0o755, ME)
                .unwrap(),
            t.fs.symlink(d, format!("l{n}").as_bytes(), b"x", ME)
                .unwrap(),
            {
                let (a, fh) = t.fs.tmpfile(d, 0o600, libc::O_RDWR, ME).unwrap();
                t.fs.release(fh);
                a
            },
        ];
        // What the kernel stamps next (a write through its cache, a touch) comes from its
        // coarse clock: a birth time from a finer clock could read as later.
        let kernel_next = kernel_now();
        for a in made {
            assert!(
                a.btime <= kernel_next,
                "{:?}: born {:?}, kernel clock after {:?}",
                a.kind,
                a.btime,
                kernel_next
            );
            assert_eq!((a.atime, a.mtime, a.ctime), (a.btime, a.btime, a.btime));
        }
        let dir = t.fs.getattr(d).unwrap();
        assert!(dir.mtime <= kernel_next && dir.ctime <= kernel_next);
    }
}

#[test]
fn relatime_updates_an_access_time_as_the_kernel_does() {
    use rmemfs::fs::{Atime, FsConfig, FS_NOATIME_FL};
    use std::time::Duration;
    const HOUR: Duration = Duration::from_secs(3600);
    let t = TestFs::with_config(FsConfig {
        atime: Atime::Relative,
        dir_atime: true,
        ..FsConfig::default()
    });
    t.create("f").unwrap();
    t.write_file("f", 0, b"data").unwrap();
    t.fs.mkdir(ROOT_INO, b"d", 0o755, ME).unwrap();
    t.fs.symlink(ROOT_INO, b"l", b"f", ME).unwrap();
    // Sets (atime, mtime, ctime) of `path`.
    let set = |path: &str, a, m, c| {
        let ino = t.resolve(path).unwrap();
        t.fs.setattr(
            ino,
            &SetAttr {
                atime: Some(SetTime::At(a)),
                mtime: Some(SetTime::At(m)),
                ctime: Some(c),
                ..Default::default()
            },
            ME,
        )
        .unwrap();
        ino
    };
    let now = kernel_now();
    let ago = |d: Duration| now - d;
    // A day is counted in whole seconds, as the kernel does: an access time in the last
    // fraction of the second a day ago is a day old.
    let secs = now.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let day_ago_late = std::time::UNIX_EPOCH + Duration::new(secs - 86_400, 999_999_999);
    let cases = [
        (
            ago(2 * HOUR),
            ago(HOUR),
            ago(3 * HOUR),
            true,
            "atime before mtime",
        ),
        (ago(HOUR), ago(HOUR), ago(3 * HOUR), true, "atime at mtime"),
        (
            ago(2 * HOUR),
            ago(3 * HOUR),
            ago(HOUR),
            true,
            "atime before ctime",
        ),
        (ago(HOUR), ago(3 * HOUR), ago(HOUR), true, "atime at ctime"),
        (
            ago(HOUR),
            ago(2 * HOUR),
            ago(2 * HOUR),
            false,
            "atime after both",
        ),
        (
            ago(25 * HOUR),
            ago(26 * HOUR),
            ago(26 * HOUR),
            true,
            "a day old",
        ),
        (
            day_ago_late,
            ago(26 * HOUR),
            ago(26 * HOUR),
            true,
            "a day in seconds",
        ),
    ];
    type Access<'a> = Box<dyn Fn() + 'a>;
    let accesses: [(&str, Access); 3] = [
        ("f", Box::new(|| drop(t.read_file("f").unwrap()))),
        ("d", Box::new(|| drop(t.list("d").unwrap()))),
        (
            "l",
            Box::new(|| drop(t.fs.readlink(t.resolve("l").unwrap()).unwrap())),
        ),
    ];
    for (path, access) in &accesses {
        for (a, m, c, moves, why) in cases {
            let ino = set(path, a, m, c);
            access();
            let after = t.fs.getattr(ino).unwrap();
            assert_eq!(after.atime != a, moves, "{path}: {why}");
            assert_eq!(
                (after.mtime, after.ctime),
                (m, c),
                "{path}: {why}: only atime"
            );
        }
        // chattr +A: never, on a directory as on a file.
        let ino = set(path, ago(2 * HOUR), ago(HOUR), ago(HOUR));
        if *path != "l" {
            t.fs.set_flags(ino, FS_NOATIME_FL).unwrap();
            let ino = set(path, ago(2 * HOUR), ago(HOUR), ago(HOUR));
            access();
            assert_eq!(
                t.fs.getattr(ino).unwrap().atime,
                ago(2 * HOUR),
                "{path}: +A"
            );
            t.fs.set_flags(ino, 0).unwrap();
        }
    }
    // A read-only mount changes no access time.
    let ro = TestFs::with_config(FsConfig {
        atime: Atime::Strict,
        dir_atime: true,
        read_only: true,
        ..FsConfig::default()
    });
    let before = ro.fs.getattr(ROOT_INO).unwrap().atime;
    next_tick();
    ro.list("").unwrap();
    assert_eq!(ro.fs.getattr(ROOT_INO).unwrap().atime, before, "read-only");
}
