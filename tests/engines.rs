//! The metadata engines' contract (`rmemfs::engine::MetaEngine`), held against each engine:
//! the in-memory one and Redis (a `redis-server` this test starts on a loopback port; the
//! test fails, naming the package, where it is not installed: `tools/test.sh` installs it).
//! Two handles on one volume play two clients.

mod common;

use common::redis::Redis;
use rmemfs::engine::mem::MemEngine;
use rmemfs::engine::redis::RedisEngine;
use rmemfs::engine::{
    change_locks, drop_session_locks, Appended, Checkpoint, EngineError, KeyOp, Marks, MetaEngine,
    StateDump, Touch, SHARED_FORMAT,
};
use rmemfs::meta::locks::{FileLock, LockKind, LockOwner, LockType};
use rmemfs::volume::shared::server_order;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(10);

/// An append that marks nothing open and drops nothing.
const NONE: Marks<'static> = Marks {
    opened: &[],
    dropped: &[],
    checked: &[],
    state: &[],
};

fn t(key: u64, seen: u64) -> Touch {
    Touch::exclusive(key, seen)
}

fn contract(a: &dyn MetaEngine, b: &dyn MetaEngine) {
    assert_eq!(a.head().unwrap(), 0);
    assert_eq!(a.checkpoint().unwrap(), None);
    assert_eq!(a.checkpoint_lsn().unwrap(), None);
    // Only a live session appends, and a heartbeat does not start one.
    assert!(matches!(
        a.heartbeat("a", LONG),
        Err(EngineError::NoSession { .. })
    ));
    assert!(matches!(
        a.append("a", b"one", &[t(5, 0)], &[], NONE, LONG),
        Err(EngineError::NoSession { .. })
    ));
    a.start_session("a", LONG).unwrap();
    b.start_session("b", LONG).unwrap();
    // The engine numbers changes, in order.
    assert_eq!(
        a.append("a", b"one", &[t(5, 0)], &[], NONE, LONG)
            .unwrap()
            .lsn,
        1
    );
    assert_eq!(
        b.append("b", b"two", &[t(6, 0)], &[], NONE, LONG)
            .unwrap()
            .lsn,
        2
    );
    // A change decided on a view of inode 5 older than change 1 conflicts, naming it;
    // one that saw change 1 is taken. Inodes no change touched have version 0.
    assert_eq!(
        b.append("b", b"stale", &[t(6, 2), t(5, 0)], &[], NONE, LONG),
        Err(EngineError::Conflict { key: 5, lsn: 1 })
    );
    assert_eq!(
        b.append("b", b"three", &[t(5, 1), t(7, 0)], &[], NONE, LONG)
            .unwrap()
            .lsn,
        3
    );
    assert_eq!(a.head().unwrap(), 3);
    assert_eq!(
        a.read_after(0, 10).unwrap(),
        vec![
            (1, b"one".to_vec()),
            (2, b"two".to_vec()),
            (3, b"three".to_vec())
        ]
    );
    assert_eq!(a.read_after(1, 1).unwrap(), vec![(2, b"two".to_vec())]);
    assert_eq!(a.read_after(3, 10).unwrap(), vec![]);

    // A turn: its inode's version is given with it, another client's change touching it is
    // refused (and the holder told it is wanted), its holder's is taken.
    assert_eq!(a.take_turn("a", 5, LONG, LONG).unwrap(), 3);
    match b.take_turn("b", 5, LONG, Duration::from_millis(50)) {
        Err(EngineError::TurnBusy { key: 5, holder, .. }) => assert_eq!(holder, "a"),
        other => panic!("b took a held turn: {other:?}"),
    }
    assert_eq!(
        b.append("b", b"four", &[t(5, 3)], &[], NONE, LONG),
        Err(EngineError::Busy {
            key: 5,
            holder: "a".into()
        })
    );
    // The holder hears it once (however often the other asked), at once.
    assert_eq!(a.wanted("a", LONG).unwrap(), vec![5]);
    assert_eq!(
        a.wanted("a", Duration::from_millis(20)).unwrap(),
        Vec::<u64>::new()
    );
    let took = a.append("a", b"four", &[t(5, 3)], &[], NONE, LONG).unwrap();
    assert_eq!(
        took,
        Appended {
            lsn: 4,
            wanted: vec![5],
            held: vec![],
        }
    );
    a.give_turns("a", &[5]).unwrap();
    assert_eq!(b.take_turn("b", 5, LONG, LONG).unwrap(), 4);
    // Giving back a turn one does not hold does nothing.
    a.give_turns("a", &[5]).unwrap();
    assert!(matches!(
        a.append("a", b"five", &[t(5, 4)], &[], NONE, LONG),
        Err(EngineError::Busy { .. })
    ));
    b.give_turns("b", &[5]).unwrap();

    // A claim makes the new inode's turn the appender's.
    a.append("a", b"make", &[t(9, 0)], &[9], NONE, LONG)
        .unwrap();
    assert!(matches!(
        b.take_turn("b", 9, LONG, Duration::from_millis(20)),
        Err(EngineError::TurnBusy { .. })
    ));
    a.give_turns("a", &[9]).unwrap();

    // A turn whose lease ran out goes to the next, and its old holder's change touching the
    // inode is refused.
    let lease = Duration::from_millis(300);
    a.take_turn("a", 8, lease, LONG).unwrap();
    let started = Instant::now();
    b.take_turn("b", 8, LONG, LONG).unwrap();
    assert!(
        started.elapsed() >= lease / 2,
        "b took the turn {:?} into a's lease of {lease:?}",
        started.elapsed()
    );
    let head = a.head().unwrap();
    assert!(matches!(
        a.append("a", b"late", &[t(8, head)], &[], NONE, LONG),
        Err(EngineError::Busy { .. })
    ));
    b.give_turns("b", &[8]).unwrap();

    // Inode numbers: never given twice, never below a floor.
    let first = a.alloc_inos(10, 0).unwrap();
    let second = b.alloc_inos(10, 0).unwrap();
    assert!(second >= first + 10, "{first} then {second}");
    assert_eq!(a.alloc_inos(5, 1000).unwrap(), 1000);
    assert_eq!(b.alloc_inos(5, 10).unwrap(), 1005);

    // A checkpoint trims the log up to where it is told (changes after it stay for clients
    // that lag), never past itself; an older one does not replace it.
    let head = a.head().unwrap();
    let lsns = |e: &dyn MetaEngine| -> Vec<u64> {
        e.read_after(0, 10)
            .unwrap()
            .iter()
            .map(|(l, _)| *l)
            .collect()
    };
    let ckpt = Checkpoint {
        lsn: head - 1,
        image: vec![0, 1, 2, 255],
    };
    a.put_checkpoint(&ckpt, head - 2).unwrap();
    assert_eq!(lsns(b), vec![head - 1, head]);
    a.put_checkpoint(
        &Checkpoint {
            lsn: 1,
            image: b"older".to_vec(),
        },
        head,
    )
    .unwrap();
    assert_eq!(b.checkpoint().unwrap(), Some(ckpt.clone()));
    assert_eq!(lsns(b), vec![head - 1, head]);
    a.put_checkpoint(&ckpt, head).unwrap();
    assert_eq!(lsns(b), vec![head - 1, head], "not newer: nothing trimmed");
    let newer = Checkpoint {
        lsn: head,
        image: b"newer".to_vec(),
    };
    a.put_checkpoint(&newer, u64::MAX).unwrap();
    assert_eq!(b.checkpoint().unwrap(), Some(newer));
    assert_eq!(b.checkpoint_lsn().unwrap(), Some(head));
    assert_eq!(b.read_after(0, 10).unwrap(), vec![]);

    // Sessions: the one whose heartbeats stop is the expired one, until dropped; then it may
    // neither renew, append nor take a turn.
    a.heartbeat("a", Duration::from_millis(50)).unwrap();
    b.heartbeat("b", LONG).unwrap();
    let deadline = Instant::now() + LONG;
    while a.expired_sessions().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "a's session never expired");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(b.expired_sessions().unwrap(), vec!["a".to_string()]);
    // An expired session is never renewed: whoever saw it expired may be evicting it.
    assert!(matches!(
        a.heartbeat("a", LONG),
        Err(EngineError::NoSession { .. })
    ));
    b.drop_session("a").unwrap();
    assert_eq!(b.expired_sessions().unwrap(), Vec::<String>::new());
    assert!(matches!(
        a.heartbeat("a", LONG),
        Err(EngineError::NoSession { .. })
    ));
    assert!(matches!(
        a.take_turn("a", 5, LONG, LONG),
        Err(EngineError::NoSession { .. })
    ));
    assert!(matches!(
        a.append("a", b"evicted", &[t(77, u64::MAX)], &[], NONE, LONG),
        Err(EngineError::NoSession { .. })
    ));
    // A key only checked (a server's birth, which a chunk's copy there reads): a change
    // after the version seen refuses the append, naming it; checking does not write it, so
    // every append that checks it at that version is taken.
    let head = b.head().unwrap();
    let written = b
        .append("b", b"born", &[t(90, head)], &[], NONE, LONG)
        .unwrap()
        .lsn;
    let stale = [t(90, head)];
    fn checking(seen: &[Touch]) -> Marks<'_> {
        Marks {
            checked: seen,
            ..NONE
        }
    }
    assert_eq!(
        b.append("b", b"copy", &[t(91, 0)], &[], checking(&stale), LONG),
        Err(EngineError::Conflict {
            key: 90,
            lsn: written
        })
    );
    let seen = [t(90, written)];
    for ino in [92, 93] {
        b.append("b", b"copy", &[t(ino, 0)], &[], checking(&seen), LONG)
            .unwrap();
    }
}

