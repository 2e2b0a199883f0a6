//! A live mount's servers changed (`rmemfs admin add-server`, `drain`, `remove`) over
//! in-process servers: a drain never leaves a chunk short of its copies, ends with nothing of
//! the mount on the server, and moves a volume's journal; an added server takes new chunks;
//! a volume re-attaches without the server it forgot.

mod common;

use common::{bytes, TestFs};
use rmemfs::client::ServerState;
use rmemfs::data::WritePath;
use rmemfs::fabric::ServerId;
use rmemfs::upkeep::membership;
use rmemfs::upkeep::rebuild::Stop;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

const MIB: usize = 1 << 20;

/// The addresses that hold a copy of each chunk of `path`.
fn placement(t: &TestFs, path: &str) -> Vec<BTreeSet<String>> {
    t.placement_addrs(path)
}

/// Bytes the server at index `i` has given out (to anyone).
fn used_on(t: &TestFs, i: usize) -> u64 {
    let c = t.servers[i].capacity();
    c.total - c.free
}

/// Files `f0`.. `f{n-1}`, each `len` bytes of pattern `seed + i`, written; their bytes.
fn write_files(t: &TestFs, n: u64, seed: u64, len: usize) -> Vec<Vec<u8>> {
    let files: Vec<Vec<u8>> = (0..n).map(|i| bytes(seed + i, len)).collect();
    for (i, d) in files.iter().enumerate() {
        t.create(&format!("f{i}")).unwrap();
        t.write_file(&format!("f{i}"), 0, d).unwrap();
    }
    files
}

/// Every chunk of each of `files` (see [`write_files`]) has `copies` copies, none on `gone`,
/// and the file reads back whole.
fn each_file_has_copies_off(t: &TestFs, files: &[Vec<u8>], copies: usize, gone: SocketAddr) {
    for (i, d) in files.iter().enumerate() {
        let p = placement(t, &format!("f{i}"));
        assert!(
            p.iter()
                .all(|c| c.len() == copies && !c.contains(&gone.to_string())),
            "f{i}: {p:?}"
        );
        assert_eq!(&t.read_file(&format!("f{i}")).unwrap(), d);
    }
}

/// `rmemfs admin drain` of the server at `addr`, at no rate limit.
fn drain(t: &TestFs, addr: SocketAddr) -> Result<membership::Drained, String> {
    membership::drain(
        &t.fs,
        None,
        &Default::default(),
        addr,
        0,
        &Stop::default(),
        &|_| {},
    )
}

#[test]
fn a_drain_keeps_every_copy_and_ends_with_nothing_on_the_server() {
    let t = TestFs::replicated(3, 32 << 20, MIB as u64, WritePath::Frrwp, 2);
    let files = write_files(&t, 4, 0, 3 * MIB + 777);
    let gone = t.servers[2].local_addr();
    assert!(placement(&t, "f0")
        .iter()
        .chain(&placement(&t, "f1"))
        .any(|c| c.contains(&gone.to_string())));
    let pool = t.fs.data().pool();
    assert!(used_on(&t, 2) > 0);

    // Reads and writes go on during the drain, and a sampler checks every chunk's copies.
    let (stop, samples, short) = (AtomicBool::new(false), AtomicU64::new(0), AtomicU64::new(0));
    let written = bytes(99, 2 * MIB);
    let drained = std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                let h = t.fs.replica_health();
                samples.fetch_add(1, Ordering::SeqCst);
                short.fetch_add(h.degraded + h.lost, Ordering::SeqCst);
            }
        });
        s.spawn(|| {
            t.create("during").unwrap();
            for round in 0..8 {
                t.write_file("during", (round * 4096) as u64, &written[..MIB])
                    .unwrap();
            }
            t.write_file("during", 0, &written).unwrap();
        });
        let d = drain(&t, gone);
        stop.store(true, Ordering::SeqCst);
        d
    })
    .unwrap();
    assert!(samples.load(Ordering::SeqCst) > 0);
    assert_eq!(
        short.load(Ordering::SeqCst),
        0,
        "a chunk had fewer than 2 live copies during the drain"
    );
    assert!(drained.bytes_moved > 0, "{drained:?}");
    each_file_has_copies_off(&t, &files, 2, gone);
    assert_eq!(t.read_file("during").unwrap(), written);
    let held = pool.held_on(ServerId(2)).unwrap();
    assert_eq!((held.extents, held.bytes), (0, 0));
    assert_eq!(used_on(&t, 2), 0, "the drained server gave out nothing");

    membership::remove(&t.fs, None, gone).unwrap();
    assert_eq!(pool.status()[2].state, ServerState::Removed);
    assert!(
        membership::remove(&t.fs, None, gone).is_err(),
        "removed twice"
    );
    // The mount goes on with two servers: a new file gets two copies, none on the third.
    t.create("after").unwrap();
    t.write_file("after", 0, &files[0]).unwrap();
    assert!(placement(&t, "after")
        .iter()
        .all(|c| c.len() == 2 && !c.contains(&gone.to_string())));
    assert_eq!(t.fs.replica_health().degraded, 0);
}

