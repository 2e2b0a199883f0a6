//! The namespace changes in one place: a journal that records every committed batch sees
//! enough to rebuild the namespace, chunk maps included. Many kinds of operation run (names,
//! attributes, ACLs, xattrs, writes, truncation, every fallocate mode, O_TMPFILE, a failed
//! write, a server lost and rebuilt, one forgotten after it came back empty); a table
//! rebuilt from the journal's records alone (framed and read back in the record format)
//! must then match the live one, inode by inode.

mod common;

use common::{bytes, TestFs, ME};
use rmemfs::client::{Rejoin, ServerState};
use rmemfs::data::WritePath;
use rmemfs::error::Result;
use rmemfs::fabric::ServerId;
use rmemfs::fs::SetAttr;
use rmemfs::meta::{Change, Journal, Meta, ROOT_INO};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// Keeps every committed batch.
#[derive(Clone, Default)]
struct Recording(Arc<Mutex<Vec<Vec<Change>>>>);

impl Journal for Recording {
    fn record(&mut self, changes: &[Change], _: &rmemfs::meta::TableView<'_>) -> Result<()> {
        self.0.lock().unwrap().push(changes.to_vec());
        Ok(())
    }
}

fn wait_down(t: &TestFs, i: usize) {
    let pool = t.fs.data().pool();
    let deadline = Instant::now() + Duration::from_secs(10);
    while pool.status()[i].state != ServerState::Down {
        assert!(Instant::now() < deadline, "server {i} never seen down");
        pool.refresh();
        std::thread::yield_now();
    }
}

