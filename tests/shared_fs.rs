//! Many writers of one volume, its namespace in a metadata engine (`mount --meta`), over
//! in-process servers and the in-memory engine (the Redis engine keeps the same contract,
//! `tests/engines.rs`, and one test here runs on a real redis-server): each client sees the
//! others' changes before its own, conflicting changes are decided on one history, memory one
//! client frees waits for every client, and a client the engine gave up on is fenced.

mod common;

use common::rack::{read, resolve, Rack};
use common::{bytes, eventually};
use rmemfs::client::volume::{VolumeRole, VolumeSpec};
use rmemfs::engine::mem::MemEngine;
use rmemfs::engine::MetaEngine;
use rmemfs::fs::{FileLock, Fs, FsConfig, LockKind, LockType};
use rmemfs::meta::ROOT_INO;
use rmemfs::volume::shared::{self, SharedClient};
use std::sync::Arc;
use std::time::Duration;

struct Client {
    fs: Arc<Fs>,
    shared: SharedClient,
}

fn client(rack: &Rack, engine: Arc<dyn MetaEngine>, who: &str) -> Client {
    client_with(rack, engine, who, false)
}

/// As [`client`], answering small writes before their bytes are sent if `behind` (as a
/// mount does by default; no worker runs here, so only the client's appends send them).
fn client_with(rack: &Rack, engine: Arc<dyn MetaEngine>, who: &str, behind: bool) -> Client {
    let spec = VolumeSpec {
        name: "sh".into(),
        holder: who.into(),
        create: false,
        takeover: false,
        role: VolumeRole::Share,
    };
    let mut data = rack.store(&rack.addrs(), spec, 2).unwrap();
    if behind {
        data = data.write_behind().unwrap();
    }
    let (fs, shared) = shared::join(data, FsConfig::default(), engine, who.into()).unwrap();
    shared.pause(true);
    Client { fs, shared }
}

/// An exclusive `flock` of a whole file.
fn whole_file_flock() -> FileLock {
    FileLock {
        kind: LockKind::Flock,
        typ: Some(LockType::Write),
        start: 0,
        end: u64::MAX,
        pid: 1,
    }
}

/// The names directory `dir` lists on `fs`, sorted, with their attributes (as `ls -l`: a
/// name whose inode the table does not hold would be left out).
fn listed(fs: &Fs, dir: &str) -> Vec<String> {
    let ino = resolve(fs, dir).unwrap();
    let fh = fs.opendir(ino).unwrap();
    let mut out = Vec::new();
    fs.readdirplus(ino, fh, 0, &mut |e, _| {
        out.push(String::from_utf8(e.name).unwrap());
        true
    })
    .unwrap();
    fs.releasedir(fh);
    out.retain(|n| n != "." && n != "..");
    out.sort();
    out
}

/// Clients "a" and "b" of `engine`, over `rack`.
fn two_clients(rack: &Rack, engine: &Arc<dyn MetaEngine>) -> (Client, Client) {
    (
        client(rack, engine.clone(), "a"),
        client(rack, engine.clone(), "b"),
    )
}

impl Client {
    /// A change, as the FUSE adapter makes it: at the door, in turn.
    fn change<R>(&self, f: impl FnOnce(&Fs) -> R) -> R {
        let _turn = self.fs.admit_change();
        f(&self.fs)
    }

    fn mkdir(&self, path: &str) -> Result<(), i32> {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        self.change(|fs| {
            let p = resolve(fs, dir)?;
            fs.mkdir(p, name.as_bytes(), 0o755, common::ME)
                .map(|_| ())
                .map_err(|e| e.errno)
        })
    }

    fn create(&self, path: &str, data: &[u8]) -> Result<(), i32> {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        let (ino, fh) = self.change(|fs| {
            let p = resolve(fs, dir)?;
            fs.create(
                p,
                name.as_bytes(),
                0o644,
                libc::O_WRONLY | libc::O_EXCL,
                common::ME,
            )
            .map(|(e, fh)| (e.ino, fh))
            .map_err(|e| e.errno)
        })?;
        let r = self.change(|fs| fs.write(ino, fh, 0, data, common::ME).map_err(|e| e.errno));
        self.change(|fs| fs.release(fh));
        r.map(|_| ())
    }

    /// Makes file `name` in the root, open for reading and writing: its inode and handle.
    fn create_open(&self, name: &str) -> (u64, u64) {
        self.change(|fs| fs.create(ROOT_INO, name.as_bytes(), 0o644, libc::O_RDWR, common::ME))
            .map(|(e, fh)| (e.ino, fh))
            .unwrap()
    }

    fn unlink(&self, path: &str) -> Result<(), i32> {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        self.change(|fs| {
            let p = resolve(fs, dir)?;
            fs.unlink(p, name.as_bytes()).map_err(|e| e.errno)
        })
    }

    fn rename(&self, from: &str, to: &str) -> Result<(), i32> {
        self.change(|fs| {
            let (fd, fname) = from.rsplit_once('/').unwrap_or(("", from));
            let (td, tname) = to.rsplit_once('/').unwrap_or(("", to));
            let (fp, tp) = (resolve(fs, fd)?, resolve(fs, td)?);
            fs.rename(fp, fname.as_bytes(), tp, tname.as_bytes(), 0, common::ME)
                .map_err(|e| e.errno)
        })
    }
}

/// As [`client`], on a volume it takes for large (past 0 inodes: `keeper`), told so now.
fn client_of_large(rack: &Rack, engine: Arc<dyn MetaEngine>, who: &str) -> Client {
    let c = client(rack, engine, who);
    c.shared.whole_under(0).unwrap();
    c
}

/// Directories `d0`.. (`dirs` of them) of ten files each, `dD/fF` holding `D/F`.
fn fill_tree(c: &Client, dirs: usize) {
    for d in 0..dirs {
        c.mkdir(&format!("d{d}")).unwrap();
        for f in 0..10 {
            c.create(&format!("d{d}/f{f}"), format!("{d}/{f}").as_bytes())
                .unwrap();
        }
    }
}

/// `c`'s table is the engine's state (a whole table, caught up with a volume no client
/// changes).
fn table_is_the_state(c: &Client) {
    assert_eq!(
        c.fs.namespace_digest(),
        c.shared.engine_state_digest().unwrap()
    );
}

/// Two clients' changes on one history: each sees the other's before its own.
fn two_writers(engine: Arc<dyn MetaEngine>) {
    let rack = Rack::new(2);
    let (a, b) = two_clients(&rack, &engine);
    let free_at_start = rack.free();
    a.mkdir("d").unwrap();
    a.create("d/from-a", &bytes(1, 3 << 20)).unwrap();
    // B's change catches up first: A's directory is there, and so is A's file.
    b.create("d/from-b", b"from b").unwrap();
    assert_eq!(read(&b.fs, "d/from-a").unwrap(), bytes(1, 3 << 20));
    // The same name made by both: one history decides it.
    a.create("d/same", b"a").unwrap();
    assert_eq!(b.create("d/same", b"b"), Err(libc::EEXIST));
    // A's last change caught up with B's file before it.
    assert_eq!(read(&a.fs, "d/from-b").unwrap(), b"from b");
    // A name B makes resolves on A at once (a lookup that finds nothing catches up first).
    b.create("d/late", b"late").unwrap();
    assert_eq!(read(&a.fs, "d/late").unwrap(), b"late");
    // A name B moves away still resolves on A until A polls (or makes a change).
    b.rename("d/from-a", "moved").unwrap();
    assert!(resolve(&a.fs, "d/from-a").is_ok());
    a.shared.poll_now().unwrap();
    assert_eq!(resolve(&a.fs, "d/from-a"), Err(libc::ENOENT));
    assert_eq!(read(&a.fs, "moved").unwrap(), bytes(1, 3 << 20));
    assert_eq!(a.fs.namespace_digest(), b.fs.namespace_digest());

    // B deletes A's file: its memory comes back once both have applied the unlink.
    let before = rack.free();
    b.unlink("moved").unwrap();
    b.shared.poll_now().unwrap();
    // No server has more free (a stock refill answered meanwhile may have taken a little).
    let now = rack.free();
    assert!(
        now.iter().zip(&before).all(|(n, b)| n <= b),
        "freed before A applied the unlink: {now:?} against {before:?}"
    );
    assert!(
        resolve(&a.fs, "moved").is_ok(),
        "A applied it without a poll"
    );
    a.shared.poll_now().unwrap();
    // Three 1 MiB chunks, two copies each; once A, which made the file, has let go of it
    // too (its creation marked it open there until A's poller saw it closed).
    eventually("the unlinked file's memory is back", || {
        a.shared.poll_now().unwrap();
        b.shared.poll_now().unwrap();
        rack.free().iter().sum::<u64>() >= before.iter().sum::<u64>() + (6 << 20)
    });
    for p in ["d/from-b", "d/same", "d/late"] {
        a.unlink(p).unwrap();
    }
    a.change(|fs| fs.rmdir(ROOT_INO, b"d").unwrap());
    b.shared.poll_now().unwrap();
    assert_eq!(a.fs.namespace_digest(), b.fs.namespace_digest());
    assert!(rack.free().iter().sum::<u64>() <= free_at_start.iter().sum::<u64>());
    state_is_every_table(&[&a, &b], "two writers");
}

#[test]
fn two_writers_share_one_history_on_the_in_memory_engine() {
    two_writers(Arc::new(MemEngine::new()));
}

#[test]
fn a_client_whose_heartbeats_stopped_is_fenced() {
    let rack = Rack::new(2);
    let engine = MemEngine::new();
    let a = client(&rack, Arc::new(engine.clone()), "a");
    let c = client(&rack, Arc::new(engine.clone()), "c");
    c.create("c-file", b"before").unwrap();
    // C holds a lock on it; A's owner is refused.
    let file = resolve(&a.fs, "c-file").unwrap();
    let write = whole_file_flock();
    assert!(a.fs.keeps_locks());
    assert_eq!(c.fs.set_lock(file, 7, &write).unwrap(), None);
    let held =
        a.fs.set_lock(file, 8, &write)
            .unwrap()
            .expect("c's lock excludes a");
    assert_eq!(held.who.session, "c");
    assert_eq!(a.fs.test_lock(file, 8, &write).unwrap(), Some(held));
    // C freezes: its heartbeats stop, and its session runs out.
    engine.heartbeat("c", Duration::ZERO).unwrap();
    eventually("c's session ran out", || {
        engine.expired_sessions().unwrap() == vec!["c".to_string()]
    });
    // Its lock holds until it is evicted (a lock of a client still able to write must not
    // go to another).
    assert!(a.fs.set_lock(file, 8, &write).unwrap().is_some());
    // A evicts it: fenced at every server, then forgotten by the engine, its locks dropped.
    a.shared.poll_now().unwrap();
    assert!(engine.expired_sessions().unwrap().is_empty());
    assert_eq!(a.fs.set_lock(file, 8, &write).unwrap(), None);
    // C can take no lock again.
    assert_eq!(c.fs.set_lock(file, 7, &write).unwrap_err().errno, libc::EIO);
    // C's changes fail and land nowhere: the engine refuses its records, the servers its
    // data and allocations.
    assert!(c.create("c-late", b"late").is_err());
    a.shared.poll_now().unwrap();
    assert_eq!(resolve(&a.fs, "c-late"), Err(libc::ENOENT));
    assert_eq!(read(&a.fs, "c-file").unwrap(), b"before");
    let ino = resolve(&c.fs, "c-file").unwrap();
    let wrote = c.change(|fs| {
        let fh = fs.open(ino, libc::O_WRONLY).map_err(|e| e.errno)?;
        let r = fs
            .write(ino, fh, 0, b"AFTER!", common::ME)
            .map_err(|e| e.errno);
        fs.release(fh);
        r
    });
    assert!(wrote.is_err(), "a fenced client's write was answered");
    assert_eq!(read(&a.fs, "c-file").unwrap(), b"before");
}

#[test]
fn two_writers_share_one_history_on_redis() {
    let redis = common::redis::Redis::start();
    let engine = rmemfs::engine::redis::RedisEngine::open(&redis.url, "sh").unwrap();
    two_writers(Arc::new(engine));
}

/// Checkpoints bound the engine's log: after one, a client behind the trim loads it whole
/// (then the changes after it), and a client that joins starts from it; inode numbers go on
/// past the image's.
fn checkpoints(open: impl Fn() -> Arc<dyn MetaEngine>) {
    let rack = Rack::new(2);
    let engine = open();
    let a = client(&rack, open(), "a");
    let b = client(&rack, open(), "b");
    a.mkdir("d").unwrap();
    for i in 0..20 {
        a.create(&format!("d/f{i}"), &bytes(i, 5000)).unwrap();
    }
    // B has applied none of it (its poller is paused). A writes a checkpoint now: the log is
    // trimmed past B.
    a.shared.checkpoint_now().unwrap();
    let ckpt = engine.checkpoint().unwrap().expect("a checkpoint");
    assert_eq!(ckpt.lsn, a.shared.applied());
    assert_eq!(engine.read_after(0, 10).unwrap(), vec![]);
    // B's next change takes the turn and finds the log past a gap: it loads the checkpoint
    // first (it once applied the changes after the gap alone, losing the trimmed ones: those
    // after it here apply cleanly without them).
    a.mkdir("after-dir").unwrap();
    b.mkdir("b-first").unwrap();
    assert_eq!(read(&b.fs, "d/f3").unwrap(), bytes(3, 5000));
    a.create("d/after", b"after").unwrap();
    b.shared.poll_now().unwrap();
    a.shared.poll_now().unwrap();
    assert!(resolve(&a.fs, "b-first").is_ok());
    assert_eq!(b.shared.applied(), a.shared.applied());
    assert_eq!(read(&b.fs, "d/f3").unwrap(), bytes(3, 5000));
    assert_eq!(a.fs.namespace_digest(), b.fs.namespace_digest());
    // A client joining now reads the root's names from the engine's state (no checkpoint,
    // no log), "d"'s when a lookup needs them, the rest in the poller's round.
    let c = client(&rack, open(), "c");
    assert_eq!(c.shared.applied(), a.shared.applied());
    assert!(!c.shared.is_whole());
    assert_eq!(c.fs.inode_count(), 4, "the root and its three names");
    assert_eq!(read(&c.fs, "d/after").unwrap(), b"after");
    c.shared.poll_now().unwrap();
    assert!(c.shared.is_whole());
    assert_eq!(c.fs.namespace_digest(), a.fs.namespace_digest());
    c.create("d/from-c", b"c").unwrap();
    b.create("d/from-b", b"b").unwrap();
    a.shared.poll_now().unwrap();
    assert_eq!(read(&a.fs, "d/from-c").unwrap(), b"c");
    assert_eq!(read(&a.fs, "d/from-b").unwrap(), b"b");
    c.shared.poll_now().unwrap();
    assert_eq!(a.fs.namespace_digest(), c.fs.namespace_digest());
}

#[test]
fn checkpoints_bound_the_log_on_the_in_memory_engine() {
    let engine = MemEngine::new();
    checkpoints(|| Arc::new(engine.clone()));
}