/// Four copies, the most a chunk lists: a drain's new copy takes the slot of the copy it
/// replaces (before, it had no slot, and the drain waited until it gave up as stuck).
#[test]
fn a_drain_of_chunks_with_every_slot_taken_replaces_each_copy_in_place() {
    let t = TestFs::replicated(5, 16 << 20, MIB as u64, WritePath::Frrwp, 4);
    let files = write_files(&t, 3, 0, 2 * MIB + 555);
    let gone = t.servers[1].local_addr();
    assert!(placement(&t, "f0")
        .iter()
        .any(|c| c.contains(&gone.to_string())));
    let drained = drain(&t, gone).unwrap();
    assert!(drained.chunks_moved > 0, "{drained:?}");
    each_file_has_copies_off(&t, &files, 4, gone);
    let h = t.fs.replica_health();
    assert_eq!((h.degraded, h.lost, h.moving), (0, 0, 0), "{h:?}");
    assert_eq!(used_on(&t, 1), 0, "the drained server gave out nothing");
}

#[test]
fn a_drain_that_would_leave_too_few_servers_is_refused_and_changes_nothing() {
    let t = TestFs::replicated(2, 16 << 20, MIB as u64, WritePath::Frrwp, 2);
    t.create("f").unwrap();
    t.write_file("f", 0, &bytes(1, MIB)).unwrap();
    let addr = t.servers[1].local_addr();
    let e = drain(&t, addr).unwrap_err();
    assert!(e.contains("set-replicas"), "{e}");
    assert!(!t.fs.data().pool().is_draining(ServerId(1)));
    let e = membership::remove(&t.fs, None, addr).unwrap_err();
    assert!(e.contains("not drained"), "{e}");
    let e = drain(&t, "127.0.0.1:1".parse().unwrap()).unwrap_err();
    assert!(e.contains("not in this mount"), "{e}");
}

#[test]
fn an_added_server_takes_new_chunks_and_a_drain_can_move_onto_it() {
    let mut t = TestFs::replicated(2, 16 << 20, MIB as u64, WritePath::Frrwp, 2);
    let old = bytes(5, 4 * MIB);
    t.create("old").unwrap();
    t.write_file("old", 0, &old).unwrap();
    let addr = t.start_server();
    let id = membership::add_server(&t.fs, None, addr).unwrap();
    assert_eq!(id, ServerId(2));
    assert!(membership::add_server(&t.fs, None, addr).is_err(), "twice");
    // The new server is the emptiest: every new chunk has a copy there.
    t.create("new").unwrap();
    t.write_file("new", 0, &bytes(6, 3 * MIB)).unwrap();
    let p = placement(&t, "new");
    assert!(p.iter().all(|c| c.contains(&addr.to_string())), "{p:?}");
    // With three servers, one of the first two can be drained now.
    let first = t.servers[0].local_addr();
    drain(&t, first).unwrap();
    assert_eq!(used_on(&t, 0), 0);
    assert_eq!(t.read_file("old").unwrap(), old);
    // add-server of a drained (not removed) server calls the drain off: it is the emptiest
    // again, so a new file's chunks each get a copy there.
    let pool = t.fs.data().pool();
    assert!(pool.is_draining(ServerId(0)));
    assert_eq!(
        membership::add_server(&t.fs, None, first).unwrap(),
        ServerId(0)
    );
    assert!(!pool.is_draining(ServerId(0)));
    t.create("back").unwrap();
    t.write_file("back", 0, &bytes(7, 2 * MIB)).unwrap();
    let p = placement(&t, "back");
    assert!(p.iter().all(|c| c.contains(&first.to_string())), "{p:?}");
}

