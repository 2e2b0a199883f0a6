//! The metadata engines' contract (`rmemfs::engine::MetaEngine`), held against each engine:
//! the in-memory one and Redis (a `redis-server` this test starts on a loopback port; the
//! test fails, naming the package, where it is not installed: `tools/test.sh` installs it).
//! Two handles on one volume play two clients.

mod common;

use common::redis::Redis;
use rmemfs::engine::mem::MemEngine;
use rmemfs::engine::redis::RedisEngine;
use rmemfs::engine::{change_locks, drop_session_locks, Checkpoint, EngineError, MetaEngine};
use rmemfs::meta::locks::{FileLock, LockKind, LockOwner, LockType};
use rmemfs::volume::shared::server_order;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(10);

fn contract(a: &dyn MetaEngine, b: &dyn MetaEngine) {
    assert_eq!(a.head().unwrap(), 0);
    assert_eq!(a.checkpoint().unwrap(), None);
    // Only a live session appends, and a heartbeat does not start one.
    assert!(matches!(
        a.heartbeat("a", LONG),
        Err(EngineError::NoSession { .. })
    ));
    a.take_turn("a", LONG, LONG).unwrap();
    assert!(matches!(
        a.append("a", 1, b"one", LONG),
        Err(EngineError::NoSession { .. })
    ));
    a.give_turn("a").unwrap();
    a.start_session("a", LONG).unwrap();
    b.start_session("b", LONG).unwrap();
    // Only in turn.
    assert!(matches!(
        a.append("a", 1, b"one", LONG),
        Err(EngineError::NotYourTurn { .. })
    ));
    a.take_turn("a", LONG, LONG).unwrap();
    a.append("a", 1, b"one", LONG).unwrap();
    // Only in order.
    assert_eq!(
        a.append("a", 3, b"three", LONG),
        Err(EngineError::Behind { head: 1 })
    );
    assert_eq!(
        a.append("a", 1, b"again", LONG),
        Err(EngineError::Behind { head: 1 })
    );
    // The turn is one client's at a time.
    match b.take_turn("b", LONG, Duration::from_millis(50)) {
        Err(EngineError::TurnBusy { holder, .. }) => assert_eq!(holder, "a"),
        other => panic!("b took a held turn: {other:?}"),
    }
    assert!(matches!(
        b.append("b", 2, b"two", LONG),
        Err(EngineError::NotYourTurn { .. })
    ));
    a.give_turn("a").unwrap();
    b.take_turn("b", LONG, LONG).unwrap();
    b.append("b", 2, b"two", LONG).unwrap();
    assert_eq!(a.head().unwrap(), 2);
    assert_eq!(
        a.read_after(0, 10).unwrap(),
        vec![(1, b"one".to_vec()), (2, b"two".to_vec())]
    );
    assert_eq!(a.read_after(1, 1).unwrap(), vec![(2, b"two".to_vec())]);
    assert_eq!(a.read_after(2, 10).unwrap(), vec![]);
    b.give_turn("b").unwrap();

    // A turn whose lease ran out goes to the next, and its old holder may not append.
    let lease = Duration::from_millis(300);
    a.take_turn("a", lease, LONG).unwrap();
    let t = Instant::now();
    b.take_turn("b", LONG, LONG).unwrap();
    assert!(
        t.elapsed() >= lease / 2,
        "b took the turn {:?} into a's lease of {lease:?}",
        t.elapsed()
    );
    assert!(matches!(
        a.append("a", 3, b"late", LONG),
        Err(EngineError::NotYourTurn { .. })
    ));
    b.append("b", 3, b"three", LONG).unwrap();

    // A checkpoint trims the log it holds; an older one does not replace it.
    let ckpt = Checkpoint {
        lsn: 2,
        image: vec![0, 1, 2, 255],
    };
    a.put_checkpoint(&ckpt).unwrap();
    a.put_checkpoint(&Checkpoint {
        lsn: 1,
        image: b"older".to_vec(),
    })
    .unwrap();
    assert_eq!(b.checkpoint().unwrap(), Some(ckpt));
    assert_eq!(b.read_after(0, 10).unwrap(), vec![(3, b"three".to_vec())]);
    b.give_turn("b").unwrap();

    // Sessions: the one whose heartbeats stop is the expired one, until dropped; then it may
    // neither renew nor append.
    a.heartbeat("a", Duration::from_millis(50)).unwrap();
    b.heartbeat("b", LONG).unwrap();
    let deadline = Instant::now() + LONG;
    while a.expired_sessions().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "a's session never expired");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(b.expired_sessions().unwrap(), vec!["a".to_string()]);
    b.drop_session("a").unwrap();
    assert_eq!(b.expired_sessions().unwrap(), Vec::<String>::new());
    assert!(matches!(
        a.heartbeat("a", LONG),
        Err(EngineError::NoSession { .. })
    ));
    a.take_turn("a", LONG, LONG).unwrap();
    let head = a.head().unwrap();
    assert!(matches!(
        a.append("a", head + 1, b"evicted", LONG),
        Err(EngineError::NoSession { .. })
    ));
    a.give_turn("a").unwrap();
}