#[test]
fn checkpoints_bound_the_log_on_redis() {
    let redis = common::redis::Redis::start();
    checkpoints(|| Arc::new(rmemfs::engine::redis::RedisEngine::open(&redis.url, "ck").unwrap()));
}

/// The hard races, on real clients whose tables are stale (pollers paused, so each decides
/// on what it saw last): the engine refuses the change decided on a stale view, and the
/// client decides it again on a table caught up, which answers as the log's order does.
#[test]
fn changes_decided_on_stale_tables_are_decided_again() {
    let rack = Rack::new(2);
    let engine: Arc<dyn MetaEngine> = Arc::new(MemEngine::new());
    let (a, b) = two_clients(&rack, &engine);
    for d in [
        "p", "p/a", "p/a/f", "p/a/f/e", "q", "q/b", "q/b/c", "q/b/c/d",
    ] {
        a.mkdir(d).unwrap();
    }
    a.create("x", b"x").unwrap();
    b.shared.poll_now().unwrap();
    // Two moves that together would make a cycle, neither writing an inode the other
    // writes: B's, decided on a table without A's, is refused by the directories its check
    // read, and decided again it is EINVAL (a directory below itself).
    a.rename("p/a", "q/b/c/d/a").unwrap();
    assert_eq!(b.rename("q/b", "p/a/f/e/b"), Err(libc::EINVAL));
    // An unlink racing a move of the same entry: B, stale, unlinks a name A moved away.
    a.rename("x", "y").unwrap();
    assert!(resolve(&b.fs, "x").is_ok(), "b's table is not stale");
    let stale = b.change(|fs| fs.unlink(ROOT_INO, b"x").map_err(|e| e.errno));
    assert_eq!(stale, Err(libc::ENOENT));
    // Two creates of one name, the second client stale.
    a.mkdir("n").unwrap();
    assert_eq!(
        b.change(|fs| fs
            .mkdir(ROOT_INO, b"n", 0o755, common::ME)
            .map(|_| ())
            .map_err(|e| e.errno)),
        Err(libc::EEXIST)
    );
    a.shared.poll_now().unwrap();
    b.shared.poll_now().unwrap();
    assert_eq!(a.fs.namespace_digest(), b.fs.namespace_digest());
    assert_eq!(resolve(&a.fs, "y").map(|_| ()), Ok(()));
    assert_eq!(resolve(&a.fs, "q/b/c/d/a/f/e").map(|_| ()), Ok(()));
}

/// Three clients changing at once, each in a directory of its own and all in one directory,
/// threads of each at once too: every name made once, every client's table the same, no
/// inode number given twice.
/// The engine's state beside its log (shared format 7) holds what every caught-up client's
/// table holds: checked after each kind of change, from two clients (names made by both in
/// one directory, whose link count and times the engine adds up; a directory's attributes
/// set over them; moves of directories; links; extended attributes; truncates; drops).
fn state_is_every_table(clients: &[&Client], when: &str) {
    for c in clients {
        c.shared.poll_now().unwrap();
    }
    let state = clients[0].shared.engine_state_digest().unwrap();
    for c in clients {
        assert_eq!(
            c.fs.namespace_digest(),
            state,
            "{when}: the engine's state against {}'s table",
            c.shared.who()
        );
    }
}

#[test]
fn the_engines_state_holds_every_clients_table() {
    use rmemfs::fs::SetAttr;
    let rack = Rack::new(2);
    let engine: Arc<dyn MetaEngine> = Arc::new(MemEngine::new());
    let (a, b) = two_clients(&rack, &engine);
    state_is_every_table(&[&a, &b], "a new volume");
    a.mkdir("d").unwrap();
    b.shared.poll_now().unwrap();
    for i in 0..4 {
        a.create(&format!("d/a{i}"), &bytes(i, 100)).unwrap();
        b.mkdir(&format!("d/b{i}")).unwrap();
    }
    a.create("big", &bytes(9, 3 << 20)).unwrap();
    state_is_every_table(&[&a, &b], "names made by both in one directory");
    // The directory's attributes set over the stamps of both clients' names; then more.
    let d = resolve(&b.fs, "d").unwrap();
    let chmod = SetAttr {
        mode: Some(0o700),
        ..Default::default()
    };
    b.change(|fs| fs.setattr(d, &chmod, common::ME)).unwrap();
    a.mkdir("d/after").unwrap();
    state_is_every_table(&[&a, &b], "a directory's attributes, then a name");
    b.rename("d/b1", "b1-moved").unwrap();
    a.rename("d/b2", "d/b0/b2-in").unwrap();
    let f = resolve(&a.fs, "d/a0").unwrap();
    a.change(|fs| fs.link(f, ROOT_INO, b"a0-link")).unwrap();
    b.change(|fs| fs.symlink(ROOT_INO, b"sym", b"d/a1", common::ME))
        .unwrap();
    let f1 = resolve(&b.fs, "d/a1").unwrap();
    b.change(|fs| fs.setxattr(f1, b"user.one", b"1", 0, common::ME))
        .unwrap();
    b.change(|fs| fs.setxattr(f1, b"user.two", b"2", 0, common::ME))
        .unwrap();
    state_is_every_table(&[&a, &b], "moves, links, extended attributes");
    b.change(|fs| fs.removexattr(f1, b"user.one")).unwrap();
    let big = resolve(&b.fs, "big").unwrap();
    let cut = SetAttr {
        size: Some((1 << 20) + 7),
        ..Default::default()
    };
    b.change(|fs| fs.setattr(big, &cut, common::ME)).unwrap();
    a.unlink("d/a2").unwrap();
    a.unlink("d/a0").unwrap();
    b.change(|fs| fs.rmdir(d, b"b3")).unwrap();
    state_is_every_table(&[&a, &b], "a truncate, drops");
    // A client joining now reads the same.
    let c = client(&rack, engine.clone(), "c");
    state_is_every_table(&[&a, &b, &c], "after a join");
}