/// Sessions through an engine's absence: an engine that heard no heartbeat for its time away
/// (`away`) was away itself (a restart, a failover), so no session is judged on the clock of
/// that outage, and the next heartbeat renews them all; a session that runs out while others'
/// heartbeats arrive is judged expired and never renewed.
fn engine_away(e: &dyn MetaEngine, away: Duration) {
    let short = Duration::from_millis(20);
    e.start_session("x", short).unwrap();
    e.start_session("y", short).unwrap();
    let quiet = Instant::now() + away * 2;
    while Instant::now() < quiet {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(e.expired_sessions().unwrap(), Vec::<String>::new());
    e.heartbeat("x", LONG).unwrap();
    assert_eq!(e.expired_sessions().unwrap(), Vec::<String>::new());
    // Y was renewed with X: it beats on.
    e.heartbeat("y", short).unwrap();
    let deadline = Instant::now() + away;
    while e.expired_sessions().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "y's session never expired");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(e.expired_sessions().unwrap(), vec!["y".to_string()]);
    assert!(matches!(
        e.heartbeat("y", LONG),
        Err(EngineError::NoSession { .. })
    ));
    e.heartbeat("x", LONG).unwrap();
}

/// Files marked open: a drop of one another client marks is refused naming that client, a
/// client's own mark does not stop its own drop, and a client's marks go with its session.
fn open_marks(a: &dyn MetaEngine, b: &dyn MetaEngine) {
    a.start_session("a", LONG).unwrap();
    b.start_session("b", LONG).unwrap();
    // A makes file 10 and opens it (marked by its append); B opens file 11.
    let made = Marks {
        opened: &[10],
        ..NONE
    };
    a.append("a", b"make", &[t(10, 0)], &[], made, LONG)
        .unwrap();
    b.mark_open("b", 11).unwrap();
    assert_eq!(a.open_elsewhere("a", 11).unwrap(), Some("b".to_string()));
    assert_eq!(a.open_elsewhere("a", 10).unwrap(), None);
    assert_eq!(b.open_elsewhere("b", 10).unwrap(), Some("a".to_string()));
    let head = a.head().unwrap();
    let drop = |who: &str, e: &dyn MetaEngine, ino: u64| {
        let marks = Marks {
            dropped: &[ino],
            ..NONE
        };
        e.append(who, b"drop", &[t(ino, head)], &[], marks, LONG)
    };
    match drop("b", b, 10) {
        Err(EngineError::Held { key: 10, holder }) => assert_eq!(holder, "a"),
        other => panic!("a drop of a file open elsewhere: {other:?}"),
    }
    assert_eq!(a.head().unwrap(), head, "a refused drop was appended");
    // Its own mark does not stop A.
    b.unmark_open("b", &[11]).unwrap();
    assert_eq!(a.open_elsewhere("a", 11).unwrap(), None);
    b.mark_open("b", 12).unwrap();
    assert_eq!(a.marked_by("a").unwrap(), vec![10]);
    assert_eq!(b.marked_by("b").unwrap(), vec![12]);
    drop("a", a, 10).unwrap();
    a.unmark_open("a", &[10]).unwrap();
    // B's marks go with its session; one that ended marks nothing.
    b.drop_session("b").unwrap();
    assert_eq!(a.open_elsewhere("a", 12).unwrap(), None);
    assert_eq!(b.marked_by("b").unwrap(), Vec::<u64>::new());
    assert!(matches!(
        b.mark_open("b", 13),
        Err(EngineError::NoSession { .. })
    ));
}