#[test]
fn a_table_replayed_from_the_journal_matches_the_live_one() {
    let mut t = TestFs::replicated(3, 64 * MIB, MIB, WritePath::Frrwp, 2);
    let journal = Recording::default();
    t.fs.set_journal(Box::new(journal.clone()));
    let fs = t.fs.clone();

    // Names and attributes.
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, ME).unwrap().ino;
    let (a, fh) = fs.create(d, b"a", 0o644, libc::O_RDWR, ME).unwrap();
    fs.write(a.ino, fh, 0, &bytes(1, 3 * MIB as usize + 100), ME)
        .unwrap();
    fs.write(a.ino, fh, 5 * MIB, b"past a hole", ME).unwrap();
    fs.symlink(d, b"s", b"a", ME).unwrap();
    fs.link(a.ino, ROOT_INO, b"a-too").unwrap();
    fs.setxattr(a.ino, b"user.k", b"v", 0, ME).unwrap();
    fs.setxattr(d, b"user.gone", b"v", 0, ME).unwrap();
    fs.removexattr(d, b"user.gone").unwrap();
    // setfacl -m u:1000:r (tags: owner 1, named user 2, owning group 4, mask 0x10, other 0x20).
    let entry = |tag, perm, id| rmemfs::fs::acl::Entry { tag, perm, id };
    let acl = rmemfs::fs::acl::Acl(vec![
        entry(1, 6, u32::MAX),
        entry(2, 4, 1000),
        entry(4, 0, u32::MAX),
        entry(0x10, 4, u32::MAX),
        entry(0x20, 0, u32::MAX),
    ]);
    fs.setxattr(a.ino, rmemfs::fs::acl::ACCESS_XATTR, &acl.to_xattr(), 0, ME)
        .unwrap();
    let chmod = SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    fs.setattr(a.ino, &chmod, ME).unwrap();
    fs.rename(d, b"s", ROOT_INO, b"s2", 0, ME).unwrap();
    fs.mkdir(d, b"e", 0o700, ME).unwrap();
    fs.rename(d, b"e", ROOT_INO, b"e", 0, ME).unwrap();
    fs.rename(
        ROOT_INO,
        b"e",
        ROOT_INO,
        b"s2",
        rmemfs::fs::RENAME_EXCHANGE,
        ME,
    )
    .unwrap();

    // Every fallocate mode, and truncation both ways.
    let fall = |off: u64, len: u64, mode: i32| fs.fallocate(a.ino, fh, off, len, mode, ME);
    fall(8 * MIB, MIB, 0).unwrap();
    fall(
        100,
        4096,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
    )
    .unwrap();
    fall(
        MIB,
        MIB,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
    )
    .unwrap();
    fall(2 * MIB, 8192, libc::FALLOC_FL_ZERO_RANGE).unwrap();
    fall(0, MIB, libc::FALLOC_FL_COLLAPSE_RANGE).unwrap();
    fall(4096, 4096, libc::FALLOC_FL_INSERT_RANGE).unwrap();
    let truncate = |size: u64| {
        let set = SetAttr {
            size: Some(size),
            ..Default::default()
        };
        fs.setattr(a.ino, &set, ME).unwrap();
    };
    truncate(MIB + 10);
    truncate(6 * MIB);

    // A file unlinked while open, another replaced by a rename, an O_TMPFILE linked in.
    let (b, bfh) = fs.create(ROOT_INO, b"b", 0o644, libc::O_RDWR, ME).unwrap();
    fs.write(b.ino, bfh, 0, &bytes(2, 2 * MIB as usize), ME)
        .unwrap();
    fs.unlink(ROOT_INO, b"b").unwrap();
    fs.release(bfh);
    fs.forget(b.ino, 1);
    let (c, cfh) = fs.create(ROOT_INO, b"c", 0o644, libc::O_RDWR, ME).unwrap();
    fs.write(c.ino, cfh, 0, b"replaced", ME).unwrap();
    fs.release(cfh);
    let (_, ffh) = fs.create(ROOT_INO, b"f", 0o644, libc::O_RDWR, ME).unwrap();
    fs.release(ffh);
    fs.rename(ROOT_INO, b"f", ROOT_INO, b"c", 0, ME).unwrap();
    fs.forget(c.ino, 1);
    let (tmp, tfh) = fs.tmpfile(ROOT_INO, 0o600, libc::O_RDWR, ME).unwrap();
    fs.write(tmp.ino, tfh, 0, b"made nameless", ME).unwrap();
    fs.link(tmp.ino, ROOT_INO, b"named").unwrap();
    fs.release(tfh);

    // A server lost: writes heal, the rebuild copies, a write with no room for a chunk
    // fails part way; then it comes back empty and its copies are forgotten.
    t.kill_server(0);
    wait_down(&t, 0);
    fs.write(a.ino, fh, 0, b"healed on write", ME).unwrap();
    rmemfs::upkeep::rebuild::pass(
        &fs,
        0,
        &rmemfs::upkeep::rebuild::Stop::default(),
        &Default::default(),
    );
    let huge = bytes(3, 200 * MIB as usize);
    assert!(
        fs.write(a.ino, fh, 0, &huge, ME).is_err(),
        "the pool is smaller"
    );
    t.restart_server(0);
    let pool = fs.data().pool().clone();
    assert_eq!(pool.try_reconnect(ServerId(0)), Some(Rejoin::Empty));
    rmemfs::upkeep::rebuild::forget_server(&fs, ServerId(0));
    pool.admit(ServerId(0));
    fs.release(fh);

    let batches = journal.0.lock().unwrap().clone();
    let extents = batches
        .iter()
        .flatten()
        .filter(|c| matches!(c, Change::Extent { .. }))
        .count();
    assert!(extents > 20, "only {extents} chunk changes journaled");
    // Through the journal's record format: every batch framed, the frames read back whole.
    let log: Vec<u8> = batches
        .iter()
        .enumerate()
        .flat_map(|(i, b)| rmemfs::meta::record::encode(1 + i as u64, b))
        .collect();
    let read = rmemfs::meta::record::read(&log, 1);
    assert_eq!(read.stop, rmemfs::meta::record::Stop::End);
    assert_eq!(read.records.len(), batches.len());
    let mut replayed = Meta::new(0o755, 0, 0);
    for (_, changes) in &read.records {
        for change in changes {
            replayed.apply(change).unwrap();
        }
    }
    let mut live = fs.namespace_digest();
    let mut again = replayed.digest();
    // The root is made with the table, not by a change: its birth time is its own.
    let (root_live, root_again) = (live.remove(&ROOT_INO), again.remove(&ROOT_INO));
    assert_eq!(
        root_live.unwrap().1,
        root_again.unwrap().1,
        "the root's entries"
    );
    assert_eq!(live.len(), again.len(), "inodes with names");
    for (ino, want) in &live {
        assert_eq!(again.get(ino), Some(want), "inode {ino}");
    }
}

/// Refuses every batch while `refuse` is set (a journal that lost its servers).
#[derive(Clone, Default)]
struct Switch {
    refuse: Arc<std::sync::atomic::AtomicBool>,
    kept: Arc<Mutex<usize>>,
}

impl Journal for Switch {
    fn record(&mut self, _: &[Change], _: &rmemfs::meta::TableView<'_>) -> Result<()> {
        if self.refuse.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(rmemfs::error::Error::new(libc::EIO, "journal refused"));
        }
        *self.kept.lock().unwrap() += 1;
        Ok(())
    }
}

/// One metadata operation on a small tree (names a..d in the root and in directory "d").
#[derive(Debug, Clone)]
enum Op {
    Mkdir(bool, u8),
    Create(bool, u8),
    Symlink(bool, u8),
    Link(bool, u8, bool, u8),
    Unlink(bool, u8),
    Rmdir(bool, u8),
    Rename(bool, u8, bool, u8, u32),
    SetXattr(bool, u8, u8),
    RemoveXattr(bool, u8, u8),
    Chmod(bool, u8, u16),
}