#[test]
fn three_clients_change_at_once() {
    const EACH: usize = 60;
    let rack = Rack::new(2);
    let engine: Arc<dyn MetaEngine> = Arc::new(MemEngine::new());
    let clients: Vec<Arc<Client>> = ["a", "b", "c"]
        .iter()
        .map(|w| Arc::new(client(&rack, engine.clone(), w)))
        .collect();
    clients[0].mkdir("all").unwrap();
    for (i, c) in clients.iter().enumerate() {
        c.mkdir(&format!("own{i}")).unwrap();
    }
    let threads: Vec<_> = clients
        .iter()
        .enumerate()
        .flat_map(|(i, c)| {
            (0..2).map(move |t| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for n in 0..EACH {
                        let name = format!("{i}-{t}-{n}");
                        c.create(&format!("own{i}/{name}"), name.as_bytes())
                            .unwrap();
                        c.create(&format!("all/{name}"), name.as_bytes()).unwrap();
                        if n % 3 == 0 {
                            c.unlink(&format!("all/{name}")).unwrap();
                        }
                    }
                })
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for c in &clients {
        c.shared.poll_now().unwrap();
    }
    let digest = clients[0].fs.namespace_digest();
    for c in &clients[1..] {
        assert_eq!(c.fs.namespace_digest(), digest);
    }
    let all: Vec<&Client> = clients.iter().map(|c| &**c).collect();
    state_is_every_table(&all, "three clients at once");
    for (i, c) in clients.iter().enumerate() {
        for t in 0..2 {
            for n in 0..EACH {
                let name = format!("{i}-{t}-{n}");
                assert_eq!(
                    read(&c.fs, &format!("own{i}/{name}")).unwrap(),
                    name.as_bytes()
                );
                let in_all = read(&c.fs, &format!("all/{name}"));
                match n % 3 {
                    0 => assert_eq!(in_all, Err(libc::ENOENT)),
                    _ => assert_eq!(in_all.unwrap(), name.as_bytes()),
                }
            }
        }
    }
    // No inode number made twice in the log.
    let mut made = std::collections::HashSet::new();
    for (lsn, bytes) in engine.read_after(0, 100_000).unwrap() {
        let read = rmemfs::meta::record::read(&bytes, 0);
        for (_, changes) in read.records {
            for c in changes {
                if let rmemfs::meta::Change::Make { ino, .. } = c {
                    assert!(made.insert(ino), "inode {ino} made twice (change {lsn})");
                }
            }
        }
    }
    assert!(made.len() > 3 * 2 * EACH * 2);
}

/// A client of this build joining `engine` (a volume of format `found`) while a client of
/// that format, "old", is live: refused, naming it and both formats, the volume left as it
/// was; then "old" leaves.
fn refused_beside_an_old_client(rack: &Rack, engine: &MemEngine, found: u32) {
    engine
        .start_session("old", Duration::from_secs(60))
        .unwrap();
    let spec = VolumeSpec {
        name: "sh".into(),
        holder: "new".into(),
        create: false,
        takeover: false,
        role: VolumeRole::Share,
    };
    let data = rack.store(&rack.addrs(), spec, 2).unwrap();
    let refused = shared::join(
        data,
        FsConfig::default(),
        Arc::new(engine.clone()),
        "new".into(),
    );
    let why = refused.err().expect("joined beside a live older client");
    let ours = format!("format {}", rmemfs::engine::SHARED_FORMAT);
    assert!(
        why.contains("old") && why.contains(&format!("format {found}")) && why.contains(&ours),
        "{why}"
    );
    let kept = engine.format().unwrap();
    assert!(
        kept.unwrap_or(1) == found,
        "upgraded beside a live client: {kept:?}"
    );
    engine.drop_session("old").unwrap();
    // The refused join's session goes too (it would count as a live client).
    engine.drop_session("new").unwrap();
}

/// A volume made by a client of shared format 1 is upgraded by the first client of format 2
/// when no other client is live, and refused (naming the live one and both formats) while
/// one is; a volume of a newer format is refused.
#[test]
fn format_1_volumes_are_upgraded_when_no_old_client_is_live() {
    let rack = Rack::new(2);
    let engine = MemEngine::format_1(&[]);
    refused_beside_an_old_client(&rack, &engine, 1);
    let c = client(&rack, Arc::new(engine.clone()), "new");
    assert_eq!(
        engine.format().unwrap(),
        Some(rmemfs::engine::SHARED_FORMAT)
    );
    c.mkdir("d").unwrap();
    assert!(resolve(&c.fs, "d").is_ok());
}

/// A volume of format 2 (a build before files open were marked: its clients drop a file
/// another client has open) is upgraded by this build only once no other client is live:
/// the two never write it at once.
///
/// So is one of format 5 (a build before versions were trimmed: its clients read a trimmed
/// version as never touched, and would take a change decided on a table older than it).
#[test]
fn format_2_and_5_volumes_are_upgraded_when_no_old_client_is_live() {
    for found in [2, 5] {
        let rack = Rack::new(2);
        let engine = MemEngine::of_format(found, &[]);
        refused_beside_an_old_client(&rack, &engine, found);
        let c = client(&rack, Arc::new(engine.clone()), "new");
        assert_eq!(
            engine.format().unwrap(),
            Some(rmemfs::engine::SHARED_FORMAT)
        );
        c.mkdir("d").unwrap();
    }
}

/// A volume of format 6 (no state beside its log), whose history knows both servers'
/// births and has files on them, is upgraded by the first client of this build: it writes
/// its table as the state, every server's birth kept (one place, a field each), and a client
/// joining after holds what the others do.
#[test]
fn a_format_6_volume_gets_its_state_from_the_first_new_client() {
    let rack = Rack::new(2);
    let mem = MemEngine::new();
    let engine: Arc<dyn MetaEngine> = Arc::new(mem.clone());
    {
        let old = client(&rack, engine.clone(), "old");
        old.mkdir("d").unwrap();
        for i in 0..4 {
            old.create(&format!("d/f{i}"), &bytes(i, 5000)).unwrap();
        }
        old.shared.poll_now().unwrap();
    }
    mem.without_state(6);
    let new = client(&rack, engine.clone(), "new");
    assert_eq!(
        engine.format().unwrap(),
        Some(rmemfs::engine::SHARED_FORMAT)
    );
    assert!(engine.state_whole().unwrap());
    let born = engine.state().unwrap()["s:born"].clone();
    let servers: std::collections::BTreeSet<Vec<u8>> = born
        .keys()
        .map(|k| k.splitn(2, |b| *b == b':').nth(1).unwrap().to_vec())
        .collect();
    assert_eq!(servers.len(), 2, "both servers' births: {born:?}");
    let late = client(&rack, engine, "late");
    assert!(!late.shared.is_whole());
    assert_eq!(read(&late.fs, "d/f3").unwrap(), bytes(3, 5000));
    state_is_every_table(&[&new, &late], "a volume upgraded from format 6");
}

/// A volume of format 4 (a build before names had keys of their own: its clients check a
/// change of a directory against its one version, and cannot read a directory's stamp) is
/// upgraded only once no format-4 client is live, and its log, written as that build wrote
/// it (the directory's attributes whole, a new entry with its cookie), is read by this one.
#[test]
fn format_4_volumes_are_upgraded_and_their_log_read() {
    use rmemfs::engine::{Marks, Touch};
    use rmemfs::meta::{record, Body, Change, Dir, Inode, Kind, Meta};
    let rack = Rack::new(2);
    let engine = MemEngine::of_format(4, &[]);
    engine
        .start_session("old", Duration::from_secs(60))
        .unwrap();
    // A directory made by a format-4 client (a table whose journal keeps exact attributes).
    let (record, made) = {
        let mut old = Meta::new(0o755, 0, 0);
        let mut b = old.batch();
        let made = b.make(Inode::new(
            Kind::Dir,
            0o755,
            0,
            0,
            Body::Dir(Box::new(Dir::new(ROOT_INO))),
        ));
        b.insert_entry(ROOT_INO, b"old", made).unwrap();
        b.stamp_dir(ROOT_INO, 1).unwrap();
        let changes = b.changes().to_vec();
        assert!(changes.iter().any(|c| matches!(c, Change::EntryAt { .. })));
        assert!(changes.iter().any(|c| matches!(
            c,
            Change::Attrs { ino, attrs } if *ino == ROOT_INO && attrs.nlink == 3
        )));
        (record::encode(0, &changes), made)
    };
    let touched = [Touch::exclusive(ROOT_INO, 0), Touch::exclusive(made, 0)];
    engine
        .append(
            "old",
            &record,
            &touched,
            &[],
            Marks::default(),
            Duration::from_secs(60),
        )
        .unwrap();
    refused_beside_an_old_client(&rack, &engine, 4);
    let engine: Arc<dyn MetaEngine> = Arc::new(engine);
    let (a, b) = (
        client(&rack, engine.clone(), "new"),
        client(&rack, engine.clone(), "other"),
    );
    assert_eq!(
        engine.format().unwrap(),
        Some(rmemfs::engine::SHARED_FORMAT)
    );
    // The old directory is there, and both new clients add names to it and to the root.
    assert_eq!(resolve(&a.fs, "old"), Ok(made));
    a.mkdir("old/x").unwrap();
    b.mkdir("old/y").unwrap();
    b.mkdir("z").unwrap();
    for c in [&a, &b] {
        c.fs.refresh_shared();
        assert!(resolve(&c.fs, "old/x").is_ok() && resolve(&c.fs, "old/y").is_ok());
        let root = c.fs.getattr(ROOT_INO).unwrap();
        assert_eq!(root.nlink, 4, "the root's links: . .. old z");
        assert_eq!(c.fs.getattr(made).unwrap().nlink, 4, "old's links");
    }
    state_is_every_table(&[&a, &b], "a volume upgraded from format 4");
}

/// A write whose change the engine refused (unreachable) leaves nothing behind on its client:
/// the chunk it allocated is not in that client's map (else the client's retry writes into a
/// chunk no other client knows, and they read a hole) and its memory goes back. Writes are
/// appended at once here (held back, a refusal fails the fsync: the next test).
#[test]
fn a_refused_write_leaves_nothing_behind() {
    let rack = Rack::new(2);
    let mem = MemEngine::new();
    let engine: Arc<dyn MetaEngine> = Arc::new(mem.clone());
    let (a, b) = two_clients(&rack, &engine);
    a.shared.hold_writes(false);
    let free_at_start = rack.free();
    let (ino, fh) = a.create_open("f");
    let data = bytes(7, 1 << 20);
    mem.fail_next("append", 1);
    let refused = a.change(|fs| fs.write(ino, fh, 0, &data, common::ME));
    assert_eq!(refused.map_err(|e| e.errno), Err(libc::EIO));
    // Nothing of the refused write is held: its chunk went back.
    eventually("the refused write's chunk is back", || {
        a.shared.poll_now().unwrap();
        b.shared.poll_now().unwrap();
        rack.free() == free_at_start
    });
    // The application writes again; every client reads what it wrote.
    a.change(|fs| fs.write(ino, fh, 0, &data, common::ME))
        .unwrap();
    a.change(|fs| fs.release(fh));
    b.shared.poll_now().unwrap();
    assert_eq!(read(&b.fs, "f").unwrap(), data);
    assert_eq!(a.fs.namespace_digest(), b.fs.namespace_digest());
    a.unlink("f").unwrap();
    eventually("the file's memory is back", || {
        a.shared.poll_now().unwrap();
        b.shared.poll_now().unwrap();
        rack.free() == free_at_start
    });
}

/// Writes held back (a write's size and new chunks, in the file's turn): a write appends
/// nothing; `fsync` appends it, and another client then reads every byte; a change this
/// client makes next carries the writes before it (a client that sees the change sees
/// them); an append the engine refuses at `fsync` fails that `fsync` and is kept, sent by
/// the next one; a close sends them too.
#[test]
fn writes_held_back_reach_the_engine_before_what_follows_them() {
    let rack = Rack::new(2);
    let mem = MemEngine::new();
    let engine: Arc<dyn MetaEngine> = Arc::new(mem.clone());
    let (a, b) = two_clients(&rack, &engine);
    // Held writes are sent by this test's own requests only (a stall of the test past the
    // 50 ms linger let the lingering thread send them, or use up the armed fault, first).
    a.shared.pause_linger(true);
    let (ino, fh) = a.create_open("f");
    let size_on_b = |b: &Client| {
        b.shared.poll_now().unwrap();
        b.fs.getattr(ino).map(|a| a.size).unwrap_or(u64::MAX)
    };
    // Held back: the engine's log does not grow.
    let head = engine.head().unwrap();
    let one = bytes(1, 3 << 20);
    a.change(|fs| fs.write(ino, fh, 0, &one, common::ME))
        .unwrap();
    assert_eq!(engine.head().unwrap(), head, "a write was appended at once");
    assert_eq!(size_on_b(&b), 0);
    // fsync appends it: B reads every byte.
    a.fs.fsync(ino).unwrap().unwrap();
    assert!(engine.head().unwrap() > head);
    assert_eq!(size_on_b(&b), one.len() as u64);
    assert_eq!(read(&b.fs, "f").unwrap(), one);
    // A write, then a change of another file: the change carries the write before it.
    let two = bytes(2, 1 << 20);
    a.change(|fs| fs.write(ino, fh, one.len() as u64, &two, common::ME))
        .unwrap();
    a.create("after", b"x").unwrap();
    assert!(resolve(&b.fs, "after").is_ok()); // B caught up with A's create
    assert_eq!(size_on_b(&b), (one.len() + two.len()) as u64);
    // Refused at fsync: the fsync fails, the write is kept and the next fsync sends it.
    let three = bytes(3, 1 << 20);
    let at = (one.len() + two.len()) as u64;
    a.change(|fs| fs.write(ino, fh, at, &three, common::ME))
        .unwrap();
    mem.fail_next("append", 1);
    assert_eq!(
        a.fs.fsync(ino).unwrap().map_err(|e| e.errno),
        Err(libc::EIO)
    );
    a.fs.fsync(ino).unwrap().unwrap();
    assert_eq!(size_on_b(&b), at + three.len() as u64);
    // A close sends what is held back.
    let four = bytes(4, 4096);
    let at = at + three.len() as u64;
    a.change(|fs| fs.write(ino, fh, at, &four, common::ME))
        .unwrap();
    a.change(|fs| fs.release(fh));
    let whole = [one, two, three, four].concat();
    assert_eq!(size_on_b(&b), whole.len() as u64);
    assert_eq!(read(&b.fs, "f").unwrap(), whole);
    assert_eq!(a.fs.namespace_digest(), b.fs.namespace_digest());
}

/// A shared client writes behind (`data::behind`): a small write is answered before its
/// bytes are on the copies, and they are sent before the append that names its chunks, held
/// back or made at once, so another client reads them as soon as it has the record (no
/// worker runs here: only those appends send them).
#[test]
fn written_behind_bytes_are_on_the_copies_before_the_append_that_names_them() {
    let rack = Rack::new(2);
    let engine: Arc<dyn MetaEngine> = Arc::new(MemEngine::new());
    let a = client_with(&rack, engine.clone(), "a", true);
    let b = client(&rack, engine.clone(), "b");
    a.shared.pause_linger(true);
    let (ino, fh) = a.create_open("f");
    let deferred = || a.fs.data().write_behind_stats().deferred;
    let before = deferred();
    // Held back, then carried by the next append (another file's create).
    let one = bytes(1, 4096);
    a.change(|fs| fs.write(ino, fh, 0, &one, common::ME))
        .unwrap();
    assert_eq!(
        deferred(),
        before + 1,
        "the write was sent before its answer"
    );
    a.create("after", b"x").unwrap();
    b.shared.poll_now().unwrap();
    assert_eq!(read(&b.fs, "f").unwrap(), one);
    // Appended at once: its writer sends it first.
    a.shared.hold_writes(false);
    let before = deferred();
    let two = bytes(2, 4096);
    let head = engine.head().unwrap();
    a.change(|fs| fs.write(ino, fh, 4096, &two, common::ME))
        .unwrap();
    assert_eq!(
        deferred(),
        before + 1,
        "the write was sent before its answer"
    );
    assert!(engine.head().unwrap() > head, "the write was held back");
    b.shared.poll_now().unwrap();
    assert_eq!(read(&b.fs, "f").unwrap(), [one, two].concat());
    a.change(|fs| fs.release(fh));
    assert_eq!(a.fs.data().write_behind_stats().failed, 0);
}

/// A write answered before it was sent whose send finds a copy's server gone: the copy is
/// taken out and the bytes go to the others, and that change goes in the append that names
/// the write, so the other client's map names no copy without the write's bytes.
#[test]
fn a_send_that_lost_a_copy_after_the_answer_takes_it_out_for_every_client() {
    let mut rack = Rack::new(3);
    let engine: Arc<dyn MetaEngine> = Arc::new(MemEngine::new());
    let a = client_with(&rack, engine.clone(), "a", true);
    let b = client(&rack, engine.clone(), "b");
    a.shared.pause_linger(true);
    let (ino, fh) = a.create_open("f");
    let one = bytes(1, 4096);
    a.change(|fs| fs.write(ino, fh, 0, &one, common::ME))
        .unwrap();
    let file = a.fs.files_by_ino().into_iter().find(|(i, _)| *i == ino);
    let copies: Vec<u32> = file
        .expect("f has data")
        .1
        .chunks
        .read()
        .get(&0)
        .unwrap()
        .replicas()
        .iter()
        .map(|r| r.server)
        .collect();
    assert_eq!(copies.len(), 2, "{copies:?}");
    rack.stop(copies[0] as usize);
    a.create("after", b"x").unwrap();
    b.shared.poll_now().unwrap();
    assert_eq!(read(&b.fs, "f").unwrap(), one);
    common::rack::assert_same(&b.fs.namespace_digest(), &a.fs.namespace_digest());
    let on_b = b.fs.files_by_ino().into_iter().find(|(i, _)| *i == ino);
    let chunks = on_b.expect("f has data on B").1;
    let chunk = chunks.chunks.read().get(&0).cloned().unwrap();
    assert!(chunk.on(copies[0]).is_none(), "B's map names the lost copy");
    a.change(|fs| fs.release(fh));
}

/// Appends of held-back writes that the engine took but whose answer was lost (Redis killed
/// as it answered): found in the log, by a catch-up or by the next append, they count as
/// appended. The client does not stop itself as if another client had changed the file, its
/// table neither applies them a second time (over writes made since) nor loses them, and a
/// change that carried them is applied from the log.
#[test]
fn held_writes_whose_answer_was_lost_are_found_in_the_log() {
    let rack = Rack::new(2);
    let mem = MemEngine::new();
    let engine: Arc<dyn MetaEngine> = Arc::new(mem.clone());
    let (a, b) = two_clients(&rack, &engine);
    // The append's own look at the log (`a_change_whose_answer_was_lost_is_answered_by_the_log`)
    // fails here, once: what follows when the engine is away past it.
    a.shared.lost_answer_wait(Duration::ZERO);
    // Held writes are sent by this test's requests only, not by the lingering thread (which
    // could use up the armed faults first if the test stalled).
    a.shared.pause_linger(true);
    let (ino, fh) = a.create_open("f");
    let size = |c: &Client| c.fs.getattr(ino).unwrap().size;
    let mut whole = Vec::new();
    let write = |whole: &mut Vec<u8>, seed: u64| {
        let data = bytes(seed, 8192);
        a.change(|fs| fs.write(ino, fh, whole.len() as u64, &data, common::ME))
            .unwrap();
        whole.extend_from_slice(&data);
        whole.len() as u64
    };
    let lose_answer = || {
        mem.fail_next("append_answer", 1);
        mem.fail_next("read_after", 1);
    };
    let lost_fsync = || {
        lose_answer();
        assert_eq!(
            a.fs.fsync(ino).unwrap().map_err(|e| e.errno),
            Err(libc::EIO)
        );
    };
    // Found by a catch-up, with a write held since: the log's copy of the first does not take
    // the size back.
    write(&mut whole, 1);
    lost_fsync();
    let now = write(&mut whole, 2);
    a.shared.poll_now().unwrap();
    assert_eq!(size(&a), now);
    a.fs.fsync(ino).unwrap().unwrap();
    // Found by the next append (no catch-up first).
    write(&mut whole, 3);
    lost_fsync();
    let now = write(&mut whole, 4);
    a.fs.fsync(ino).unwrap().unwrap();
    assert_eq!(size(&a), now);
    b.shared.poll_now().unwrap();
    assert_eq!(read(&b.fs, "f").unwrap(), whole);
    // Carried by a mkdir: the mkdir fails here (undone), its catch-up finds both in the log.
    let now = write(&mut whole, 5);
    lose_answer();
    let _ = a.mkdir("d"); // EIO, then EEXIST on the retry: the engine has it (as NFS's retries)
    a.shared.poll_now().unwrap();
    assert!(
        resolve(&a.fs, "d").is_ok(),
        "the mkdir carried with the writes is lost"
    );
    assert_eq!(size(&a), now);
    a.fs.fsync(ino).unwrap().unwrap();
    // Still changing the volume, and agreeing with B.
    a.create("after", b"x").unwrap();
    b.shared.poll_now().unwrap();
    assert_eq!(read(&b.fs, "f").unwrap(), whole);
    assert!(resolve(&b.fs, "d").is_ok() && resolve(&b.fs, "after").is_ok());
    assert_eq!(a.fs.namespace_digest(), b.fs.namespace_digest());
}

/// A change the engine took but whose answer was lost (Redis killed as it answered, the
/// connection cut) is answered by the log: the append reads it there, waiting for the engine
/// if it is away. An O_EXCL create succeeds once (before: EIO, and EEXIST when tried again),
/// and neither client applies a change twice.
#[test]
fn a_change_whose_answer_was_lost_is_answered_by_the_log() {
    let rack = Rack::new(2);
    let mem = MemEngine::new();
    let engine: Arc<dyn MetaEngine> = Arc::new(mem.clone());
    let (a, b) = two_clients(&rack, &engine);
    let head = engine.head().unwrap();
    mem.fail_next("append_answer", 1);
    a.mkdir("d").unwrap();
    assert_eq!(engine.head().unwrap(), head + 1, "not appended once");
    // The create's own append loses its answer, and the log cannot be read at first.
    mem.fail_next("append_answer", 1);
    mem.fail_next("read_after", 2);
    a.create("d/f", b"data").unwrap();
    mem.fail_next("append_answer", 1);
    a.unlink("d/f").unwrap();
    mem.fail_next("append_answer", 1);
    a.create("d/g", b"kept").unwrap();
    // Not taken at all (the engine never reached, also when tried again): the change
    // fails, and is not there.
    mem.fail_next("append", 2);
    assert_eq!(a.mkdir("e").map_err(|e| e == libc::EIO), Err(true));
    a.shared.poll_now().unwrap();
    b.shared.poll_now().unwrap();
    assert_eq!(resolve(&a.fs, "e"), Err(libc::ENOENT));
    assert_eq!(resolve(&b.fs, "d/f"), Err(libc::ENOENT));
    assert_eq!(read(&b.fs, "d/g").unwrap(), b"kept");
    assert_eq!(a.fs.namespace_digest(), b.fs.namespace_digest());
    // Both go on changing it.
    a.mkdir("e").unwrap();
    b.create("e/h", b"b").unwrap();
    a.shared.poll_now().unwrap();
    assert_eq!(read(&a.fs, "e/h").unwrap(), b"b");
    assert_eq!(a.fs.namespace_digest(), b.fs.namespace_digest());
}

/// A held-back write that moved the file's first chunk to a larger one: the old chunk's
/// memory is freed only once the write is appended (another client, whose table still names
/// the old chunk, reads its bytes there meanwhile), and then it is.
#[test]
fn a_moved_chunk_is_freed_once_its_write_is_appended() {
    let rack = Rack::new(2);
    let engine: Arc<dyn MetaEngine> = Arc::new(MemEngine::new());
    let (a, b) = two_clients(&rack, &engine);
    let (ino, fh) = a.create_open("f");
    // Past the stock's lengths (granted ahead, which would move the free figures).
    const FIRST: usize = 80 << 10;
    let first = bytes(1, FIRST);
    a.change(|fs| fs.write(ino, fh, 0, &first, common::ME))
        .unwrap();
    a.fs.fsync(ino).unwrap().unwrap();
    b.shared.poll_now().unwrap();
    assert_eq!(read(&b.fs, "f").unwrap(), first);
    let head = engine.head().unwrap();
    let second = bytes(2, FIRST);
    a.change(|fs| fs.write(ino, fh, FIRST as u64, &second, common::ME))
        .unwrap();
    assert_eq!(
        engine.head().unwrap(),
        head,
        "the move was appended at once"
    );
    let held = rack.free();
    // B reads by the old map: the old chunk's bytes, still there.
    b.shared.poll_now().unwrap();
    assert_eq!(read(&b.fs, "f").unwrap(), first);
    assert_eq!(
        rack.free(),
        held,
        "memory went back before the write was appended"
    );
    a.fs.fsync(ino).unwrap().unwrap();
    let freed: Vec<u64> = held.iter().map(|f| f + FIRST as u64).collect();
    eventually("the old chunk is freed", || {
        a.shared.poll_now().unwrap();
        b.shared.poll_now().unwrap();
        rack.free() == freed
    });
    assert_eq!(read(&b.fs, "f").unwrap(), [first, second].concat());
    a.change(|fs| fs.release(fh));
}

/// Writes held back on one client, and another client writes the same file: the turn goes
/// back only after the writes are appended, so the second writer's append lands after them
/// and both clients end with the same bytes and size.
#[test]
fn a_turn_goes_back_after_the_writes_held_in_it() {
    let rack = Rack::new(2);
    let engine: Arc<dyn MetaEngine> = Arc::new(MemEngine::new());
    let (a, b) = two_clients(&rack, &engine);
    let (ino, fh) = a.create_open("f");
    let first = bytes(5, 256 << 10);
    a.change(|fs| fs.write(ino, fh, 0, &first, common::ME))
        .unwrap();
    // B appends after A's bytes: it must take the file's turn, which A gives back once its
    // write is appended.
    b.shared.poll_now().unwrap();
    let bfh = b
        .change(|fs| fs.open(ino, libc::O_WRONLY | libc::O_APPEND))
        .unwrap();
    let second = bytes(6, 4096);
    b.change(|fs| fs.write(ino, bfh, 0, &second, common::ME))
        .unwrap();
    b.change(|fs| fs.release(bfh));
    a.change(|fs| fs.release(fh));
    a.shared.poll_now().unwrap();
    let whole = [first, second].concat();
    assert_eq!(read(&a.fs, "f").unwrap(), whole);
    assert_eq!(read(&b.fs, "f").unwrap(), whole);
    assert_eq!(a.fs.namespace_digest(), b.fs.namespace_digest());
}

/// A lock released while the engine could not be reached (a close during a Redis blip) is
/// released once it can: another client's lock is not kept waiting for good.
#[test]
fn a_lock_release_the_engine_missed_is_sent_again() {
    let rack = Rack::new(2);
    let mem = MemEngine::new();
    let engine: Arc<dyn MetaEngine> = Arc::new(mem.clone());
    let (a, b) = two_clients(&rack, &engine);
    a.create("f", b"locked").unwrap();
    b.shared.poll_now().unwrap();
    let file = resolve(&a.fs, "f").unwrap();
    let write = whole_file_flock();
    assert_eq!(a.fs.set_lock(file, 7, &write).unwrap(), None);
    assert!(b.fs.set_lock(file, 8, &write).unwrap().is_some());
    // The close's release does not reach the engine.
    mem.fail_next("swap_locks", 1);
    assert!(a.fs.release_locks(file, 7, LockKind::Flock).is_err());
    // A's next poll sends it again.
    a.shared.poll_now().unwrap();
    assert_eq!(b.fs.set_lock(file, 8, &write).unwrap(), None);
    // And a release that waits does not undo a lock A takes after it.
    assert!(a.fs.set_lock(file, 7, &write).unwrap().is_some());
    b.fs.release_locks(file, 8, LockKind::Flock).unwrap();
    mem.fail_next("swap_locks", 1);
    assert_eq!(
        a.fs.set_lock(file, 7, &write).map_err(|e| e.errno),
        Err(libc::EIO)
    );
    assert_eq!(a.fs.set_lock(file, 7, &write).unwrap(), None);
    a.shared.poll_now().unwrap();
    assert!(b.fs.set_lock(file, 8, &write).unwrap().is_some());
}

/// A lock taken is answered only once the table has caught up, so it shows what the lock's
/// last holder changed before letting go, even when the first reads of the engine fail; a
/// client that cannot catch up (stopped) lets the lock go again and answers EIO, never a
/// lock over a stale view.
#[test]
fn a_lock_is_answered_only_once_the_table_caught_up() {
    let (_rack, mem, a, b, file) = renamed_under_a_lock();
    let write = whole_file_flock();
    mem.fail_next("read_after", 2);
    assert_eq!(b.fs.set_lock(file, 8, &write).unwrap(), None);
    // A name found is not looked for again: "x" would still be there on a stale table.
    assert_eq!(resolve(&b.fs, "x"), Err(libc::ENOENT));
    b.fs.release_locks(file, 8, LockKind::Flock).unwrap();
    // A stops: the engine lost changes it applied.
    a.create("one", b"1").unwrap();
    a.create("two", b"2").unwrap();
    a.shared.poll_now().unwrap();
    mem.lose_last(2);
    assert!(a.shared.poll_now().is_err());
    assert_eq!(
        a.fs.set_lock(file, 7, &write).map_err(|e| e.errno),
        Err(libc::EIO)
    );
    assert_eq!(b.fs.set_lock(file, 8, &write).unwrap(), None, "a let it go");
}

/// Two clients of one volume with files `f` and `x`: A took a flock of `f`, renamed `x` to
/// `y` and let go, while B's table (caught up before) still holds `x`. The rack, the engine,
/// A, B and `f`.
fn renamed_under_a_lock() -> (Rack, MemEngine, Client, Client, u64) {
    let rack = Rack::new(2);
    let mem = MemEngine::new();
    let engine: Arc<dyn MetaEngine> = Arc::new(mem.clone());
    let (a, b) = two_clients(&rack, &engine);
    a.create("f", b"locked").unwrap();
    a.create("x", b"x").unwrap();
    b.shared.poll_now().unwrap();
    let file = resolve(&a.fs, "f").unwrap();
    assert_eq!(a.fs.set_lock(file, 7, &whole_file_flock()).unwrap(), None);
    a.rename("x", "y").unwrap();
    a.fs.release_locks(file, 7, LockKind::Flock).unwrap();
    assert!(
        resolve(&b.fs, "x").is_ok(),
        "b's table is stale before the lock"
    );
    (rack, mem, a, b, file)
}

/// A lock's answer goes once the kernel was told what the lock's last holder changed, from
/// the thread that tells it: the request's own thread does not wait for it (the kernel's
/// invalidation of a name may wait for a directory lock held by a request queued behind it
/// on a FUSE ring: a deadlock, seen in the shared model check).
#[test]
fn a_granted_lock_is_answered_after_the_kernel_was_told_without_waiting_for_it() {
    use rmemfs::fs::Invalidation;
    use std::sync::mpsc;
    let (_rack, _mem, _a, b, file) = renamed_under_a_lock();
    // B's kernel, here: told names one batch at a time, each batch held until the test
    // lets it go (as the kernel holds an invalidation while a lookup holds the directory).
    let (told_tx, told) = mpsc::channel::<Vec<Invalidation>>();
    let (go, go_rx) = mpsc::channel::<()>();
    let go_rx = std::sync::Mutex::new(go_rx);
    b.fs.on_followed(Box::new(move |batch| {
        let _ = go_rx.lock().unwrap().recv_timeout(Duration::from_secs(10));
        let _ = told_tx.send(batch.to_vec());
    }));
    assert_eq!(b.fs.set_lock(file, 8, &whole_file_flock()).unwrap(), None);
    let (answered_tx, answered) = mpsc::channel();
    b.fs.tell_kernel_then(Box::new(move |ok| {
        let _ = answered_tx.send(ok);
    }));
    // Returned while the kernel is still being told (the telling thread waits for `go`).
    assert!(
        answered.try_recv().is_err(),
        "answered before the kernel was told"
    );
    go.send(()).unwrap();
    let batch = told.recv_timeout(Duration::from_secs(10)).unwrap();
    let names: Vec<&[u8]> = batch
        .iter()
        .filter_map(|i| match i {
            Invalidation::Entry { name, .. } => Some(&name[..]),
            Invalidation::Inode(_) => None,
        })
        .collect();
    assert!(names.contains(&&b"x"[..]), "told {batch:?}");
    assert_eq!(answered.recv_timeout(Duration::from_secs(10)), Ok(true));
}

/// The engine lost changes a client had applied (Redis restarted from an AOF written every
/// second, or a replica was promoted before it had them), and another client appended past
/// them: the first client stops with EIO naming the loss, rather than apply the others'
/// changes over ones the log no longer holds (a name would open another file's bytes).
#[test]
fn a_client_stops_when_the_engine_lost_changes_it_applied() {
    let rack = Rack::new(2);
    let mem = MemEngine::new();
    let engine: Arc<dyn MetaEngine> = Arc::new(mem.clone());
    let (a, b) = two_clients(&rack, &engine);
    a.create("kept", b"kept").unwrap();
    b.shared.poll_now().unwrap();
    a.create("lost-1", b"1").unwrap();
    a.create("lost-2", b"2").unwrap();
    a.shared.poll_now().unwrap();
    let head = engine.head().unwrap();
    mem.lose_last(4);
    // B never saw the lost changes; it goes on past them.
    for i in 0..4 {
        b.create(&format!("after-{i}"), b"b").unwrap();
    }
    assert!(engine.head().unwrap() > head);
    let why = a.shared.poll_now().unwrap_err();
    assert!(why.contains("lost"), "{why}");
    assert_eq!(a.create("x", b"x"), Err(libc::EIO));
    assert_eq!(a.mkdir("d"), Err(libc::EIO));
    // A client that joins now sees the engine's history, B's changes on it.
    let c = client(&rack, engine, "c");
    for i in 0..4 {
        assert_eq!(read(&c.fs, &format!("after-{i}")).unwrap(), b"b");
    }
    assert_eq!(read(&c.fs, "kept").unwrap(), b"kept");
    assert_eq!(resolve(&c.fs, "lost-1"), Err(libc::ENOENT));
}

/// The same loss seen before anyone appended past it: the engine's log ends before the
/// client's table does.
#[test]
fn a_client_stops_when_the_engine_log_ends_before_its_table() {
    let rack = Rack::new(2);
    let mem = MemEngine::new();
    let engine: Arc<dyn MetaEngine> = Arc::new(mem.clone());
    let a = client(&rack, engine, "a");
    a.create("one", b"1").unwrap();
    a.create("two", b"2").unwrap();
    a.shared.poll_now().unwrap();
    mem.lose_last(2);
    let why = a.shared.poll_now().unwrap_err();
    assert!(why.contains("lost"), "{why}");
    assert_eq!(a.create("x", b"x"), Err(libc::EIO));
}

/// Eviction is all or nothing: a client whose session ran out keeps it (and its locks) until
/// every memory server of the volume has closed it, since it may still reach the one that did
/// not and write there.
#[test]
fn a_client_is_evicted_only_once_every_server_closed_it() {
    let mut rack = Rack::new(2);
    let engine = MemEngine::new();
    let a = client(&rack, Arc::new(engine.clone()), "a");
    let c = client(&rack, Arc::new(engine.clone()), "c");
    c.create("c-file", b"c").unwrap();
    a.shared.poll_now().unwrap();
    let file = resolve(&a.fs, "c-file").unwrap();
    let write = whole_file_flock();
    assert_eq!(c.fs.set_lock(file, 7, &write).unwrap(), None);
    engine.heartbeat("c", Duration::ZERO).unwrap();
    eventually("c's session ran out", || {
        engine.expired_sessions().unwrap() == vec!["c".to_string()]
    });
    // A server A cannot reach has not closed C.
    rack.stop(1);
    let _ = a.shared.poll_now();
    assert_eq!(engine.expired_sessions().unwrap(), vec!["c".to_string()]);
    assert!(a.fs.set_lock(file, 8, &write).unwrap().is_some());
}

/// An unlink of a file's last name drops it in the same append when no handle on this client
/// holds it, though the kernel holds a reference until its FORGET (as JuiceFS deletes a
/// file at its unlink): one round trip to the engine per remove, not two. Its memory goes
/// back; the FORGET that follows finds nothing. A file open here stays until its close.
#[test]
fn an_unlink_drops_the_file_in_its_own_append() {
    let rack = Rack::new(2);
    let engine: Arc<dyn MetaEngine> = Arc::new(MemEngine::new());
    let (a, b) = two_clients(&rack, &engine);
    let free_at_start = rack.free();
    a.create("f", &bytes(1, 256 << 10)).unwrap();
    let ino = resolve(&a.fs, "f").unwrap(); // a second kernel reference
    let head = engine.head().unwrap();
    a.unlink("f").unwrap();
    assert_eq!(engine.head().unwrap(), head + 1, "not one append");
    assert_eq!(a.fs.getattr(ino).map_err(|e| e.errno), Err(libc::ENOENT));
    a.change(|fs| fs.forget(ino, 2));
    assert_eq!(engine.head().unwrap(), head + 1, "the FORGET appended");
    eventually("the file's memory is back", || {
        a.shared.poll_now().unwrap();
        b.shared.poll_now().unwrap();
        rack.free() == free_at_start
    });
    assert_eq!(a.fs.namespace_digest(), b.fs.namespace_digest());
    // Open here: unlinked, it stays (read through its handle) until its close and FORGET.
    let (ino, fh) = a.create_open("g");
    a.change(|fs| fs.write(ino, fh, 0, b"kept", common::ME))
        .unwrap();
    a.unlink("g").unwrap();
    assert_eq!(a.change(|fs| fs.read(ino, fh, 0, 4)).unwrap(), b"kept");
    a.change(|fs| fs.release(fh));
    assert!(
        a.fs.getattr(ino).is_ok(),
        "dropped while the kernel held it"
    );
    a.change(|fs| fs.forget(ino, 1));
    assert_eq!(a.fs.getattr(ino).map_err(|e| e.errno), Err(libc::ENOENT));
    b.shared.poll_now().unwrap();
    assert_eq!(a.fs.namespace_digest(), b.fs.namespace_digest());
}

/// A client changing a directory no other client works in claims its turn with the change
/// (no round trip of its own): while it holds it, a lookup there that finds nothing needs no
/// catch-up, since no other client can add a name. Another client's change there waits for
/// the turn to pass over, and then each sees the other's names at once.
#[test]
fn a_quiet_directory_is_claimed_by_a_change_in_it() {
    let rack = Rack::new(2);
    let engine = MemEngine::new();
    let a = client(&rack, Arc::new(engine.clone()), "a");
    let b = client(&rack, Arc::new(engine.clone()), "b");
    // The turn lingers for a while after each change (tens of ms): of these rounds, each a
    // create and then a lookup of a missing name, those whose lookup came while it lingered
    // read nothing from the engine. Before, every such lookup read the log.
    let mut without_a_read = 0;
    for n in 0..20 {
        a.create(&format!("f{n}"), b"").unwrap();
        let reads = engine.reads();
        assert_eq!(resolve(&a.fs, &format!("missing{n}")), Err(libc::ENOENT));
        if engine.reads() == reads {
            without_a_read += 1;
        }
    }
    assert!(
        without_a_read > 0,
        "every lookup in the quiet directory read the log"
    );
    // B changes the directory: the turn passes (or had run out), and each client finds the
    // other's new name without a poll.
    a.create("by-a", b"").unwrap();
    b.create("by-b", b"").unwrap();
    assert!(resolve(&a.fs, "by-b").is_ok(), "A did not see B's new name");
    assert!(resolve(&b.fs, "by-a").is_ok(), "B did not see A's new name");
    a.create("by-a-again", b"").unwrap();
    assert!(resolve(&b.fs, "by-a-again").is_ok());
    a.shared.poll_now().unwrap();
    b.shared.poll_now().unwrap();
    assert_eq!(a.fs.namespace_digest(), b.fs.namespace_digest());
}

/// Two clients adding names to one directory at once: each appends its own without first
/// reading the other's (the directory touched shared, each name exclusively), once the
/// directory's turn has passed between them and neither claims it any more. Before, every
/// name each added after the other's was refused and read the log first.
#[test]
fn two_clients_add_names_to_one_directory_without_reading_each_others() {
    let rack = Rack::new(2);
    let engine = MemEngine::new();
    let a = client(&rack, Arc::new(engine.clone()), "a");
    let b = client(&rack, Arc::new(engine.clone()), "b");
    a.mkdir("d").unwrap();
    b.shared.poll_now().unwrap();
    // The first of each: A claims the quiet directory, B's name waits for the turn to pass
    // over, and from then on neither claims it (each saw the other work there).
    a.create("d/a0", b"").unwrap();
    b.create("d/b0", b"").unwrap();
    let reads = engine.reads();
    for n in 1..=20 {
        a.create(&format!("d/a{n}"), b"").unwrap();
        b.create(&format!("d/b{n}"), b"").unwrap();
    }
    assert_eq!(
        engine.reads(),
        reads,
        "a client read the log before adding a name beside the other's"
    );
    a.shared.poll_now().unwrap();
    b.shared.poll_now().unwrap();
    for c in [&a, &b] {
        for n in 0..=20 {
            assert!(resolve(&c.fs, &format!("d/a{n}")).is_ok());
            assert!(resolve(&c.fs, &format!("d/b{n}")).is_ok());
        }
        let d = resolve(&c.fs, "d").unwrap();
        assert_eq!(c.fs.getattr(d).unwrap().nlink, 2);
    }
    assert_eq!(a.fs.namespace_digest(), b.fs.namespace_digest());
}

/// A lookup that finds nothing in a directory this client does not hold the turn of reads
/// the log only if the engine says the name changed since this table's view of it (its
/// key's version): a missing name costs one small read, not a catch-up, and a name another
/// client just made still resolves at once.
#[test]
fn a_lookup_that_finds_nothing_reads_the_log_only_if_the_name_changed() {
    let rack = Rack::new(2);
    let engine = MemEngine::new();
    let a = client(&rack, Arc::new(engine.clone()), "a");
    let b = client(&rack, Arc::new(engine.clone()), "b");
    b.mkdir("d").unwrap();
    a.shared.poll_now().unwrap();
    let d = resolve(&a.fs, "d").unwrap();
    assert!(!a.fs.holds_turn(d));
    let reads = engine.reads();
    for n in 0..10 {
        assert_eq!(resolve(&a.fs, &format!("d/missing{n}")), Err(libc::ENOENT));
    }
    assert_eq!(
        engine.reads(),
        reads,
        "a lookup of a name never made read the log"
    );
    b.create("d/new", b"").unwrap();
    assert!(resolve(&a.fs, "d/new").is_ok(), "A missed B's new name");
    assert!(engine.reads() > reads);
}

/// A directory's attributes set after names were added to it (`tar x` sets each
/// directory's times and mode after its files): under the turn this client claimed with the
/// directory, its own names there count as seen (no other client's came between), and
/// without the turn its take catches the table up; either way the change is taken. Before
/// the engine said which turns a change held, `tar x` failed every such change (EIO).
#[test]
fn a_directory_filled_here_is_then_set_whole() {
    use rmemfs::fs::SetAttr;
    let rack = Rack::new(2);
    let engine = MemEngine::new();
    let a = client(&rack, Arc::new(engine.clone()), "a");
    let b = client(&rack, Arc::new(engine.clone()), "b");
    let chmod = |c: &Client, path: &str, mode: u32| {
        let ino = resolve(&c.fs, path).unwrap();
        let set = SetAttr {
            mode: Some(mode),
            ..Default::default()
        };
        c.change(|fs| fs.setattr(ino, &set, common::ME))
            .map(|_| ())
            .map_err(|e| e.errno)
    };
    a.mkdir("d").unwrap();
    for n in 0..5 {
        a.create(&format!("d/f{n}"), b"").unwrap();
    }
    assert_eq!(chmod(&a, "d", 0o700), Ok(()), "under its own turn");
    b.shared.poll_now().unwrap();
    b.create("d/g", b"").unwrap();
    a.create("d/f5", b"").unwrap();
    assert_eq!(chmod(&a, "d", 0o750), Ok(()), "beside another client");
    b.shared.poll_now().unwrap();
    let d = resolve(&b.fs, "d").unwrap();
    assert_eq!(b.fs.getattr(d).unwrap().perm, 0o750);
    assert!(resolve(&b.fs, "d/f5").is_ok() && resolve(&a.fs, "d/g").is_ok());
    a.shared.poll_now().unwrap();
    assert_eq!(a.fs.namespace_digest(), b.fs.namespace_digest());
}

/// A claim's answer on its way back while another client asks for the directory: the
/// engine holds the turn as A's, A does not know it yet. A gives it back when asked (before,
/// the asker waited for the turn to run out), and the claim's answer, when it comes, finds
/// the turn given back since it was sent and does not count it as held: A's lookups there
/// catch up and find the names B made meanwhile (counted as held, A would answer ENOENT
/// for them without reading the log until its lease ran out).
#[test]
fn a_claim_answered_after_its_turn_went_back_does_not_vouch_for_the_directory() {
    let rack = Rack::new(2);
    let engine = MemEngine::new();
    let a = Arc::new(client(&rack, Arc::new(engine.clone()), "a"));
    let b = client(&rack, Arc::new(engine.clone()), "b");
    a.mkdir("d").unwrap();
    let d = resolve(&a.fs, "d").unwrap();
    eventually("A's turn of its new directory went back", || {
        engine.turn_holder(d).is_none()
    });
    engine.hold_claim_answers("a");
    let creating = {
        let a = a.clone();
        std::thread::spawn(move || a.create("d/by-a", b""))
    };
    // A's create is in the engine, which gave d's turn to A with it; its answer waits.
    engine.wait_for_held_claim();
    assert_eq!(engine.turn_holder(d).as_deref(), Some("a"));
    b.create("d/by-b", b"").unwrap();
    engine.release_claim_answers();
    creating.join().unwrap().unwrap();
    assert!(
        resolve(&a.fs, "d/by-b").is_ok(),
        "A counted d's turn as held after giving it back, and missed B's name in it"
    );
    assert!(resolve(&b.fs, "d/by-a").is_ok());
    a.shared.poll_now().unwrap();
    b.shared.poll_now().unwrap();
    assert_eq!(a.fs.namespace_digest(), b.fs.namespace_digest());
}

/// A file unlinked on one client while open on another stays readable and writable there
/// until its last close on any client; then its memory goes back. So does the memory of one
/// held open by a client that died (its drop falls to the client that evicts it).
#[test]
fn a_file_unlinked_elsewhere_stays_open_here() {
    let rack = Rack::new(2);
    let engine = MemEngine::new();
    let a = client(&rack, Arc::new(engine.clone()), "a");
    let b = client(&rack, Arc::new(engine.clone()), "b");
    let free_at_start = rack.free();
    let data = bytes(3, 2 << 20);
    a.create("f", &data).unwrap();
    b.shared.poll_now().unwrap();
    let ino = resolve(&b.fs, "f").unwrap();
    let fh = b.change(|fs| fs.open(ino, libc::O_RDWR)).unwrap();
    // A removes it, and its kernel forgets it: nothing of A's holds it any more.
    a.unlink("f").unwrap();
    a.change(|fs| fs.forget(ino, 1));
    a.shared.poll_now().unwrap();
    b.shared.poll_now().unwrap();
    assert_eq!(resolve(&b.fs, "f"), Err(libc::ENOENT));
    // B reads and writes it still.
    let got = b
        .change(|fs| fs.read(ino, fh, 0, data.len() as u32))
        .unwrap();
    assert_eq!(got, data);
    b.change(|fs| fs.write(ino, fh, 0, b"still here", common::ME))
        .unwrap();
    let got = b.change(|fs| fs.read(ino, fh, 0, 10)).unwrap();
    assert_eq!(got, b"still here");
    // Its last close anywhere lets its memory go.
    b.change(|fs| fs.release(fh));
    b.change(|fs| fs.forget(ino, 1));
    eventually("the file's memory is back after its last close", || {
        a.shared.poll_now().unwrap();
        b.shared.poll_now().unwrap();
        rack.free() == free_at_start
    });
    assert_eq!(a.fs.namespace_digest(), b.fs.namespace_digest());

    // B opens another file, which A removes; then B dies: A evicts it and drops the file.
    a.create("g", &data).unwrap();
    b.shared.poll_now().unwrap();
    let ino = resolve(&b.fs, "g").unwrap();
    let _held = b.change(|fs| fs.open(ino, libc::O_RDONLY)).unwrap();
    a.unlink("g").unwrap();
    a.change(|fs| fs.forget(ino, 1));
    a.shared.poll_now().unwrap();
    assert!(rack.free() != free_at_start, "freed while open on B");
    engine.heartbeat("b", Duration::ZERO).unwrap();
    eventually("B is evicted and the file it held is freed", || {
        a.shared.poll_now().unwrap();
        rack.free() == free_at_start
    });
}

/// Memory a client allocated and never logged (it died between a write's allocation and its
/// append) is collected once it is evicted; what its logged changes name stays.
#[test]
fn what_an_evicted_client_never_logged_is_collected() {
    let rack = Rack::new(2);
    let engine = MemEngine::new();
    let a = client(&rack, Arc::new(engine.clone()), "a");
    let c = client(&rack, Arc::new(engine.clone()), "c");
    let data = bytes(9, 1 << 20);
    c.create("kept", &data).unwrap();
    a.shared.poll_now().unwrap();
    let before = rack.free();
    // A write's allocation, never appended: C dies here.
    let pool = c.fs.data().pool().clone();
    for _ in 0..3 {
        pool.alloc(1 << 20).unwrap();
    }
    assert!(rack.free().iter().sum::<u64>() < before.iter().sum::<u64>());
    // A live member's allocations are not listed (it may not have logged them yet).
    let a_pool = a.fs.data().pool();
    assert!(a_pool
        .member_extents(rmemfs::fabric::ServerId(0), "c")
        .is_err());
    engine.heartbeat("c", Duration::ZERO).unwrap();
    eventually("C's stray allocations are collected", || {
        a.shared.poll_now().unwrap();
        rack.free() == before
    });
    assert_eq!(read(&a.fs, "kept").unwrap(), data);
}

/// On a large volume, a client that holds part of the namespace and evicts another leaves
/// the collection of what the evicted client never logged to the keeper (through the
/// engine): it does not load the whole namespace for it, and the memory comes back.
#[test]
fn on_a_large_volume_the_keeper_collects_what_an_evicted_client_never_logged() {
    let rack = Rack::new(2);
    let engine = MemEngine::new();
    let a = client(&rack, Arc::new(engine.clone()), "a");
    a.mkdir("d").unwrap();
    a.shared.whole_under(0).unwrap();
    assert!(a.shared.is_keeper());
    let p = client_of_large(&rack, Arc::new(engine.clone()), "p");
    let c = client_of_large(&rack, Arc::new(engine.clone()), "c");
    let data = bytes(9, 1 << 20);
    c.create("kept", &data).unwrap();
    a.shared.poll_now().unwrap();
    let before = rack.free();
    let pool = c.fs.data().pool().clone();
    for _ in 0..3 {
        pool.alloc(1 << 20).unwrap();
    }
    engine.heartbeat("c", Duration::ZERO).unwrap();
    // p evicts c first: what c left is owed to the keeper.
    p.shared.poll_now().unwrap();
    assert_eq!(engine.owed_collections().unwrap(), vec!["c".to_string()]);
    eventually("the keeper collects what c left", || {
        p.shared.poll_now().unwrap();
        a.shared.poll_now().unwrap();
        rack.free() == before
    });
    assert!(!p.shared.is_whole(), "the evicting client loaded no more");
    assert_eq!(engine.owed_collections().unwrap(), Vec::<String>::new());
    assert_eq!(read(&a.fs, "kept").unwrap(), data);
    assert_eq!(read(&p.fs, "kept").unwrap(), data);
}

/// Copies lost with a server are made again on a shared volume, by one member at a time
/// (the rebuilder, chosen through the engine), each file in its turn; every client sees the
/// new copies, so a second server's loss loses nothing.
#[test]
fn copies_lost_with_a_server_are_made_again() {
    use rmemfs::fabric::ServerId;
    use rmemfs::upkeep::rebuild::{pass, Stop};
    let mut rack = Rack::new(3);
    let mem = MemEngine::new();
    let engine: Arc<dyn MetaEngine> = Arc::new(mem.clone());
    let (a, b) = two_clients(&rack, &engine);
    for i in 0..6 {
        a.create(&format!("f{i}"), &bytes(i, 1 << 20)).unwrap();
    }
    b.shared.poll_now().unwrap();
    // Server 2 is lost: both clients see their chunks short of a copy.
    rack.stop(2);
    for c in [&a, &b] {
        c.fs.data().pool().cut(ServerId(2));
    }
    let short = a.fs.replica_health().degraded;
    assert!(short > 0, "no chunk had a copy on server 2");
    // One rebuilder: while A holds the role, B's pass makes no copy.
    assert!(a.fs.may_rebuild());
    let none = pass(&b.fs, 0, &Stop::default(), &Default::default());
    assert_eq!(none.chunks_rebuilt, 0, "{none:?}");
    // B's refusal asked A for the role; A heard it (two rounds of its lingering thread ended
    // since) and keeps it: the role is no inode's turn, given back when asked.
    let rounds = a.shared.linger_rounds();
    eventually("A's lingering thread ran twice", || {
        a.shared.linger_rounds() >= rounds + 2
    });
    assert_eq!(
        mem.turn_holder(u64::MAX).as_deref(),
        Some("a"),
        "A gave the rebuilder's role away when B asked"
    );
    assert!(!b.fs.may_rebuild(), "B took the role A holds");
    let out = pass(&a.fs, 0, &Stop::default(), &Default::default());
    assert_eq!(out.chunks_rebuilt, short, "{out:?}");
    assert_eq!(a.fs.replica_health().degraded, 0);
    b.shared.poll_now().unwrap();
    let h = b.fs.replica_health();
    assert_eq!((h.degraded, h.lost), (0, 0), "{h:?}");
    // Server 1 goes too: B reads every file from the copies the rebuild made.
    rack.stop(1);
    b.fs.data().pool().cut(ServerId(1));
    for i in 0..6 {
        assert_eq!(
            read(&b.fs, &format!("f{i}")).unwrap(),
            bytes(i, 1 << 20),
            "f{i}"
        );
    }
}

/// One memory server frozen past a session's lease (a mount's op timeout is as long: every
/// request to it waits that long) while the clients keep working: their heartbeats, on a
/// thread of their own, keep every healthy session alive, so no client is evicted.
#[test]
fn a_frozen_memory_server_expires_no_healthy_session() {
    use rmemfs::volume::shared::SESSION_TTL;
    let rack = Rack::new(2);
    let relay = common::Relay::start(rack.servers[1].local_addr());
    let addrs = vec![rack.addrs()[0], relay.addr];
    let engine = MemEngine::new();
    let join = |who: &str| {
        let spec = VolumeSpec {
            name: "sh".into(),
            holder: who.into(),
            create: false,
            takeover: false,
            role: VolumeRole::Share,
        };
        let data = rack
            .store_waiting(&addrs, spec, 2, SESSION_TTL + Duration::from_secs(2))
            .unwrap();
        let (fs, shared) = shared::join(
            data,
            FsConfig::default(),
            Arc::new(engine.clone()),
            who.into(),
        )
        .unwrap();
        Client { fs, shared }
    };
    let (a, b, c) = (join("a"), join("b"), join("c"));
    a.create("f", b"before").unwrap();
    // A witness beats throughout, so the engine is not taken for away.
    engine
        .start_session("witness", Duration::from_secs(60))
        .unwrap();
    let frozen = relay.freeze();
    // Frozen for 15 s (issue 45's figure), half again the session's lease.
    let until = std::time::Instant::now() + SESSION_TTL + Duration::from_secs(5);
    while std::time::Instant::now() < until {
        engine
            .heartbeat("witness", Duration::from_secs(60))
            .unwrap();
        assert_eq!(
            engine.expired_sessions().unwrap(),
            Vec::<String>::new(),
            "a healthy client's session ran out while a server was frozen"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(frozen);
    for client in [&b, &c] {
        client.shared.poll_now().unwrap();
        assert_eq!(read(&client.fs, "f").unwrap(), b"before");
    }
    drop((a, b, c));
}

/// A memory server restarted empty under a shared volume: the members forget the copies it
/// held (its new birth put in the history) before they use it again, and the rebuilder makes
/// them again there or elsewhere; every file reads whole.
#[test]
fn a_server_back_empty_is_forgotten_and_rebuilt_onto() {
    use rmemfs::client::Rejoin;
    use rmemfs::fabric::ServerId;
    use rmemfs::upkeep::rebuild::{pass, Stop};
    let mut rack = Rack::new(3);
    let mem = MemEngine::new();
    let engine: Arc<dyn MetaEngine> = Arc::new(mem.clone());
    let (a, b) = two_clients(&rack, &engine);
    for i in 0..6 {
        a.create(&format!("f{i}"), &bytes(i, 1 << 20)).unwrap();
    }
    b.shared.poll_now().unwrap();
    rack.restart(1);
    for c in [&a, &b] {
        let pool = c.fs.data().pool().clone();
        pool.cut(ServerId(1));
        assert_eq!(pool.try_reconnect(ServerId(1)), Some(Rejoin::Empty));
        // As the reconnect thread does on a shared volume: the birth in the history first.
        c.fs.server_reborn(ServerId(1)).unwrap().unwrap();
        pool.admit(ServerId(1));
    }
    let out = pass(&a.fs, 0, &Stop::default(), &Default::default());
    assert!(out.chunks_rebuilt > 0, "{out:?}");
    b.shared.poll_now().unwrap();
    let h = b.fs.replica_health();
    assert_eq!((h.degraded, h.lost), (0, 0), "{h:?}");
    for i in 0..6 {
        assert_eq!(
            read(&b.fs, &format!("f{i}")).unwrap(),
            bytes(i, 1 << 20),
            "f{i}"
        );
    }
    state_is_every_table(&[&a, &b], "copies rebuilt onto a server born again");
}

/// A memory server that restarted empty while no client saw it go (here: the one client that
/// wrote is gone, another joins): the joiner finds the server's new birth, puts it in the
/// history, and no client reads the copies the server lost; a client that was running, its
/// session there dead, forgets them too as it catches up. Before births were in the history,
/// the joiner counted every chunk whole (its rebuild never made those copies again) and kept
/// the restarted server's old addresses in its maps, for reads and writes to use.
#[test]
fn a_server_restarted_unseen_is_forgotten_by_every_client() {
    let mut rack = Rack::new(3);
    let engine: Arc<dyn MetaEngine> = Arc::new(MemEngine::new());
    let a = client(&rack, engine.clone(), "a");
    for i in 0..6 {
        a.create(&format!("f{i}"), &bytes(i, 1 << 20)).unwrap();
    }
    rack.restart(1);
    let c = client(&rack, engine, "c");
    let h = c.fs.replica_health();
    assert!(h.degraded > 0, "the lost copies still counted: {h:?}");
    assert_eq!(h.lost, 0, "{h:?}");
    // New files on the restarted server land where the lost copies were.
    for i in 6..12 {
        c.create(&format!("f{i}"), &bytes(i, 1 << 20)).unwrap();
    }
    a.shared.poll_now().unwrap();
    for client in [&a, &c] {
        for i in 0..12 {
            assert_eq!(
                read(&client.fs, &format!("f{i}")).unwrap(),
                bytes(i, 1 << 20),
                "f{i}"
            );
        }
    }
    assert!(a.fs.replica_health().degraded > 0);
    state_is_every_table(&[&a, &c], "a server's birth forgetting copies");
}

/// A change naming a chunk copy on a memory server whose new birth another client appended
/// after this client's view (the server restarted between the copy's write and the change's
/// append, played here by a birth appended by another client): the engine refuses it (the
/// change reads the server's birth), and it goes again without that copy, after the birth.
/// Every client then lists the chunk on its other server only. Before the check, the late
/// change put the copy of the earlier birth after the birth, and the other clients listed it.
#[test]
fn a_copy_of_an_earlier_birth_is_left_out_of_a_late_change() {
    let rack = Rack::new(2);
    let engine: Arc<dyn MetaEngine> = Arc::new(MemEngine::new());
    let a = client(&rack, engine.clone(), "a");
    let c = client(&rack, engine, "c");
    c.shared.append_birth(1, b"a later birth").unwrap();
    a.create("f", &bytes(7, 1 << 20)).unwrap();
    for client in [&a, &c] {
        client.shared.poll_now().unwrap();
        let h = client.fs.replica_health();
        assert_eq!(
            (h.degraded, h.lost),
            (1, 0),
            "{}: {h:?}",
            client.shared.who()
        );
        assert_eq!(read(&client.fs, "f").unwrap(), bytes(7, 1 << 20));
    }
    state_is_every_table(&[&a, &c], "a copy left out after a birth");
}

/// A client whose log was trimmed past its table by a checkpoint with nothing appended after
/// it (it joined while another client wrote the checkpoint, so its progress was not yet in
/// the floor): it finds the log's head past its table and loads the checkpoint. Before, it
/// read nothing after its last change and took its table for up to date until the next
/// change: a client that joined a 100,000-file volume during a checkpoint listed 1,019 files
/// (`lab/scripts/bench-shared-join.sh`).
#[test]
fn a_client_behind_a_trim_with_nothing_after_it_loads_the_checkpoint() {
    let rack = Rack::new(2);
    let engine: Arc<dyn MetaEngine> = Arc::new(MemEngine::new());
    let (a, b) = two_clients(&rack, &engine);
    a.create("first", b"1").unwrap();
    b.shared.poll_now().unwrap();
    for i in 0..20 {
        a.create(&format!("f{i}"), b"x").unwrap();
    }
    // Forced past b, as a checkpoint whose floor was read before b joined.
    a.shared.checkpoint_now().unwrap();
    b.shared.poll_now().unwrap();
    assert!(
        b.shared.applied() >= a.shared.applied(),
        "b stayed behind the trim"
    );
    for i in 0..20 {
        assert_eq!(read(&b.fs, &format!("f{i}")).unwrap(), b"x", "f{i}");
    }
}

/// A checkpoint trims the engine's versions to those changed since (each inode and name a
/// change ever touched kept one before, for ever), and a client whose table is older than
/// the trim still finds what it lacks: a lookup of a name made meanwhile reads the floor
/// for its key and catches up, and a change decided on its old table is refused and
/// decided again (where the trimmed keys read as never touched, the lookup said ENOENT).
#[test]
fn a_checkpoint_trims_the_versions_and_a_stale_client_still_catches_up() {
    let rack = Rack::new(2);
    let engine = MemEngine::new();
    let a = client(&rack, Arc::new(engine.clone()), "a");
    let b = client(&rack, Arc::new(engine.clone()), "b");
    a.mkdir("d").unwrap();
    for i in 0..50 {
        a.create(&format!("d/f{i}"), b"x").unwrap();
    }
    b.shared.poll_now().unwrap();
    a.create("d/new", b"new").unwrap();
    a.mkdir("d/taken").unwrap();
    let before = engine.versions_kept();
    a.shared.checkpoint_now().unwrap();
    let after = engine.versions_kept();
    assert!(
        before > 100 && after <= 2,
        "versions kept: {before} before the checkpoint, {after} after (the servers' births)"
    );
    assert_eq!(read(&b.fs, "d/new").unwrap(), b"new");
    assert_eq!(b.mkdir("d/taken"), Err(libc::EEXIST));
    b.mkdir("d/b").unwrap();
    a.shared.poll_now().unwrap();
    assert!(resolve(&a.fs, "d/b").is_ok());
    assert_eq!(a.fs.namespace_digest(), b.fs.namespace_digest());
}

/// Writes held back under a file's turn reach the engine though a checkpoint trimmed the
/// versions past this client's table (its report of what it applied missed, as a client's
/// whose connection to the servers dropped for a moment): a key whose turn the appender
/// holds reads as never touched, not as the floor. With the floor, the append was refused
/// as a conflict, and the client stopped for good, its answered writes lost.
#[test]
fn writes_held_back_under_a_turn_go_past_a_trim() {
    let rack = Rack::new(2);
    let engine = MemEngine::new();
    let a = client(&rack, Arc::new(engine.clone()), "a");
    let b = client(&rack, Arc::new(engine.clone()), "b");
    a.shared.pause_linger(true);
    b.mkdir("bd").unwrap();
    let (ino, fh) = a.create_open("f");
    let data = bytes(5, 1 << 20);
    a.change(|fs| fs.write(ino, fh, 0, &data, common::ME))
        .unwrap();
    // B changes its own directory (nothing A holds), past A's table.
    for i in 0..10 {
        b.mkdir(&format!("bd/b{i}")).unwrap();
    }
    // Forced past A, as a checkpoint whose floor missed A's report.
    b.shared.checkpoint_now().unwrap();
    assert!(engine.versions_kept() <= 2, "{}", engine.versions_kept());
    assert_eq!(engine.turn_holder(ino).as_deref(), Some("a"));
    a.fs.fsync(ino).unwrap().unwrap();
    a.change(|fs| fs.release(fh));
    b.shared.poll_now().unwrap();
    assert_eq!(read(&b.fs, "f").unwrap(), data);
    a.mkdir("after").unwrap();
    b.shared.poll_now().unwrap();
    assert_eq!(a.fs.namespace_digest(), b.fs.namespace_digest());
}

/// One client at a time writes a checkpoint (the checkpoint's role, a turn): while another
/// holds it, a client due writes none, and counts from the one the other wrote; the writer
/// gives the role back. Before, under steady changes every client found one due at once and
/// each wrote the whole table.
#[test]
fn a_checkpoint_is_written_by_one_client_at_a_time() {
    let rack = Rack::new(2);
    let engine = MemEngine::new();
    let a = client(&rack, Arc::new(engine.clone()), "a");
    let b = client(&rack, Arc::new(engine.clone()), "b");
    for i in 0..10 {
        a.mkdir(&format!("d{i}")).unwrap();
    }
    let long = Duration::from_secs(60);
    engine
        .take_turn("b", shared::CHECKPOINT_ROLE, long, Duration::ZERO)
        .unwrap();
    assert!(!a.shared.checkpoint_as_due().unwrap(), "written beside b's");
    assert_eq!(engine.checkpoint_lsn().unwrap(), None);
    engine.give_turns("b", &[shared::CHECKPOINT_ROLE]).unwrap();
    assert!(a.shared.checkpoint_as_due().unwrap());
    assert_eq!(engine.checkpoint_lsn().unwrap(), Some(a.shared.applied()));
    assert_eq!(engine.turn_holder(shared::CHECKPOINT_ROLE), None, "kept");
    drop(b);
}

/// A new shared volume's root is dated by its first client, once: every client shows the
/// same birth and access times, of the join, not the epoch each table starts the root with
/// (before, `stat` of a new shared mount showed a birth in 1970).
#[test]
fn a_new_volumes_root_is_dated_once() {
    let rack = Rack::new(2);
    let engine = MemEngine::new();
    // The clock the file system's times come from (coarse: a jiffy behind SystemTime).
    let before = rmemfs::meta::now();
    let a = client(&rack, Arc::new(engine.clone()), "a");
    let head = engine.head().unwrap();
    let root = a.fs.getattr(ROOT_INO).unwrap();
    assert!(
        root.btime >= before && root.atime >= before && root.mtime >= before,
        "{before:?}: {root:?}"
    );
    a.mkdir("d").unwrap();
    let b = client(&rack, Arc::new(engine.clone()), "b");
    assert_eq!(engine.head().unwrap(), head + 1, "dated again: {head}");
    let seen = b.fs.getattr(ROOT_INO).unwrap();
    assert_eq!((seen.btime, seen.atime), (root.btime, root.atime));
    a.shared.poll_now().unwrap();
    assert_eq!(a.fs.namespace_digest(), b.fs.namespace_digest());
}

/// A checkpoint written while another client lags (as under steady changes from both, where
/// the others always lag a poll behind): the log and the versions are trimmed only up to
/// what every member has applied, so the lagging client reads on from the log, not from the
/// checkpoint. Before, such a checkpoint was not written at all, and under steady changes
/// the log and the versions grew until the changes stopped.
#[test]
fn a_checkpoint_beside_a_lagging_client_trims_only_what_it_applied() {
    let rack = Rack::new(2);
    let engine = MemEngine::new();
    let a = client(&rack, Arc::new(engine.clone()), "a");
    let b = client(&rack, Arc::new(engine.clone()), "b");
    a.mkdir("d").unwrap();
    for i in 0..10 {
        a.create(&format!("d/f{i}"), b"x").unwrap();
    }
    // Both report how far they applied (a poll does).
    b.shared.poll_now().unwrap();
    a.shared.poll_now().unwrap();
    let lagging = b.shared.applied();
    for i in 10..20 {
        a.create(&format!("d/f{i}"), b"y").unwrap();
    }
    assert!(a.shared.checkpoint_as_due().unwrap());
    let ckpt = engine.checkpoint().unwrap().expect("a checkpoint");
    assert_eq!(ckpt.lsn, a.shared.applied());
    let log = engine.read_after(0, 100).unwrap();
    assert_eq!(
        log.first().map(|(lsn, _)| *lsn),
        Some(lagging + 1),
        "the log trimmed past what b applied ({lagging}; checkpoint {})",
        ckpt.lsn
    );
    assert_eq!(
        engine.version(u64::MAX / 3).unwrap(),
        lagging,
        "the versions' floor"
    );
    b.shared.poll_now().unwrap();
    assert_eq!(b.shared.applied(), a.shared.applied());
    assert_eq!(read(&b.fs, "d/f15").unwrap(), b"y");
    assert_eq!(a.fs.namespace_digest(), b.fs.namespace_digest());
}

/// Memory a removal lets go of (another client allocated it) comes back though the removing
/// client goes right after: it leaves cleanly, or it is evicted with its frees still waiting
/// for the other members to apply the removal (its own rounds stopped: nothing it holds is
/// sent by it from there).
#[test]
fn a_removal_frees_its_memory_though_its_client_goes_right_after() {
    for evicted in [false, true] {
        let rack = Rack::new(2);
        let engine = MemEngine::new();
        let a = client(&rack, Arc::new(engine.clone()), "a");
        let b = client(&rack, Arc::new(engine.clone()), "b");
        let free_at_start = rack.free();
        a.create("f", &bytes(1, 1 << 20)).unwrap();
        b.shared.poll_now().unwrap();
        b.shared.pause_linger(evicted);
        b.unlink("f").unwrap();
        let b = match evicted {
            true => {
                engine.heartbeat("b", Duration::ZERO).unwrap();
                Some(b)
            }
            false => {
                drop(b);
                None
            }
        };
        eventually("the removed file's memory is back", || {
            a.shared.poll_now().unwrap();
            rack.free() == free_at_start
        });
        drop(b);
    }
}

/// A client joining a volume loads what it uses (shared format 7): the root's names at the
/// join, a directory's when a lookup or a change needs them, the rest in the poller's round;
/// meanwhile what other clients change is right wherever this client looks: in directories
/// it had not loaded, in one it had (a name moved in from one it had not, leading to an
/// inode it did not hold), a directory moved below one it had not loaded (a move making a
/// cycle refused), a directory filled where it had not loaded it (not removed as empty).
/// What reads the whole table (the rebuild) waits for the rest.
#[test]
fn a_joining_client_loads_what_it_uses_and_the_rest_after() {
    let rack = Rack::new(2);
    let engine: Arc<dyn MetaEngine> = Arc::new(MemEngine::new());
    let a = client(&rack, engine.clone(), "a");
    fill_tree(&a, 20);
    a.mkdir("d11/sub").unwrap();
    let c = client(&rack, engine.clone(), "c");
    assert!(!c.shared.is_whole());
    assert_eq!(c.fs.inode_count(), 21, "the root and its names");
    assert!(!c.fs.may_rebuild(), "the rebuild waits for the whole table");
    assert_eq!(read(&c.fs, "d7/f3").unwrap(), b"7/3");
    assert_eq!(c.fs.inode_count(), 31, "and d7's names");
    // Changes where c has not looked.
    a.create("d9/new", b"new").unwrap();
    a.unlink("d9/f0").unwrap();
    a.rename("d3/f1", "d4/moved").unwrap();
    // A name moved into a directory c holds, from one it does not, to an inode it lacks.
    a.rename("d5/f2", "d7/from-5").unwrap();
    // A directory moved below one c has not loaded, then c moves the upper one into it
    // (by inode, as the kernel would: c held d10 from the join).
    let d10 = resolve(&a.fs, "d10").unwrap();
    a.rename("d10", "d11/sub/d10").unwrap();
    // A directory filled where c has not loaded it.
    a.create("d12/f-late", b"late").unwrap();
    // A directory made and given a name from one c has not loaded, in one catch-up of c's.
    a.mkdir("fresh").unwrap();
    a.rename("d13/f4", "fresh/f4").unwrap();
    c.shared.pause(true);
    // d7, loaded, now names an inode c did not hold: listed whole, each name once; so does
    // the directory made meanwhile.
    assert_eq!(listed(&c.fs, "d7"), listed(&a.fs, "d7"));
    assert_eq!(listed(&c.fs, "fresh"), vec!["f4".to_string()]);
    // A directory's attributes change without its names loaded.
    let d14 = resolve(&c.fs, "d14").unwrap();
    let chmod = rmemfs::fs::SetAttr {
        mode: Some(0o700),
        ..Default::default()
    };
    c.change(|fs| fs.setattr(d14, &chmod, common::ME)).unwrap();
    assert_eq!(listed(&c.fs, "d9"), listed(&a.fs, "d9"));
    assert!(listed(&c.fs, "d9").contains(&"new".to_string()));
    assert_eq!(read(&c.fs, "d4/moved").unwrap(), b"3/1");
    assert_eq!(read(&c.fs, "d7/from-5").unwrap(), b"5/2");
    assert_eq!(resolve(&c.fs, "d3/f1"), Err(libc::ENOENT));
    assert_eq!(
        c.rename("d11", "d10/inside"),
        Err(libc::ENOENT),
        "d10 moved"
    );
    let cycle = c.change(|fs| {
        fs.rename(ROOT_INO, b"d11", d10, b"inside", 0, common::ME)
            .map_err(|e| e.errno)
    });
    assert_eq!(cycle, Err(libc::EINVAL), "d10 is below d11 now");
    assert_eq!(
        c.change(|fs| fs.rmdir(ROOT_INO, b"d12").map_err(|e| e.errno)),
        Err(libc::ENOTEMPTY)
    );
    assert!(!c.shared.is_whole());
    // The poller's round loads the rest.
    c.shared.poll_now().unwrap();
    a.shared.poll_now().unwrap();
    assert!(c.shared.is_whole());
    assert!(c.fs.may_rebuild());
    assert_eq!(c.fs.namespace_digest(), a.fs.namespace_digest());
    state_is_every_table(&[&a, &c], "a client that loaded as it went");
}

/// A name another client changes in a directory this client holds without its names (they
/// went unloaded when a name there came to lead to an inode the client lacks) is still told
/// to the kernel, which may have looked it up while the names were held: else it would
/// keep its lookup of a name gone, until its timeout.
#[test]
fn names_changed_where_the_table_lost_the_names_are_told_to_the_kernel() {
    use rmemfs::fs::Invalidation;
    let rack = Rack::new(2);
    let engine: Arc<dyn MetaEngine> = Arc::new(MemEngine::new());
    let a = client(&rack, engine.clone(), "a");
    a.mkdir("d").unwrap();
    a.create("d/x", b"x").unwrap();
    a.mkdir("elsewhere").unwrap();
    a.create("elsewhere/y", b"y").unwrap();
    let c = client(&rack, engine.clone(), "c");
    let d = resolve(&c.fs, "d").unwrap();
    assert!(resolve(&c.fs, "d/x").is_ok(), "c's kernel looked x up");
    let told = Arc::new(std::sync::Mutex::new(Vec::new()));
    let t = told.clone();
    c.fs.on_followed(Box::new(move |i| t.lock().unwrap().extend_from_slice(i)));
    // An inode c lacks, from a directory it has not loaded: d's names go unloaded on c.
    a.rename("elsewhere/y", "d/y").unwrap();
    a.unlink("d/x").unwrap();
    c.shared.poll_now().unwrap();
    // Told by the notifier thread, after the poll's catch-up.
    let is_told = |name: &str| {
        told.lock().unwrap().iter().any(|i| {
            matches!(i, Invalidation::Entry { dir, name: n } if *dir == d && &n[..] == name.as_bytes())
        })
    };
    eventually("d/x and d/y are told to the kernel", || {
        is_told("x") && is_told("y")
    });
    assert_eq!(resolve(&c.fs, "d/x"), Err(libc::ENOENT));
    assert_eq!(read(&c.fs, "d/y").unwrap(), b"y");
}

/// On a large volume (here: past 100 inodes) one client, the keeper, holds the whole
/// table, and the others what they use: a client that joins loads what it looks at, and
/// its poller loads nothing more, while the volume's maker (whole already) keeps. Once the
/// keeper leaves, the next client to ask keeps, and loads the rest.
#[test]
fn on_a_large_volume_one_client_keeps_the_whole_table_and_the_others_what_they_use() {
    let rack = Rack::new(2);
    let engine: Arc<dyn MetaEngine> = Arc::new(MemEngine::new());
    let a = client(&rack, engine.clone(), "a");
    fill_tree(&a, 20);
    // a holds the whole table and notes its 221 inodes (large only past u64::MAX for it).
    a.shared.whole_under(u64::MAX).unwrap();
    assert!(!a.shared.is_keeper());
    let c = client(&rack, engine.clone(), "c");
    c.shared.whole_under(100).unwrap();
    assert!(!c.shared.is_keeper(), "not before its grace, the role free");
    a.shared.whole_under(100).unwrap();
    assert!(
        a.shared.is_whole() && a.shared.is_keeper(),
        "the maker keeps"
    );
    assert_eq!(c.fs.inode_count(), 21, "the root and its names");
    c.shared.poll_now().unwrap();
    assert_eq!(c.fs.inode_count(), 21, "its poller loads nothing more");
    assert_eq!(read(&c.fs, "d7/f3").unwrap(), b"7/3");
    assert_eq!(c.fs.inode_count(), 31, "and d7's names");
    c.shared.keeper_round_now(true).unwrap();
    assert!(!c.shared.is_keeper(), "a keeps");
    // Changes where c looked reach it; the rest it does not hold.
    a.create("d7/new", b"new").unwrap();
    a.create("d8/new", b"new").unwrap();
    c.shared.poll_now().unwrap();
    assert_eq!(c.fs.inode_count(), 32);
    assert_eq!(read(&c.fs, "d7/new").unwrap(), b"new");
    assert!(!c.shared.is_whole());
    assert!(!c.fs.may_rebuild(), "the rebuild is the keeper's");
    drop(a);
    c.shared.keeper_round_now(true).unwrap();
    assert!(c.shared.is_keeper(), "the keeper left: c keeps");
    c.shared.poll_now().unwrap();
    assert!(c.shared.is_whole());
    assert_eq!(c.fs.inode_count(), 223);
    table_is_the_state(&c);
}

/// A volume whose inodes no client has counted yet (one of an older build, or whose clients
/// all hold part of it) is taken for large by the inode numbers given out: a client that
/// joins it loads what it uses, not the whole namespace.
#[test]
fn a_volume_nobody_counted_is_large_by_its_inode_numbers() {
    let rack = Rack::new(2);
    let mem = MemEngine::new();
    mem.fail_next("note_inodes", 1);
    let engine: Arc<dyn MetaEngine> = Arc::new(mem.clone());
    let a = client(&rack, engine.clone(), "a");
    fill_tree(&a, 20);
    assert_eq!(engine.noted_inodes().unwrap(), None);
    let c = client(&rack, engine.clone(), "c");
    c.shared.whole_under(100).unwrap();
    c.shared.poll_now().unwrap();
    assert_eq!(c.fs.inode_count(), 21, "the root and its names");
    // Once a whole client notes its count, that decides: 221 inodes, large past 1,000?
    a.shared.whole_under(1000).unwrap();
    c.shared.whole_under(1000).unwrap();
    c.shared.poll_now().unwrap();
    assert!(c.shared.is_whole(), "small by the count noted");
}

/// A client that holds what it uses (a large volume's, not its keeper) forgets what the
/// kernel let go of: a directory's names and the inodes only they held, below it too, but a
/// file still open there. Used again, they are loaded again, with what changed meanwhile.
#[test]
fn a_client_that_holds_what_it_uses_forgets_what_the_kernel_let_go_of() {
    let rack = Rack::new(2);
    let engine: Arc<dyn MetaEngine> = Arc::new(MemEngine::new());
    let a = client(&rack, engine.clone(), "a");
    fill_tree(&a, 5);
    a.mkdir("d1/sub").unwrap();
    a.create("d1/sub/deep", b"deep").unwrap();
    a.shared.whole_under(0).unwrap();
    let c = client_of_large(&rack, engine.clone(), "c");
    assert_eq!(c.fs.inode_count(), 6, "the root and its names");
    assert_eq!(read(&c.fs, "d1/sub/deep").unwrap(), b"deep");
    let f1 = resolve(&c.fs, "d1/f1").unwrap();
    let fh = c.change(|fs| fs.open(f1, libc::O_RDONLY)).unwrap();
    assert_eq!(c.fs.inode_count(), 6 + 11 + 1, "d1's names and sub's");
    // The kernel lets the tree go, the names it looked up first.
    for path in ["d1/sub/deep", "d1/sub", "d1/f1", "d1"] {
        let ino = resolve(&c.fs, path).unwrap();
        c.fs.forget(ino, u64::MAX);
    }
    c.shared.poll_now().unwrap();
    assert_eq!(
        c.fs.inode_count(),
        6 + 1,
        "d1 stays (the root names it), f1 is open"
    );
    assert_eq!(c.fs.read(f1, fh, 0, 16).unwrap(), b"1/1");
    // Changed meanwhile, and used again.
    a.create("d1/new", b"new").unwrap();
    a.unlink("d1/f2").unwrap();
    a.create("d1/sub/deeper", b"deeper").unwrap();
    c.shared.poll_now().unwrap();
    assert_eq!(listed(&c.fs, "d1"), listed(&a.fs, "d1"));
    assert_eq!(listed(&c.fs, "d1/sub"), vec!["deep", "deeper"]);
    assert_eq!(read(&c.fs, "d1/new").unwrap(), b"new");
    c.change(|fs| fs.release(fh));
    c.fs.load_whole_shared().unwrap();
    table_is_the_state(&c);
}

/// What a forgotten directory's names led to stays where something else still holds it: a
/// file with another name in a directory whose names the table holds, and a directory the
/// kernel still holds (with what its names lead to), though its parent was let go. What
/// nothing holds goes.
#[test]
fn a_forgotten_directory_keeps_what_else_holds() {
    let rack = Rack::new(2);
    let engine: Arc<dyn MetaEngine> = Arc::new(MemEngine::new());
    let a = client(&rack, engine.clone(), "a");
    for d in ["d1", "d2", "d1/sub"] {
        a.mkdir(d).unwrap();
    }
    for f in ["d1/f0", "d1/f5", "d2/g", "d1/sub/deep"] {
        a.create(f, f.as_bytes()).unwrap();
    }
    let (f5, d2) = (
        resolve(&a.fs, "d1/f5").unwrap(),
        resolve(&a.fs, "d2").unwrap(),
    );
    a.change(|fs| fs.link(f5, d2, b"linked")).unwrap();
    a.shared.whole_under(0).unwrap();
    let c = client_of_large(&rack, engine.clone(), "c");
    assert_eq!(read(&c.fs, "d1/sub/deep").unwrap(), b"d1/sub/deep");
    assert_eq!(listed(&c.fs, "d2"), vec!["g", "linked"]);
    let ino = |p: &str| resolve(&c.fs, p).unwrap();
    let (f0, deep, g) = (ino("d1/f0"), ino("d1/sub/deep"), ino("d2/g"));
    assert_eq!(ino("d1/f5"), f5);
    // The kernel lets d1 go and what it looked up there, but sub; and d2's g.
    for p in ["d1/f0", "d1/f5", "d1/sub/deep", "d2/g", "d1"] {
        let i = ino(p);
        c.fs.forget(i, u64::MAX);
    }
    c.shared.poll_now().unwrap();
    assert!(c.fs.getattr(f0).is_err(), "nothing holds d1/f0: gone");
    assert!(c.fs.getattr(f5).is_ok(), "d2, held whole, names it");
    assert!(c.fs.getattr(g).is_ok(), "d2 was not let go");
    assert!(
        c.fs.getattr(deep).is_ok(),
        "the kernel holds sub, whose names lead to it"
    );
    assert_eq!(read(&c.fs, "d1/f0").unwrap(), b"d1/f0");
    assert_eq!(read(&c.fs, "d2/linked").unwrap(), b"d1/f5");
}

/// A file unlinked by another client while open on a client that holds part of the
/// namespace (and never the whole: a large volume's client other than its keeper) is
/// dropped once that client closes it, and its memory given back (a drop waiting for a
/// whole table would wait for ever).
#[test]
fn a_file_let_go_on_a_client_that_holds_part_of_the_namespace_is_dropped() {
    let rack = Rack::new(2);
    let engine = MemEngine::new();
    let a = client(&rack, Arc::new(engine.clone()), "a");
    a.mkdir("d").unwrap();
    a.shared.whole_under(0).unwrap();
    let c = client_of_large(&rack, Arc::new(engine.clone()), "c");
    let free_at_start = rack.free();
    a.create("d/f", &bytes(5, 1 << 20)).unwrap();
    let f = resolve(&c.fs, "d/f").unwrap();
    let fh = c.change(|fs| fs.open(f, libc::O_RDONLY)).unwrap();
    a.unlink("d/f").unwrap();
    a.change(|fs| fs.forget(f, 1));
    c.change(|fs| fs.release(fh));
    c.change(|fs| fs.forget(f, 1));
    assert!(!c.shared.is_whole());
    eventually("the file is dropped once c lets it go", || {
        c.shared.poll_now().unwrap();
        a.shared.poll_now().unwrap();
        rack.free() == free_at_start
    });
    assert!(!c.shared.is_whole());
    assert_eq!(resolve(&c.fs, "d/f"), Err(libc::ENOENT));
}

/// A joining client's last step loads the files no name leads to (open on another client
/// after their last name went), and keeps a file made with no name (`O_TMPFILE`) after it
/// listed the state's inodes: the catch-up its last load makes applies that make, every
/// directory's names being held by then (else the file would be lost to this client).
#[test]
fn a_joining_client_holds_the_files_open_elsewhere_with_no_name() {
    let rack = Rack::new(2);
    let engine = MemEngine::new();
    let a = client(&rack, Arc::new(engine.clone()), "a");
    let b = client(&rack, Arc::new(engine.clone()), "b");
    a.mkdir("d").unwrap();
    a.create("d/f", b"open on b").unwrap();
    b.shared.poll_now().unwrap();
    let f = resolve(&b.fs, "d/f").unwrap();
    let fh = b.change(|fs| fs.open(f, libc::O_RDWR)).unwrap();
    a.unlink("d/f").unwrap();
    let c = client(&rack, Arc::new(engine.clone()), "c");
    assert!(!c.shared.is_whole());
    let d = resolve(&a.fs, "d").unwrap();
    let (made, tmp) = std::sync::mpsc::channel();
    let b_fs = b.fs.clone();
    engine.after_state_listing(move || {
        let _turn = b_fs.admit_change();
        let (attr, fh) = b_fs.tmpfile(d, 0o600, libc::O_RDWR, common::ME).unwrap();
        made.send((attr.ino, fh)).unwrap();
    });
    c.shared.poll_now().unwrap();
    let (tmp, tmp_fh) = tmp.try_recv().expect("c listed the state's inodes");
    assert!(c.shared.is_whole());
    assert!(c.fs.getattr(f).is_ok(), "the file open on b, with no name");
    assert!(c.fs.getattr(tmp).is_ok(), "the file b made with no name");
    // Both change on c as b changes them.
    b.change(|fs| fs.write(tmp, tmp_fh, 0, b"tmp", common::ME))
        .unwrap();
    b.change(|fs| fs.write(f, fh, 0, b"still", common::ME))
        .unwrap();
    b.change(|fs| fs.release(tmp_fh));
    b.change(|fs| fs.release(fh));
    for cl in [&a, &b, &c] {
        cl.shared.poll_now().unwrap();
    }
    assert_eq!(c.fs.namespace_digest(), b.fs.namespace_digest());
    assert_eq!(c.fs.namespace_digest(), a.fs.namespace_digest());
}

/// A client that evicts another while its table holds part of the namespace settles the
/// evicted client's open files once its loads succeed: a file unlinked elsewhere and open on
/// the evicted client only (a table that does not hold it would settle nothing) is dropped,
/// and its memory given back, only once it is loaded (by number, or with the whole table,
/// which the collection of the evicted client's memory loads first).
#[test]
fn an_evicted_clients_open_files_are_settled_once_loaded() {
    let rack = Rack::new(2);
    let engine = MemEngine::new();
    let a = client(&rack, Arc::new(engine.clone()), "a");
    let b = client(&rack, Arc::new(engine.clone()), "b");
    a.mkdir("d").unwrap();
    let free_at_start = rack.free();
    a.create("d/f", &bytes(5, 1 << 20)).unwrap();
    b.shared.poll_now().unwrap();
    let f = resolve(&b.fs, "d/f").unwrap();
    let _held = b.change(|fs| fs.open(f, libc::O_RDONLY)).unwrap();
    a.unlink("d/f").unwrap();
    a.change(|fs| fs.forget(f, 1));
    // a's own mark (its create opened the file) goes, and its drop, tried again then, is
    // refused for b's: the drop is b's to make, and falls to whoever evicts b.
    eventually("a lets its mark on the file go", || {
        a.shared.poll_now().unwrap();
        !engine.marked_by("a").unwrap().contains(&f)
    });
    a.shared.poll_now().unwrap();
    let c = client(&rack, Arc::new(engine.clone()), "c");
    // b stops; c evicts it in rounds whose loads fail: its table stays partial.
    engine.heartbeat("b", Duration::ZERO).unwrap();
    engine.fail_next("load_state", 2);
    c.shared.poll_now().unwrap();
    c.shared.poll_now().unwrap();
    assert!(!c.shared.is_whole(), "the loads failed");
    assert!(c.fs.getattr(f).is_err(), "c does not hold the file yet");
    a.shared.poll_now().unwrap();
    assert_ne!(rack.free(), free_at_start, "the file is not dropped yet");
    eventually(
        "the evicted client's file is dropped once c's table is whole",
        || {
            c.shared.poll_now().unwrap();
            a.shared.poll_now().unwrap();
            rack.free() == free_at_start
        },
    );
    assert!(c.shared.is_whole());
    assert_eq!(c.fs.namespace_digest(), a.fs.namespace_digest());
}

/// The names of a directory too large for one step of the engine are read a page at a
/// time, and the inodes they lead to a batch at a time; what changed there meanwhile is read
/// from the log and applied to them: a name moved between pages, and names made at every
/// page read (the last included), which never stop, cost no new pass. The table then holds
/// the directory whole and equal to the other client's, and a small directory beside it
/// loads in one step as before.
#[test]
fn a_directory_of_many_names_is_loaded_a_page_at_a_time() {
    use std::sync::atomic::{AtomicU32, Ordering};
    let rack = Rack::new(2);
    let engine = MemEngine::new();
    let a = Arc::new(client(&rack, Arc::new(engine.clone()), "a"));
    for d in ["big", "bigger", "small"] {
        a.mkdir(d).unwrap();
    }
    for i in 0..30 {
        a.create(&format!("big/f{i}"), b"big").unwrap();
        a.create(&format!("bigger/f{i}"), b"bigger").unwrap();
    }
    a.create("small/only", b"small").unwrap();
    let c = client(&rack, Arc::new(engine.clone()), "c");
    c.shared.page_names_over(10);
    // Once c has read `big`'s first page, a name there is moved to one before it (in every
    // order of names the pages may follow; the inode stays).
    let maker = a.clone();
    engine.after_names_page(move || maker.rename("big/f0", "big/a-moved").unwrap());
    assert_eq!(listed(&c.fs, "big"), listed(&a.fs, "big"));
    assert!(listed(&c.fs, "big").contains(&"a-moved".to_string()));
    assert_eq!(read(&c.fs, "big/a-moved").unwrap(), b"big");
    // `bigger` gets a new name at every page c reads, for ever.
    fn every_page(engine: &MemEngine, maker: Arc<Client>, pages: Arc<AtomicU32>) {
        let e = engine.clone();
        engine.after_names_page(move || {
            let n = pages.fetch_add(1, Ordering::SeqCst);
            maker.create(&format!("bigger/n{n}"), b"n").unwrap();
            every_page(&e, maker, pages);
        });
    }
    let pages = Arc::new(AtomicU32::new(0));
    every_page(&engine, a.clone(), pages.clone());
    let got = listed(&c.fs, "bigger");
    engine.after_names_page(|| {});
    let read_pages = pages.load(Ordering::SeqCst);
    assert_eq!(got, listed(&a.fs, "bigger"));
    assert!(
        got.contains(&format!("n{}", read_pages - 1)),
        "the last page's"
    );
    // One pass: 30 names and those made meanwhile, 10 a page (and a page may repeat).
    assert!(read_pages <= 6, "{read_pages} pages read");
    // A small directory: one step, no page.
    engine.after_names_page(|| panic!("a small directory read a page at a time"));
    assert_eq!(listed(&c.fs, "small"), vec!["only".to_string()]);
    engine.after_names_page(|| {});
    assert!(!c.shared.is_whole());
    c.shared.poll_now().unwrap();
    a.shared.poll_now().unwrap();
    assert!(c.shared.is_whole());
    assert_eq!(c.fs.namespace_digest(), a.fs.namespace_digest());
    state_is_every_table(&[&a, &c], "a client that read directories a page at a time");
}

/// A directory read a page at a time whose log was trimmed past its first page (a
/// checkpoint while the pages were read, the reading client caught up past the trim by its
/// poll) is read again: the changes between are no longer in the log to patch the names
/// with. A name made after the first page, sorting before every name the pages read, is
/// then listed (mutant caught: a trimmed log taken as one with nothing to patch).
#[test]
fn a_directory_paged_while_the_log_is_trimmed_is_read_again() {
    let rack = Rack::new(2);
    let engine = MemEngine::new();
    let a = Arc::new(client(&rack, Arc::new(engine.clone()), "a"));
    a.mkdir("big").unwrap();
    for i in 0..30 {
        a.create(&format!("big/f{i}"), b"big").unwrap();
    }
    let c = Arc::new(client(&rack, Arc::new(engine.clone()), "c"));
    c.shared.page_names_over(10);
    let (maker, reader, paging) = (a.clone(), c.clone(), engine.clone());
    engine.after_names_page(move || {
        // A name before every other (no later page of this pass holds it), c's catch-up
        // past it (its poll's loads failing), then a checkpoint trimming the log up to a's
        // table.
        maker.create("big/a-late", b"late").unwrap();
        paging.fail_next("load_state", 1);
        reader.shared.poll_now().unwrap();
        maker.shared.checkpoint_now().unwrap();
    });
    let first = engine.read_after(0, 1).unwrap();
    assert_eq!(listed(&c.fs, "big"), listed(&a.fs, "big"));
    assert!(listed(&c.fs, "big").contains(&"a-late".to_string()));
    assert_eq!(read(&c.fs, "big/a-late").unwrap(), b"late");
    assert_ne!(
        engine.read_after(0, 1).unwrap(),
        first,
        "the log was trimmed"
    );
    c.shared.poll_now().unwrap();
    a.shared.poll_now().unwrap();
    assert_eq!(c.fs.namespace_digest(), a.fs.namespace_digest());
}

/// On Redis, a directory larger than one step reads (and than a hash Redis keeps packed, so
/// `HSCAN` returns it in many pages) is loaded a page at a time, whole.
#[test]
fn a_directory_of_many_names_is_loaded_a_page_at_a_time_on_redis() {
    let redis = common::redis::Redis::start();
    let open = || -> Arc<dyn MetaEngine> {
        Arc::new(rmemfs::engine::redis::RedisEngine::open(&redis.url, "pg").unwrap())
    };
    let rack = Rack::new(2);
    let a = client(&rack, open(), "a");
    a.mkdir("big").unwrap();
    // Redis keeps a hash of up to 512 fields packed (`hash-max-listpack-entries`), and scans
    // a packed one in one page.
    for i in 0..600 {
        a.create(&format!("big/f{i}"), b"").unwrap();
    }
    let c = client(&rack, open(), "c");
    c.shared.page_names_over(10);
    let big = resolve(&c.fs, "big").unwrap();
    assert_eq!(resolve(&c.fs, "big/f599"), resolve(&a.fs, "big/f599"));
    let fh = c.fs.opendir(big).unwrap();
    let mut listed = 0;
    c.fs.readdirplus(big, fh, 0, &mut |_, _| {
        listed += 1;
        true
    })
    .unwrap();
    c.fs.releasedir(fh);
    assert_eq!(listed, 602, "600 names, . and ..");
    c.shared.poll_now().unwrap();
    a.shared.poll_now().unwrap();
    assert!(c.shared.is_whole());
    assert_eq!(c.fs.namespace_digest(), a.fs.namespace_digest());
}

/// A root of more names than one step of the engine reads (10,000: `load.rs`) is not read
/// at the join, which stays bounded: the joiner holds the root alone, and its first listing
/// of the root reads the names a page at a time.
#[test]
fn a_root_too_large_for_one_step_is_paged_at_its_first_use() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let rack = Rack::new(2);
    let engine = MemEngine::new();
    let a = client(&rack, Arc::new(engine.clone()), "a");
    for i in 0..10_001 {
        let name = format!("f{i}");
        let (_, fh) = a
            .change(|fs| fs.create(ROOT_INO, name.as_bytes(), 0o644, libc::O_WRONLY, common::ME))
            .unwrap();
        a.change(|fs| fs.release(fh));
    }
    let c = client(&rack, Arc::new(engine.clone()), "c");
    assert_eq!(c.fs.inode_count(), 1, "the root alone");
    let paged = Arc::new(AtomicBool::new(false));
    let seen = paged.clone();
    engine.after_names_page(move || seen.store(true, Ordering::SeqCst));
    let got = listed(&c.fs, "");
    assert!(paged.load(Ordering::SeqCst), "read a page at a time");
    assert_eq!(got.len(), 10_001);
    assert_eq!(got, listed(&a.fs, ""));
}