/// Removing a volume: refused while a client's session lives, then every key goes (the
/// volume is as if never made).
fn removal(e: &dyn MetaEngine) {
    assert!(e.create_volume(&["a:1".to_string()]).unwrap());
    e.start_session("r", LONG).unwrap();
    e.append("r", b"make", &[t(3, 0)], &[3], NONE, LONG)
        .unwrap();
    e.mark_open("r", 3).unwrap();
    match e.remove_volume() {
        Err(EngineError::InUse { live }) => assert_eq!(live, vec!["r".to_string()]),
        other => panic!("a volume with a client was removed: {other:?}"),
    }
    assert_eq!(e.head().unwrap(), 1);
    e.drop_session("r").unwrap();
    e.remove_volume().unwrap();
    assert_eq!(e.servers().unwrap(), None);
    assert_eq!(e.head().unwrap(), 0);
    assert_eq!(e.read_after(0, 10).unwrap(), Vec::new());
    assert_eq!(e.format().unwrap(), None);
    assert!(e.create_volume(&["b:2".to_string()]).unwrap());
}

/// A volume made now carries this build's format; one of format 1 (no format) is upgraded
/// only while no other client is live, naming those that are.
fn formats(made: &dyn MetaEngine, old: &dyn MetaEngine) {
    assert!(made.create_volume(&["a:1".to_string()]).unwrap());
    assert_eq!(made.format().unwrap(), Some(SHARED_FORMAT));
    made.upgrade("x").unwrap();
    assert_eq!(old.format().unwrap(), None);
    old.start_session("old-client", LONG).unwrap();
    old.start_session("new-client", LONG).unwrap();
    match old.upgrade("new-client") {
        Err(e @ EngineError::Format { found: 1, .. }) => {
            let why = e.to_string();
            assert!(
                why.contains("old-client") && why.contains("format 1") && why.contains("format 7"),
                "{why}"
            );
        }
        other => panic!("upgraded under a live old client: {other:?}"),
    }
    assert_eq!(old.format().unwrap(), None);
    old.drop_session("old-client").unwrap();
    old.upgrade("new-client").unwrap();
    assert_eq!(old.format().unwrap(), Some(SHARED_FORMAT));
}

/// Two clients appending at once, each change touching an inode of its own and the one
/// both touch (so about half conflict and are decided again after catching up): the log
/// holds every change once, numbered without a gap, each client's in its own order, and
/// every change saw the one before it on the shared inode.
fn concurrent(a: Arc<dyn MetaEngine>, b: Arc<dyn MetaEngine>) {
    const EACH: u64 = 200;
    const SHARED: u64 = 1;
    let start = a.head().unwrap();
    a.start_session("x", LONG).unwrap();
    b.start_session("y", LONG).unwrap();
    let run = |e: Arc<dyn MetaEngine>, who: &'static str, own: u64| {
        std::thread::spawn(move || {
            let mut conflicts = 0;
            for i in 0..EACH {
                loop {
                    // The version of the shared inode as a client catching up knows it.
                    let seen = e.head().unwrap();
                    let record = format!("{who} {i} saw {seen}");
                    match e.append(
                        who,
                        record.as_bytes(),
                        &[t(own, seen), t(SHARED, seen)],
                        &[],
                        NONE,
                        LONG,
                    ) {
                        Ok(_) => break,
                        Err(EngineError::Conflict { key: SHARED, .. }) => conflicts += 1,
                        Err(other) => panic!("{other}"),
                    }
                }
            }
            conflicts
        })
    };
    let (x, y) = (run(a.clone(), "x", 2), run(b, "y", 3));
    x.join().unwrap();
    y.join().unwrap();
    let log = a.read_after(start, 10_000).unwrap();
    assert_eq!(log.len() as u64, 2 * EACH);
    for (k, (lsn, r)) in log.iter().enumerate() {
        assert_eq!(*lsn, start + 1 + k as u64);
        // Serial on the shared inode: each saw every change before its own.
        let text = String::from_utf8(r.clone()).unwrap();
        let saw: u64 = text.rsplit(' ').next().unwrap().parse().unwrap();
        assert_eq!(saw, lsn - 1, "{text} at {lsn}");
    }
    for who in ["x", "y"] {
        let mine: Vec<String> = log
            .iter()
            .map(|(_, r)| String::from_utf8(r.clone()).unwrap())
            .filter(|r| r.starts_with(who))
            .map(|r| r.split(" saw").next().unwrap().to_string())
            .collect();
        let want: Vec<String> = (0..EACH).map(|i| format!("{who} {i}")).collect();
        assert_eq!(mine, want);
    }
}

/// The servers' order: the client that makes the volume gives it; a client naming the same
/// servers in another order is given the volume's, one naming others is refused with both
/// lists. A name the engine does not hold is refused (unless made), naming the ones it holds,
/// and a volume is made once.
fn servers_order(a: &dyn MetaEngine, b: &dyn MetaEngine) {
    let first = vec!["10.0.0.1:7000".to_string(), "10.0.0.2:7000".to_string()];
    let swapped = vec![first[1].clone(), first[0].clone()];
    assert_eq!(b.servers().unwrap(), None);
    let why = server_order(b, "v", &swapped, false).unwrap_err();
    assert!(
        why.contains("no volume 'v'") && why.contains("--create"),
        "{why}"
    );
    assert_eq!(
        b.servers().unwrap(),
        None,
        "a refused attach made the volume"
    );
    assert_eq!(server_order(a, "v", &first, true).unwrap(), first);
    assert!(!a.volumes().unwrap().is_empty());
    let why = server_order(b, "v", &swapped, true).unwrap_err();
    assert!(why.contains("exists already"), "{why}");
    assert_eq!(b.servers().unwrap(), Some(first.clone()));
    assert_eq!(server_order(b, "v", &swapped, false).unwrap(), first);
    let why = server_order(b, "v", &[first[0].clone()], false).unwrap_err();
    assert!(why.contains("10.0.0.1:7000,10.0.0.2:7000"), "{why}");
}

fn posix(typ: Option<LockType>, start: u64, end: u64) -> FileLock {
    FileLock {
        kind: LockKind::Posix,
        typ,
        start,
        end,
        pid: 42,
    }
}

fn owner(session: &str, owner: u64) -> LockOwner {
    LockOwner {
        session: session.into(),
        owner,
    }
}