fn op_strategy() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    let at = || (any::<bool>(), 0u8..4);
    prop_oneof![
        at().prop_map(|(d, n)| Op::Mkdir(d, n)),
        at().prop_map(|(d, n)| Op::Create(d, n)),
        at().prop_map(|(d, n)| Op::Symlink(d, n)),
        (at(), at()).prop_map(|((d, n), (e, m))| Op::Link(d, n, e, m)),
        at().prop_map(|(d, n)| Op::Unlink(d, n)),
        at().prop_map(|(d, n)| Op::Rmdir(d, n)),
        (at(), at(), 0u32..3).prop_map(|((d, n), (e, m), f)| Op::Rename(
            d,
            n,
            e,
            m,
            [0, rmemfs::fs::RENAME_EXCHANGE, rmemfs::fs::RENAME_WHITEOUT][f as usize]
        )),
        (at(), 0u8..2).prop_map(|((d, n), k)| Op::SetXattr(d, n, k)),
        (at(), 0u8..2).prop_map(|((d, n), k)| Op::RemoveXattr(d, n, k)),
        (at(), 0u16..0o7777).prop_map(|((d, n), m)| Op::Chmod(d, n, m)),
    ]
}

/// Runs `op`; the directory "d" is made first by the test.
fn run(fs: &rmemfs::fs::Fs, dir: u64, op: &Op) -> std::result::Result<(), i32> {
    let name = |n: u8| [b'a' + n];
    let parent = |in_d: bool| if in_d { dir } else { ROOT_INO };
    let ino = |in_d: bool, n: u8| {
        let a = fs.lookup(parent(in_d), &name(n)).map_err(|e| e.errno)?;
        fs.forget(a.ino, 1);
        Ok::<_, i32>(a.ino)
    };
    let r = match *op {
        Op::Mkdir(d, n) => fs.mkdir(parent(d), &name(n), 0o755, ME).map(|_| ()),
        Op::Create(d, n) => fs
            .create(parent(d), &name(n), 0o644, libc::O_RDWR | libc::O_EXCL, ME)
            .map(|(_, fh)| fs.release(fh)),
        Op::Symlink(d, n) => fs.symlink(parent(d), &name(n), b"t", ME).map(|_| ()),
        Op::Link(d, n, e, m) => fs.link(ino(d, n)?, parent(e), &name(m)).map(|_| ()),
        Op::Unlink(d, n) => fs.unlink(parent(d), &name(n)),
        Op::Rmdir(d, n) => fs.rmdir(parent(d), &name(n)),
        Op::Rename(d, n, e, m, f) => fs.rename(parent(d), &name(n), parent(e), &name(m), f, ME),
        Op::SetXattr(d, n, k) => fs.setxattr(
            ino(d, n)?,
            &[b"user.k", b"user.j"][k as usize][..],
            b"v",
            0,
            ME,
        ),
        Op::RemoveXattr(d, n, k) => {
            fs.removexattr(ino(d, n)?, &[b"user.k", b"user.j"][k as usize][..])
        }
        Op::Chmod(d, n, m) => {
            let set = SetAttr {
                mode: Some(m.into()),
                ..Default::default()
            };
            fs.setattr(ino(d, n)?, &set, ME).map(|_| ())
        }
    };
    r.map_err(|e| e.errno)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
    /// Every operation commits whole or not at all: refused by the journal, it leaves the
    /// namespace exactly as it was (and answers EIO); accepted, it changes what it changes.
    #[test]
    fn a_refused_batch_leaves_the_namespace_as_it_was(
        ops in proptest::collection::vec((op_strategy(), proptest::prelude::any::<bool>()), 1..40)
    ) {
        let t = TestFs::new(1, 16 * MIB, MIB);
        let journal = Switch::default();
        t.fs.set_journal(Box::new(journal.clone()));
        let dir = t.fs.mkdir(ROOT_INO, b"d", 0o755, ME).unwrap().ino;
        t.fs.forget(dir, 1);
        for (op, refuse) in &ops {
            let before = t.fs.namespace_digest();
            let kept = *journal.kept.lock().unwrap();
            journal.refuse.store(*refuse, std::sync::atomic::Ordering::SeqCst);
            let r = run(&t.fs, dir, op);
            journal.refuse.store(false, std::sync::atomic::Ordering::SeqCst);
            let after = t.fs.namespace_digest();
            if *refuse {
                proptest::prop_assert_eq!(&after, &before, "{:?} refused -> {:?}", op, r);
                if r.is_ok() {
                    // Nothing to commit (a rename onto itself): nothing was recorded either.
                    proptest::prop_assert_eq!(*journal.kept.lock().unwrap(), kept);
                }
            } else if r.is_ok() && after != before {
                proptest::prop_assert!(*journal.kept.lock().unwrap() > kept, "{:?} changed the namespace unjournaled", op);
            } else if r.is_err() {
                proptest::prop_assert_eq!(&after, &before, "{:?} failed with {:?} but changed the namespace", op, r);
            }
        }
    }
}
