//! The races of clients that hold the whole namespace: moves that together would make a
//! cycle, two creates of one name, a removal racing a move, a client joining while changes
//! land; and changes of two clients in one directory.

use super::*;

/// The races, two clients (and a third joining midway): two moves that together would make
/// a cycle (`/p/a/f/e` and `/q/b/c/d`: one moves `a` into `d`, the other `b` into `e`; no
/// inode is written by both, only the directories above each new parent are read by the
/// other's check), two creates of one name, a removal racing a move of the same entry.
pub(super) fn races(protocol: Protocol) {
    let engine = engine_for(protocol);
    let setup = Client::join(&engine, "setup", REAL, 1000);
    setup.cycle_tree(&[b"gone"]);
    let at = |path: &[&[u8]]| setup.resolve(path).unwrap();
    let (p, q) = (at(&[b"p"]), at(&[b"q"]));
    let d = at(&[b"q", b"b", b"c", b"d"]);
    let e = at(&[b"p", b"a", b"f", b"e"]);
    let one = Arc::new(Client::join(&engine, "one", protocol, 2000));
    let two = Arc::new(Client::join(&engine, "two", protocol, 3000));
    let t1 = {
        let c = one.clone();
        thread::spawn(move || {
            let moved = c.rename(p, b"a", d, b"a").is_ok();
            let made = c.mkdir(ROOT_INO, b"same").is_ok();
            let removed = c.rmdir(ROOT_INO, b"gone").is_ok();
            (moved, made, removed)
        })
    };
    let t2 = {
        let c = two.clone();
        thread::spawn(move || {
            let moved = c.rename(q, b"b", e, b"b").is_ok();
            let made = c.mkdir(ROOT_INO, b"same").is_ok();
            let renamed = c.rename(ROOT_INO, b"gone", ROOT_INO, b"kept").is_ok();
            (moved, made, renamed)
        })
    };
    // A client joining while the changes land, and the versions trimmed.
    let late = {
        let e = engine.clone();
        thread::spawn(move || Client::join(&e, "late", REAL, 4000))
    };
    let trim = trimmer(&engine);
    let (moved1, made1, removed) = t1.join().unwrap();
    let (moved2, made2, renamed) = t2.join().unwrap();
    let late = late.join().unwrap();
    trim.join().unwrap();
    let truth = replayed(&engine);
    assert!(!(moved1 && moved2), "both moves were taken: a cycle");
    assert!(moved1 || moved2, "neither move was taken");
    assert!(
        made1 != made2,
        "one name made {} times",
        made1 as u8 + made2 as u8
    );
    assert!(removed != renamed, "removed {removed}, moved {renamed}");
    agree(&[&*one, &*two, &late, &setup], &truth);
}

/// Every client's table, caught up, holds the log's history.
pub(super) fn agree(clients: &[&Client], truth: &Meta) {
    for c in clients {
        c.catch_up();
        let (mine, log) = (digest(&c.meta.lock()), digest(truth));
        if mine != log {
            let diff: Vec<_> = mine
                .iter()
                .filter(|(ino, d)| log.get(ino) != Some(d))
                .map(|(ino, d)| (ino, d, log.get(ino)))
                .collect();
            panic!(
                "{}'s table differs from the log's history: {diff:?}",
                c.shared.who
            );
        }
    }
}

/// The races of two clients changing directories at once: two names made in one (`/many`:
/// both taken), a name made in one the other removes (`/box`), and one removed by a client
/// that made and removed a name of its own there first (`/box2`: its own changes there say
/// nothing of the other's, which its table may not hold yet).
pub(super) fn one_directory(protocol: Protocol) {
    let engine = engine_for(protocol);
    let setup = Client::join(&engine, "setup", REAL, 1000);
    for name in [&b"many"[..], b"box", b"box2"] {
        setup.mkdir(ROOT_INO, name).unwrap();
    }
    let at = |name: &[u8]| setup.resolve(&[name]).unwrap();
    let (many, boxed, box2) = (at(b"many"), at(b"box"), at(b"box2"));
    let one = Arc::new(Client::join(&engine, "one", protocol, 2000));
    let two = Arc::new(Client::join(&engine, "two", protocol, 3000));
    let t1 = {
        let c = one.clone();
        thread::spawn(move || {
            let in_box2 = c.mkdir(box2, b"u").is_ok();
            let beside = c.mkdir(many, b"x1").is_ok();
            let boxed = c.mkdir(boxed, b"in").is_ok();
            (beside, boxed, in_box2)
        })
    };
    let t2 = {
        let c = two.clone();
        thread::spawn(move || {
            c.mkdir(box2, b"t").unwrap();
            c.rmdir(box2, b"t").unwrap();
            let unboxed2 = c.rmdir(ROOT_INO, b"box2").is_ok();
            let beside = c.mkdir(many, b"x2").is_ok();
            let unboxed = c.rmdir(ROOT_INO, b"box").is_ok();
            (beside, unboxed, unboxed2)
        })
    };
    let trim = trimmer(&engine);
    let (beside1, boxed, in_box2) = t1.join().unwrap();
    trim.join().unwrap();
    let (beside2, unboxed, unboxed2) = t2.join().unwrap();
    let truth = replayed(&engine);
    assert!(
        beside1 && beside2,
        "two names in one directory: {beside1} {beside2}"
    );
    assert!(
        boxed != unboxed,
        "made in the box {boxed}, the box removed {unboxed}"
    );
    assert!(
        in_box2 != unboxed2,
        "made in box2 {in_box2}, box2 removed {unboxed2}"
    );
    agree(&[&*one, &*two, &setup], &truth);
}