/// File locks: one inode's table, changed only by compare-and-swap of a live session.
fn locks_contract(a: &dyn MetaEngine, b: &dyn MetaEngine) {
    a.start_session("la", LONG).unwrap();
    b.start_session("lb", LONG).unwrap();
    let (oa, ob) = (owner("la", 1), owner("lb", 1));
    let write = posix(Some(LockType::Write), 0, 99);
    let got = change_locks(a, "la", 5, |t| t.apply(&oa, &write)).unwrap();
    assert_eq!(got, Ok(()));
    // Another client's owner conflicts over a common byte, not beside it.
    let clash = change_locks(b, "lb", 5, |t| {
        t.apply(&ob, &posix(Some(LockType::Read), 50, 60))
    })
    .unwrap();
    assert_eq!(clash.unwrap_err().who, oa);
    change_locks(b, "lb", 5, |t| {
        t.apply(&ob, &posix(Some(LockType::Read), 100, 200))
    })
    .unwrap()
    .unwrap();
    assert_eq!(a.locked_inodes().unwrap(), vec![5]);
    // A swap from a table that changed meanwhile does nothing.
    let now = b.locks(5).unwrap();
    assert!(!b.swap_locks("lb", 5, b"stale", b"").unwrap());
    assert_eq!(b.locks(5).unwrap(), now);
    // A session past its last heartbeat can change no table, even before it is dropped.
    a.start_session("lc", Duration::from_millis(50)).unwrap();
    let deadline = Instant::now() + LONG;
    while !a.expired_sessions().unwrap().contains(&"lc".to_string()) {
        assert!(Instant::now() < deadline, "lc's session never expired");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(matches!(
        a.swap_locks("lc", 5, &now, b""),
        Err(EngineError::NoSession { .. })
    ));
    a.drop_session("lc").unwrap();
    // Dropping a session's locks frees what it held for the others.
    drop_session_locks(b, "lb", "la").unwrap();
    change_locks(b, "lb", 5, |t| {
        t.apply(&ob, &posix(Some(LockType::Write), 50, 60))
    })
    .unwrap()
    .unwrap();
    drop_session_locks(b, "lb", "lb").unwrap();
    assert_eq!(a.locked_inodes().unwrap(), Vec::<u64>::new());
}

/// Four threads on two engine handles take one write lock by trying until it is theirs: no
/// two ever hold it at once, and every try to take it is answered.
fn locks_exclude(a: Arc<dyn MetaEngine>, b: Arc<dyn MetaEngine>) {
    const ROUNDS: usize = 50;
    let inside = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4u64)
        .map(|i| {
            let e = if i % 2 == 0 { a.clone() } else { b.clone() };
            let session = format!("x{i}");
            e.start_session(&session, LONG).unwrap();
            let inside = inside.clone();
            std::thread::spawn(move || {
                let me = owner(&session, i);
                for _ in 0..ROUNDS {
                    let write = posix(Some(LockType::Write), 0, u64::MAX);
                    while change_locks(&*e, &session, 9, |t| t.apply(&me, &write))
                        .unwrap()
                        .is_err()
                    {
                        std::thread::yield_now();
                    }
                    assert_eq!(
                        inside.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two hold the lock"
                    );
                    inside.fetch_sub(1, Ordering::SeqCst);
                    change_locks(&*e, &session, 9, |t| {
                        t.apply(&me, &posix(None, 0, u64::MAX))
                    })
                    .unwrap()
                    .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(a.locks(9).unwrap(), Vec::<u8>::new());
}

/// Shared touches of one key (changes of different names in one directory) are appended at
/// once; an exclusive touch of it (its emptiness read, its attributes set) sees every one,
/// and every later touch of either kind sees the exclusive one. A take's version is the
/// newer of the two.
fn shared_touches(a: &dyn MetaEngine, b: &dyn MetaEngine) {
    a.start_session("a", LONG).unwrap();
    b.start_session("b", LONG).unwrap();
    let s = Touch::shared;
    let x = Touch::exclusive;
    let dir = 40;
    // Two clients that saw the directory at 0 each add a name: both taken.
    let one = a
        .append("a", b"a1", &[s(dir, 0), x(41, 0)], &[], NONE, LONG)
        .unwrap()
        .lsn;
    let two = b
        .append("b", b"b1", &[s(dir, 0), x(42, 0)], &[], NONE, LONG)
        .unwrap()
        .lsn;
    assert!(two > one);
    // An exclusive touch decided before the second is refused, naming it.
    match a.append("a", b"rmdir", &[x(dir, one)], &[], NONE, LONG) {
        Err(EngineError::Conflict { key, lsn }) => assert_eq!((key, lsn), (dir, two)),
        other => panic!("an exclusive touch missed a shared one: {other:?}"),
    }
    // A checked key is read against its exclusive version only.
    let checked = [x(dir, 0)];
    let marks = Marks {
        checked: &checked,
        ..NONE
    };
    a.append("a", b"move", &[x(43, 0)], &[], marks, LONG)
        .unwrap();
    // Decided on everything, it is taken; then a shared touch decided before it is refused.
    let three = a
        .append("a", b"chmod", &[x(dir, two)], &[], NONE, LONG)
        .unwrap()
        .lsn;
    match b.append("b", b"b2", &[s(dir, two)], &[], NONE, LONG) {
        Err(EngineError::Conflict { key, lsn }) => assert_eq!((key, lsn), (dir, three)),
        other => panic!("a shared touch missed an exclusive one: {other:?}"),
    }
    let four = b
        .append("b", b"b2", &[s(dir, three)], &[], NONE, LONG)
        .unwrap();
    assert!(four.held.is_empty(), "no turn was held: {four:?}");
    assert_eq!(b.take_turn("b", dir, LONG, LONG).unwrap(), four.lsn);
    // A shared touch under its own turn says so: no other client's came between.
    let five = b
        .append("b", b"b3", &[s(dir, four.lsn), x(44, 0)], &[], NONE, LONG)
        .unwrap();
    assert_eq!(five.held, vec![dir]);
    // A change touching many keys (a move's ancestors, many files' writes held back) is
    // checked and written whole: a conflict on a key past its first thousand is found.
    let many: Vec<Touch> = (10_000..11_200).map(|k| x(k, 0)).collect();
    let wide = a.append("a", b"wide", &many, &[], NONE, LONG).unwrap().lsn;
    let mut again: Vec<Touch> = (10_000..11_200).map(|k| x(k, wide)).collect();
    again[1_100].seen = wide - 1;
    match a.append("a", b"wide2", &again, &[], NONE, LONG) {
        Err(EngineError::Conflict { key, lsn }) => assert_eq!((key, lsn), (11_100, wide)),
        other => panic!("a stale key among many was missed: {other:?}"),
    }
    let four = a
        .append("a", b"wide3", &again[..1_100], &[], NONE, LONG)
        .unwrap()
        .lsn;
    // A shared touch still waits for another's turn.
    match a.append("a", b"a2", &[s(dir, four)], &[], NONE, LONG) {
        Err(EngineError::Busy { key, holder }) => assert_eq!((key, holder.as_str()), (dir, "b")),
        other => panic!("a shared touch passed another's turn: {other:?}"),
    }
}

/// Versions trimmed read as the floor: a change decided on a table older than it is refused,
/// one that saw it is taken, a take and a version read say it; under the appender's own turn
/// a key not kept reads as never touched (no other client changed it since the take, which
/// said the floor); keys only checked (births, which callers keep) read as never touched
/// too; versions set after the floor stay, and so do those of keys from `kept` up; the floor
/// never passes the head.
fn trimmed_versions(a: &dyn MetaEngine, b: &dyn MetaEngine) {
    a.start_session("a", LONG).unwrap();
    b.start_session("b", LONG).unwrap();
    let kept = 1_000;
    let birth = a
        .append("a", b"born", &[t(kept + 1, 0)], &[], NONE, LONG)
        .unwrap()
        .lsn;
    a.append("a", b"x", &[t(70, 0), t(80, 0)], &[], NONE, LONG)
        .unwrap();
    let shared = [Touch::shared(71, 0), t(72, 0)];
    let floor = b.append("b", b"y", &shared, &[], NONE, LONG).unwrap().lsn;
    assert_eq!(
        a.trim_versions(floor, kept).unwrap(),
        4,
        "70, 80, 71 shared, 72"
    );
    assert_eq!(a.version(70).unwrap(), floor);
    assert_eq!(
        a.version(99).unwrap(),
        floor,
        "never touched: the floor too"
    );
    assert_eq!(a.version(kept + 1).unwrap(), birth, "a kept key's version");
    // A table older than the floor is sent to catch up, whatever the key.
    match b.append("b", b"stale", &[t(99, floor - 1)], &[], NONE, LONG) {
        Err(EngineError::Conflict { key, lsn }) => assert_eq!((key, lsn), (99, floor)),
        other => panic!("a change older than the floor was taken: {other:?}"),
    }
    match b.append(
        "b",
        b"stale",
        &[Touch::shared(71, floor - 1)],
        &[],
        NONE,
        LONG,
    ) {
        Err(EngineError::Conflict { key, lsn }) => assert_eq!((key, lsn), (71, floor)),
        other => panic!("a shared touch older than the floor was taken: {other:?}"),
    }
    // Under its own turn (taken: the take says the floor), a client's change of a key not
    // kept is taken whatever it saw; another's is still refused at the floor.
    assert_eq!(b.take_turn("b", 80, LONG, LONG).unwrap(), floor);
    let checked = [t(kept + 2, 0)];
    let marks = Marks {
        checked: &checked,
        ..NONE
    };
    let own = b
        .append("b", b"own", &[t(80, 0)], &[], marks, LONG)
        .unwrap()
        .lsn;
    b.give_turns("b", &[80]).unwrap();
    match a.append("a", b"stale", &[t(81, 0)], &[], NONE, LONG) {
        Err(EngineError::Conflict { key, lsn }) => assert_eq!((key, lsn), (81, floor)),
        other => panic!("a change older than the floor was taken: {other:?}"),
    }
    // One that saw the floor is taken; the version it sets stays through the next trim.
    let after = b
        .append("b", b"fresh", &[t(70, own), t(99, own)], &[], NONE, LONG)
        .unwrap()
        .lsn;
    assert_eq!(b.take_turn("b", 72, LONG, LONG).unwrap(), floor);
    assert_eq!(b.take_turn("b", 70, LONG, LONG).unwrap(), after);
    b.give_turns("b", &[70, 72]).unwrap();
    assert_eq!(a.trim_versions(floor, kept).unwrap(), 0);
    assert_eq!(a.version(70).unwrap(), after);
    // The floor never goes back, nor past the head.
    a.trim_versions(1, kept).unwrap();
    assert_eq!(a.version(72).unwrap(), floor);
    assert_eq!(
        a.trim_versions(after + 100, kept).unwrap(),
        3,
        "80, 70 and 99"
    );
    assert_eq!(a.version(72).unwrap(), after);
    assert_eq!(a.head().unwrap(), after);
}

/// The state's writes ([`KeyOp`]) run with the append that sends them, in its step, as the
/// reference ([`rmemfs::engine::state::apply`]) runs them: every kind, binary fields and
/// values, the change's LSN placed where asked, a count gone at 0, a time only raised; a
/// refused append writes nothing; [`MetaEngine::put_state`] writes only at the head it
/// names, and marks the state whole when asked.
fn state_writes(a: &dyn MetaEngine, b: &dyn MetaEngine) {
    a.start_session("a", LONG).unwrap();
    let h = |s: &str| s.to_string();
    let put = |hash: &str, field: &[u8], value: &[u8]| KeyOp::Put {
        hash: h(hash),
        field: field.to_vec(),
        value: value.to_vec(),
    };
    let add = |field: &[u8], by| KeyOp::Add {
        hash: h("s:n"),
        field: field.to_vec(),
        by,
    };
    let later = |field: &[u8], secs, nanos| KeyOp::Later {
        hash: h("s:t"),
        field: field.to_vec(),
        secs,
        nanos,
    };
    let rounds = [
        vec![
            put("s:one", b"f\x00 1", b"v 1\xff"),
            put("s:one", b"g", b"gone"),
            KeyOp::PutPlaced {
                hash: h("s:two"),
                field: b"p".to_vec(),
                value: b"placed".to_vec(),
            },
            KeyOp::PutAtPlace {
                hash: h("s:hist"),
                field: b"a".to_vec(),
                value: b"first".to_vec(),
            },
            KeyOp::PutAtPlace {
                hash: h("s:hist"),
                field: b"b".to_vec(),
                value: b"beside".to_vec(),
            },
            add(b"c", 2),
            add(b"z", -1),
            later(b"d", 100, 5),
            put("s:gone", b"x", b"y"),
        ],
        vec![
            KeyOp::Remove {
                hash: h("s:one"),
                field: b"g".to_vec(),
            },
            KeyOp::PutAtPlace {
                hash: h("s:hist"),
                field: b"a".to_vec(),
                value: b"second".to_vec(),
            },
            add(b"c", -2),
            add(b"z", -4),
            later(b"d", 99, 999_999_999),
            later(b"e", 100, 4),
            KeyOp::Clear { hash: h("s:gone") },
        ],
        vec![later(b"d", 100, 6)],
    ];
    let mut reference = StateDump::new();
    let mut seen = a.head().unwrap();
    for ops in &rounds {
        let marks = Marks { state: ops, ..NONE };
        seen = a
            .append("a", b"r", &[t(1, seen)], &[], marks, LONG)
            .unwrap()
            .lsn;
        rmemfs::engine::state::apply(&mut reference, seen, ops);
    }
    assert_eq!(b.state().unwrap(), reference);
    let first = seen - 2;
    assert_eq!(reference["s:one"][b"f\x00 1".as_slice()], b"v 1\xff");
    assert_eq!(
        reference["s:two"][b"p".as_slice()],
        format!("{first} placed").as_bytes()
    );
    assert_eq!(
        reference["s:hist"].len(),
        3,
        "one field per place and field"
    );
    assert_eq!(
        reference["s:hist"][format!("{first}:b").as_bytes()],
        b"beside"
    );
    assert!(!reference["s:n"].contains_key(b"c".as_slice()), "0: gone");
    assert_eq!(reference["s:n"][b"z".as_slice()], b"-5");
    assert_eq!(reference["s:t"][b"d".as_slice()], b"100 6");
    assert_eq!(reference["s:t"][b"e".as_slice()], b"100 4");
    assert!(!reference.contains_key("s:gone"));
    // A refused append (a conflict) writes nothing.
    let stale = [KeyOp::Clear { hash: h("s:one") }];
    let marks = Marks {
        state: &stale,
        ..NONE
    };
    assert!(matches!(
        a.append("a", b"r", &[t(1, 0)], &[], marks, LONG),
        Err(EngineError::Conflict { .. })
    ));
    assert_eq!(b.state().unwrap(), reference);
    // An image written only at the head it is of.
    assert!(
        !b.state_whole().unwrap(),
        "a volume not made by this build's create"
    );
    let image = [put("s:img", b"k", b"v")];
    assert!(!b.put_state(seen - 1, &image, true).unwrap());
    assert_eq!(b.state().unwrap(), reference);
    assert!(!b.state_whole().unwrap());
    assert!(b.put_state(seen, &image, true).unwrap());
    rmemfs::engine::state::apply(&mut reference, seen, &image);
    assert_eq!(b.state().unwrap(), reference);
    assert!(b.state_whole().unwrap());
    // A load reads a directory's names, the hash of each inode they name and of each inode
    // asked for, and the births; nothing else; with the head.
    use rmemfs::engine::state::{BORN, INODE, NAMES};
    let layout = [
        put(&format!("{NAMES}1"), b"a", b"10"),
        put(&format!("{NAMES}1"), b"b", b"11"),
        put(&format!("{NAMES}11"), b"deeper", b"12"),
        put(&format!("{INODE}10"), b"m", b"m10"),
        put(&format!("{INODE}10"), b"x:user.x", b"x"),
        put(&format!("{INODE}11"), b"m", b"m11"),
        put(&format!("{INODE}12"), b"m", b"m12"),
        put(&format!("{INODE}13"), b"c:0", b"c13"),
        KeyOp::PutAtPlace {
            hash: h(BORN),
            field: b"0".to_vec(),
            value: b"born".to_vec(),
        },
    ];
    assert!(b.put_state(seen, &layout, false).unwrap());
    rmemfs::engine::state::apply(&mut reference, seen, &layout);
    let load = a.load_state(&[1], &[13], u64::MAX).unwrap();
    assert_eq!(load.head, seen);
    assert!(load.too_big.is_empty());
    let (want, _) = rmemfs::engine::state::load(&reference, &[1], &[13], u64::MAX);
    assert_eq!(load.dump, want);
    let hashes: Vec<&str> = load.dump.keys().map(String::as_str).collect();
    assert_eq!(
        hashes,
        vec!["s:born", "s:d:1", "s:i:10", "s:i:11", "s:i:13"],
        "not the names below 11, nor 12"
    );
    assert_eq!(load.dump["s:i:10"].len(), 2);
    // A directory of more names than a load may read is left out, named, and so are the
    // inodes its names lead to; a smaller one beside it is read.
    let small = a.load_state(&[1, 11], &[13], 1).unwrap();
    assert_eq!(small.too_big, vec![1]);
    let hashes: Vec<&str> = small.dump.keys().map(String::as_str).collect();
    assert_eq!(hashes, vec!["s:born", "s:d:11", "s:i:12", "s:i:13"]);
    // Its names a page at a time (every name, however the engine cuts the pages), with the
    // log's head.
    let pages = |e: &dyn MetaEngine| {
        let (mut names, mut cursor, mut heads) = (Vec::new(), 0, Vec::new());
        loop {
            let page = e.names_page(1, cursor, 1).unwrap();
            heads.push(page.head);
            names.extend(page.names);
            if page.next == 0 {
                names.sort();
                names.dedup();
                return (names, heads);
            }
            cursor = page.next;
        }
    };
    let (names, heads) = pages(b);
    assert_eq!(names, vec![(b"a".to_vec(), 10), (b"b".to_vec(), 11)]);
    assert!(heads.iter().all(|h| *h == seen), "{heads:?}");
    let moved = [put(&format!("{NAMES}1"), b"c", b"12")];
    let marks = Marks {
        state: &moved,
        ..NONE
    };
    let shared = Touch::shared(1, seen);
    let lsn = a
        .append("a", b"r", &[shared], &[], marks, LONG)
        .unwrap()
        .lsn;
    let (names, heads) = pages(b);
    assert_eq!(names.len(), 3);
    assert!(heads.iter().all(|h| *h == lsn), "{heads:?}");
    assert!(
        b.names_page(99, 0, 10).unwrap().names.is_empty(),
        "no such directory"
    );
    let mut inodes = b.state_inodes().unwrap();
    inodes.sort_unstable();
    assert_eq!(inodes, vec![10, 11, 12, 13]);
}

#[test]
fn the_in_memory_engine_keeps_the_contract() {
    let e = MemEngine::new();
    contract(&e, &e.clone());
    let e = MemEngine::new();
    concurrent(Arc::new(e.clone()), Arc::new(e));
    let e = MemEngine::new();
    servers_order(&e, &e.clone());
    formats(&MemEngine::new(), &MemEngine::format_1(&[]));
    let e = MemEngine::new();
    locks_contract(&e, &e.clone());
    locks_exclude(Arc::new(e.clone()), Arc::new(e));
    engine_away(&MemEngine::new().with_away(AWAY), AWAY);
    let e = MemEngine::new();
    open_marks(&e, &e.clone());
    removal(&MemEngine::new());
    let e = MemEngine::new();
    shared_touches(&e, &e.clone());
    let e = MemEngine::new();
    trimmed_versions(&e, &e.clone());
    assert_eq!(e.versions_kept(), 1, "the kept key's");
    let e = MemEngine::new();
    state_writes(&e, &e.clone());
    noted_inodes(&MemEngine::new(), &MemEngine::new());
    let made = MemEngine::new();
    assert!(made.create_volume(&["a:1".into()]).unwrap());
    assert!(made.state_whole().unwrap(), "a new volume's state: whole");
}

/// The count of inodes a client noted is what every client of the volume reads, the last
/// noted; none before any, and none for another volume. The state's dump leaves it out.
/// The evicted sessions owed to the keeper are a set, each gone once collected.
fn noted_inodes(e: &dyn MetaEngine, other: &dyn MetaEngine) {
    assert_eq!(e.noted_inodes().unwrap(), None);
    e.note_inodes(221).unwrap();
    e.note_inodes(222).unwrap();
    assert_eq!(e.noted_inodes().unwrap(), Some(222));
    assert_eq!(other.noted_inodes().unwrap(), None);
    let dump = e.state().unwrap();
    assert!(
        dump.values().all(|h| !h.contains_key(&b"inodes"[..])),
        "{dump:?}"
    );
    // Evicted sessions' memory owed to the keeper: each once, until collected.
    assert_eq!(e.owed_collections().unwrap(), Vec::<String>::new());
    for who in ["b", "a", "b"] {
        e.owe_collection(who).unwrap();
    }
    let mut owed = e.owed_collections().unwrap();
    owed.sort();
    assert_eq!(owed, vec!["a".to_string(), "b".to_string()]);
    e.collected("b").unwrap();
    e.collected("nobody").unwrap();
    assert_eq!(e.owed_collections().unwrap(), vec!["a".to_string()]);
    assert_eq!(other.owed_collections().unwrap(), Vec::<String>::new());
}

/// A short time away for [`engine_away`].
const AWAY: Duration = Duration::from_millis(300);

#[test]
fn the_redis_engine_keeps_the_contract() {
    let redis = Redis::start();
    let a = RedisEngine::open(&redis.url, "vol").unwrap();
    let b = RedisEngine::open(&redis.url, "vol").unwrap();
    contract(&a, &b);
    // Another volume's keys are its own.
    let other = RedisEngine::open(&redis.url, "other").unwrap();
    assert_eq!(other.head().unwrap(), 0);
    concurrent(
        Arc::new(RedisEngine::open(&redis.url, "c").unwrap()),
        Arc::new(RedisEngine::open(&redis.url, "c").unwrap()),
    );
    let l = |v| Arc::new(RedisEngine::open(&redis.url, v).unwrap());
    formats(&*l("f"), &*l("g"));
    // A client of format 1 reads the servers' key as it is: an upgraded or new volume's
    // list has one more line than any mount names, so such a client refuses to mount,
    // naming it; this build skips it.
    let raw = |volume: &str| -> String {
        let mut c = ::redis::Client::open(redis.url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        ::redis::cmd("GET")
            .arg(format!("rmemfs:{{{volume}}}:servers"))
            .query(&mut c)
            .unwrap()
    };
    assert!(raw("f").contains("shared format 7"), "{}", raw("f"));
    assert_eq!(l("f").servers().unwrap(), Some(vec!["a:1".to_string()]));
    {
        let mut c = ::redis::Client::open(redis.url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let _: () = ::redis::cmd("SET")
            .arg("rmemfs:{h}:servers")
            .arg("a:1\nb:2")
            .query(&mut c)
            .unwrap();
    }
    l("h").upgrade("new").unwrap();
    assert!(raw("h").starts_with("a:1\nb:2\n") && raw("h").contains("shared format 7"));
    // A volume of format 2 (made by the build before marks of open files): upgraded once no
    // other client lives, its servers' format line replaced, so a format-2 client refuses it.
    {
        let mut c = ::redis::Client::open(redis.url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let _: () = ::redis::cmd("MSET")
            .arg("rmemfs:{v2}:servers")
            .arg("a:1\n(shared format 2: mount with an rmemfs that speaks it)")
            .arg("rmemfs:{v2}:format")
            .arg("2")
            .query(&mut c)
            .unwrap();
    }
    let v2 = l("v2");
    v2.start_session("old-2", LONG).unwrap();
    match v2.upgrade("new") {
        Err(EngineError::Format { found: 2, live, .. }) => assert_eq!(live, vec!["old-2"]),
        other => panic!("upgraded under a live format-2 client: {other:?}"),
    }
    v2.drop_session("old-2").unwrap();
    v2.upgrade("new").unwrap();
    assert_eq!(v2.format().unwrap(), Some(SHARED_FORMAT));
    assert_eq!(v2.servers().unwrap(), Some(vec!["a:1".to_string()]));
    assert!(
        !raw("v2").contains("format 2") && raw("v2").contains("format 7"),
        "{}",
        raw("v2")
    );
    assert_eq!(
        l("h").servers().unwrap(),
        Some(vec!["a:1".to_string(), "b:2".to_string()])
    );
    servers_order(&*l("s"), &*l("s"));
    let names = l("s").volumes().unwrap();
    assert!(names.contains(&"s".to_string()), "{names:?}");
    locks_contract(&*l("l"), &*l("l"));
    locks_exclude(l("m"), l("m"));
    engine_away(
        &RedisEngine::open(&redis.url, "away")
            .unwrap()
            .with_away(AWAY),
        AWAY,
    );
    open_marks(&*l("o"), &*l("o"));
    removal(&*l("r"));
    shared_touches(&*l("st"), &*l("st"));
    trimmed_versions(&*l("tv"), &*l("tv"));
    state_writes(&*l("sw"), &*l("sw"));
    noted_inodes(&*l("ni"), &*l("ni-other"));
    let made = l("made");
    assert!(made.create_volume(&["a:1".into()]).unwrap());
    assert!(made.state_whole().unwrap(), "a new volume's state: whole");
    {
        let mut c = ::redis::Client::open(redis.url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let kept: Vec<u64> = ["vers", "svers"]
            .iter()
            .map(|h| {
                ::redis::cmd("HLEN")
                    .arg(format!("rmemfs:{{tv}}:{h}"))
                    .query(&mut c)
                    .unwrap()
            })
            .collect();
        assert_eq!(kept, vec![1, 0], "the kept key's version only");
    }
    // Nothing of it is left in Redis but the keys of the one made again after.
    let mut c = ::redis::Client::open(redis.url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = ::redis::cmd("DEL")
        .arg("rmemfs:{r}:servers")
        .arg("rmemfs:{r}:format")
        .arg("rmemfs:{r}:turn")
        .arg("rmemfs:{r}:s:info")
        .query(&mut c)
        .unwrap();
    let left: Vec<String> = ::redis::cmd("KEYS")
        .arg("rmemfs:{r}:*")
        .query(&mut c)
        .unwrap();
    assert_eq!(left, Vec::<String>::new());
    // A Redis that goes away is an error that says so, not a hang; back, it is used again.
    drop(redis);
    match a.head() {
        Err(EngineError::Unavailable(why) | EngineError::Unreached(why)) => {
            assert!(why.contains("redis://"), "{why}")
        }
        other => panic!("a dead Redis answered {other:?}"),
    }
}

#[test]
fn a_redis_that_is_not_there_is_named() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    match RedisEngine::open(&format!("redis://127.0.0.1:{port}"), "vol") {
        Err(EngineError::Unavailable(why) | EngineError::Unreached(why)) => {
            assert!(why.contains(&port.to_string()), "{why}")
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("connected to nothing"),
    }
}

/// A Redis that evicts keys when full is refused, naming the setting.
#[test]
fn a_redis_that_evicts_keys_is_refused() {
    let redis = Redis::start();
    let mut c = ::redis::Client::open(redis.url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let set = |c: &mut ::redis::Connection, policy: &str| {
        ::redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory-policy")
            .arg(policy)
            .query::<()>(c)
            .unwrap()
    };
    set(&mut c, "allkeys-lru");
    match RedisEngine::open(&redis.url, "vol") {
        Err(e) => assert!(e.to_string().contains("noeviction"), "{e}"),
        Ok(_) => panic!("a Redis that evicts keys was taken"),
    }
    set(&mut c, "volatile-lru");
    RedisEngine::open(&redis.url, "vol").unwrap();
}

/// A Redis that asks for a password is reached with it in the URL (`redis://:PASS@HOST`),
/// and refused, saying so, without it.
#[test]
fn a_redis_password_goes_in_the_url() {
    let redis = Redis::start();
    let mut c = ::redis::Client::open(redis.url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    ::redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("s3cret")
        .query::<()>(&mut c)
        .unwrap();
    match RedisEngine::open(&redis.url, "vol") {
        Err(e) => assert!(
            e.to_string().contains("NOAUTH") || e.to_string().contains("auth"),
            "{e}"
        ),
        Ok(_) => panic!("a Redis that asks for a password was reached without it"),
    }
    let with = redis.url.replacen("redis://", "redis://:s3cret@", 1);
    let e = RedisEngine::open(&with, "vol").unwrap();
    assert!(e.create_volume(&["a:1".to_string()]).unwrap());
    // Never shown: not in what names the engine, nor in an error.
    assert!(!e.describe().contains("s3cret"), "{}", e.describe());
    let bad = redis.url.replacen("redis://", "redis://:wrong@", 1);
    match RedisEngine::open(&bad, "vol") {
        Err(e) => assert!(!e.to_string().contains("wrong"), "{e}"),
        Ok(_) => panic!("a wrong password was taken"),
    }
    // Or from the environment (RMEMFS_META_PASSWORD), off the command line.
    let from_env = rmemfs::engine::with_password(&redis.url, Some("s3cret".into()));
    let e = rmemfs::engine::open(&from_env, "vol").unwrap();
    assert_eq!(e.servers().unwrap(), Some(vec!["a:1".to_string()]));
    assert_eq!(
        rmemfs::engine::with_password("redis://u:p@h:1", Some("x".into())),
        "redis://u:p@h:1"
    );
    assert_eq!(
        rmemfs::engine::redacted("redis://u:p@h:1/2"),
        "redis://u:***@h:1/2"
    );
}

/// `--meta` chooses the engine by its URL's scheme; one this build does not have is refused,
/// naming the ones it has (not taken for Redis).
#[test]
fn the_engine_is_chosen_by_its_url() {
    for url in ["tikv://127.0.0.1:2379", "127.0.0.1:6379"] {
        match rmemfs::engine::open(url, "vol") {
            Err(why) => assert!(
                why.contains("no metadata engine") && why.contains("redis://"),
                "{url}: {why}"
            ),
            Ok(e) => panic!("{url} opened {}", e.describe()),
        }
    }
    let redis = Redis::start();
    let e = rmemfs::engine::open(&redis.url, "vol").unwrap();
    assert!(e.describe().contains("redis"), "{}", e.describe());
}

/// `rediss://` reaches Redis over TLS: its certificate is checked (against the authority
/// given, not taken on trust: the same Redis with the system's roots is refused), and the
/// engine works over it as over plain TCP.
#[test]
fn a_redis_over_tls_is_reached_with_its_authority() {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let dir = tempfile_dir();
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let params = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let (cert_file, key_file) = (dir.join("redis.crt"), dir.join("redis.key"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let (redis, tls_url) = Redis::start_tls(&cert_file, &key_file);
    let ca_pem = ca.pem().into_bytes();
    let e = RedisEngine::open_with_ca(&tls_url, "vol", Some(ca_pem.clone())).unwrap();
    assert!(e.create_volume(&["a:1".to_string()]).unwrap());
    e.start_session("c", LONG).unwrap();
    let done = e.append("c", b"one", &[t(5, 0)], &[], NONE, LONG).unwrap();
    assert_eq!(
        e.read_after(done.lsn - 1, 8).unwrap(),
        vec![(done.lsn, b"one".to_vec())]
    );
    // What plain TCP on the same Redis holds: one history.
    let plain = RedisEngine::open(&redis.url, "vol").unwrap();
    assert_eq!(plain.servers().unwrap(), Some(vec!["a:1".to_string()]));
    // Not taken on trust: the system's roots do not know this authority.
    match RedisEngine::open(&tls_url, "vol") {
        Err(why) => assert!(
            why.to_string().to_lowercase().contains("certificate"),
            "{why}"
        ),
        Ok(_) => panic!("a certificate no known authority signed was taken"),
    }
    // Nor spoken to in the clear.
    let clear = tls_url.replacen("rediss://", "redis://", 1);
    assert!(RedisEngine::open(&clear, "vol").is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("rmemfs-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