/// Two clients appending at once, each taking the turn for every record: the log holds every
/// record once, numbered without a gap, each client's in its own order.
fn concurrent(a: Arc<dyn MetaEngine>, b: Arc<dyn MetaEngine>) {
    const EACH: u64 = 200;
    let start = a.head().unwrap();
    a.start_session("x", LONG).unwrap();
    b.start_session("y", LONG).unwrap();
    let run = |e: Arc<dyn MetaEngine>, who: &'static str| {
        std::thread::spawn(move || {
            for i in 0..EACH {
                e.take_turn(who, LONG, LONG).unwrap();
                let lsn = e.head().unwrap() + 1;
                e.append(who, lsn, format!("{who} {i}").as_bytes(), LONG)
                    .unwrap();
                e.give_turn(who).unwrap();
            }
        })
    };
    let (x, y) = (run(a.clone(), "x"), run(b, "y"));
    x.join().unwrap();
    y.join().unwrap();
    let log = a.read_after(start, 10_000).unwrap();
    assert_eq!(log.len() as u64, 2 * EACH);
    for (k, (lsn, _)) in log.iter().enumerate() {
        assert_eq!(*lsn, start + 1 + k as u64);
    }
    for who in ["x", "y"] {
        let mine: Vec<String> = log
            .iter()
            .map(|(_, r)| String::from_utf8(r.clone()).unwrap())
            .filter(|r| r.starts_with(who))
            .collect();
        let want: Vec<String> = (0..EACH).map(|i| format!("{who} {i}")).collect();
        assert_eq!(mine, want);
    }
}

/// A client that waited for the turn is named to its holder by the holder's next append;
/// the turn taken with the log read after a change, in one step.
fn turn_handover(a: &dyn MetaEngine, b: &dyn MetaEngine) {
    a.start_session("ta", LONG).unwrap();
    b.start_session("tb", LONG).unwrap();
    a.take_turn("ta", LONG, LONG).unwrap();
    let head = a.head().unwrap();
    assert_eq!(a.append("ta", head + 1, b"x", LONG), Ok(false));
    assert!(matches!(
        b.take_turn("tb", LONG, Duration::from_millis(20)),
        Err(EngineError::TurnBusy { .. })
    ));
    assert_eq!(a.append("ta", head + 2, b"y", LONG), Ok(true));
    a.give_turn("ta").unwrap();
    let got = b.take_turn_after("tb", LONG, LONG, head, 10).unwrap();
    assert_eq!(
        got,
        vec![(head + 1, b"x".to_vec()), (head + 2, b"y".to_vec())]
    );
    assert_eq!(b.append("tb", head + 3, b"z", LONG), Ok(false));
    b.give_turn("tb").unwrap();
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

#[test]
fn the_in_memory_engine_keeps_the_contract() {
    let e = MemEngine::new();
    contract(&e, &e.clone());
    let e = MemEngine::new();
    concurrent(Arc::new(e.clone()), Arc::new(e));
    let e = MemEngine::new();
    servers_order(&e, &e.clone());
    let e = MemEngine::new();
    turn_handover(&e, &e.clone());
    let e = MemEngine::new();
    locks_contract(&e, &e.clone());
    locks_exclude(Arc::new(e.clone()), Arc::new(e));
}

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
    turn_handover(&*l("t"), &*l("t"));
    servers_order(&*l("s"), &*l("s"));
    let names = l("s").volumes().unwrap();
    assert!(names.contains(&"s".to_string()), "{names:?}");
    locks_contract(&*l("l"), &*l("l"));
    locks_exclude(l("m"), l("m"));
    // A Redis that goes away is an error that says so, not a hang; back, it is used again.
    drop(redis);
    match a.head() {
        Err(EngineError::Unavailable(why)) => assert!(why.contains("redis://"), "{why}"),
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
        Err(EngineError::Unavailable(why)) => assert!(why.contains(&port.to_string()), "{why}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("connected to nothing"),
    }
}