#[test]
fn a_volume_drain_moves_its_journal_and_a_reattach_needs_no_removed_server() {
    let mut t = TestFs::volume(3, 32 << 20, MIB as u64, WritePath::Frrwp, "vol");
    let data = bytes(8, 3 * MIB + 5);
    t.create("a").unwrap();
    t.write_file("a", 0, &data).unwrap();
    t.fs.sync().unwrap().unwrap();
    // A fourth server joins (named in the root first), then the first leaves: it held a
    // journal copy (the ring is on the first servers of the pool).
    let extra = t.start_server();
    membership::add_server(&t.fs, t.journal().as_deref(), extra).unwrap();
    let gone = t.servers[0].local_addr();
    assert!(used_on(&t, 0) > 0);
    membership::drain(
        &t.fs,
        t.journal().as_deref(),
        &Default::default(),
        gone,
        0,
        &Stop::default(),
        &|_| {},
    )
    .unwrap();
    assert_eq!(
        used_on(&t, 0),
        0,
        "journal, checkpoint and copies all moved"
    );
    membership::remove(&t.fs, t.journal().as_deref(), gone).unwrap();
    t.create("b").unwrap();
    t.write_file("b", 0, &data[..MIB]).unwrap();
    t.fs.sync().unwrap().unwrap();
    // The removed server is gone for good; the daemon dies; a new one attaches the volume
    // from the other three (the added one among them) without naming the removed one.
    let mut removed = t.servers.remove(0);
    t.nodes.remove(0);
    removed.shutdown();
    t.crash_and_reattach();
    assert_eq!(t.read_file("a").unwrap(), data);
    assert_eq!(t.read_file("b").unwrap(), &data[..MIB]);
}

#[test]
fn a_rebalance_evens_the_servers_out_after_one_is_added() {
    let mut t = TestFs::replicated(2, 32 << 20, MIB as u64, WritePath::Frrwp, 2);
    let files = write_files(&t, 6, 20, 2 * MIB + 99);
    let addr = t.start_server();
    membership::add_server(&t.fs, None, addr).unwrap();
    assert_eq!(used_on(&t, 2), 0);
    let r = membership::rebalance(&t.fs, 0, &Stop::default(), &|_| {}).unwrap();
    assert!(r.chunks_moved > 0, "{r:?}");
    // Every server within 10% of the mean used fraction, as the servers count it.
    let used: Vec<u64> = (0..3).map(|i| used_on(&t, i)).collect();
    let mean = used.iter().sum::<u64>() as f64 / 3.0;
    for (i, u) in used.iter().enumerate() {
        assert!(
            (*u as f64 - mean).abs() <= 0.1 * mean,
            "server {i} uses {u} bytes, the mean is {mean:.0}: {used:?}"
        );
    }
    // Still two copies each, on two distinct servers, and the bytes unchanged.
    for (i, d) in files.iter().enumerate() {
        let p = placement(&t, &format!("f{i}"));
        assert!(p.iter().all(|c| c.len() == 2), "f{i}: {p:?}");
        assert_eq!(&t.read_file(&format!("f{i}")).unwrap(), d);
    }
    assert_eq!(t.fs.replica_health().degraded, 0);
    // Balanced already: a second rebalance moves nothing.
    let again = membership::rebalance(&t.fs, 0, &Stop::default(), &|_| {}).unwrap();
    assert_eq!(again.chunks_moved, 0, "{again:?}");
}
