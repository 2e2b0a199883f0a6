//! Promises kept under faults, over in-process servers: writes are never acknowledged on
//! fewer copies than `--min-replicas`, a second fault while degraded loses exactly what the
//! placement says it must (nothing with three copies), and a server that comes back empty
//! never serves its zeros for a chunk it alone held.

mod common;

use common::{bytes, TestFs};
use rmemfs::client::{Rejoin, ServerState};
use rmemfs::data::WritePath;
use rmemfs::fabric::ServerId;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

/// The servers (by index) that hold a copy of each chunk of `path`.
fn placement(t: &TestFs, path: &str) -> Vec<BTreeSet<usize>> {
    let index_of = |addr: &str| {
        t.servers
            .iter()
            .position(|s| s.local_addr().to_string() == addr)
            .unwrap_or_else(|| panic!("{addr} is none of the servers"))
    };
    t.placement_addrs(path)
        .iter()
        .map(|c| c.iter().map(|a| index_of(a)).collect())
        .collect()
}

/// Waits until the pool has seen server `i` down (it notices on its own threads: the control
/// connection closes).
fn wait_down(pool: &rmemfs::client::Pool, i: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while pool.status()[i].state != ServerState::Down {
        assert!(Instant::now() < deadline, "server {i} never seen down");
        pool.refresh();
        std::thread::yield_now();
    }
}

/// Brings server `i` back empty and has the pool take it in again, as the reconnect thread
/// does: the copies it listed are forgotten first.
fn rejoin_empty(t: &mut TestFs, i: usize) {
    let pool = t.fs.data().pool().clone();
    wait_down(&pool, i);
    t.restart_server(i);
    assert_eq!(pool.try_reconnect(ServerId(i as u32)), Some(Rejoin::Empty));
    rmemfs::upkeep::rebuild::forget_server(&t.fs, ServerId(i as u32));
    pool.admit(ServerId(i as u32));
}

#[test]
fn a_write_below_min_replicas_is_refused_on_every_write_path() {
    for path in [WritePath::Frrwp, WritePath::Serial] {
        let mut t = TestFs::min_replicas(2, 16 << 20, path, 2, 2);
        t.create("old").unwrap();
        t.write_file("old", 0, &bytes(1, MIB)).unwrap();
        t.kill_server(1);
        // A new file's chunks can get one copy only: refused, not acknowledged on one.
        t.create("new").unwrap();
        assert_eq!(
            t.write_file("new", 0, &bytes(2, 4 * MIB)),
            Err(libc::EIO),
            "{path:?}: a new chunk written with one live server of two"
        );
        assert_eq!(
            t.write_file_in_place("new", 0, &bytes(3, 4 * MIB)),
            Err(libc::EIO),
            "{path:?}: the in-place (FUSE) payload"
        );
        // A small file, whose extents may come from the stock.
        t.create("small").unwrap();
        assert_eq!(
            t.write_file("small", 0, b"tiny"),
            Err(libc::EIO),
            "{path:?}"
        );
        // An existing chunk that lost a copy is refused too (heal finds no room elsewhere).
        assert_eq!(t.write_file("old", 10, b"x"), Err(libc::EIO), "{path:?}");
        // What was acknowledged before reads back from the copy that is left.
        assert_eq!(t.read_file("old").unwrap(), bytes(1, MIB), "{path:?}");
    }
}

#[test]
fn with_a_spare_server_min_replicas_two_still_writes_two_copies() {
    let mut t = TestFs::min_replicas(3, 16 << 20, WritePath::Frrwp, 2, 2);
    t.kill_server(1);
    for i in 0..4 {
        let p = format!("f{i}");
        t.create(&p).unwrap();
        t.write_file(&p, 0, &bytes(i, 2 * MIB)).unwrap();
        for copies in placement(&t, &p) {
            assert_eq!(copies.len(), 2, "{p}: {copies:?}");
            assert!(!copies.contains(&1), "{p}: a copy on the dead server");
        }
    }
}

#[test]
fn a_chunk_whose_only_copy_came_back_empty_reads_eio_not_zeros() {
    // One copy: the server restarts empty.
    let mut t = TestFs::replicated(1, 8 << 20, 1 << 20, WritePath::Frrwp, 1);
    t.create("f").unwrap();
    t.write_file("f", 0, &bytes(7, 2 * MIB)).unwrap();
    t.kill_server(0);
    rejoin_empty(&mut t, 0);
    assert_eq!(t.read_file("f"), Err(libc::EIO));
    assert_eq!(t.write_file("f", 0, b"over"), Err(libc::EIO));
    let h = t.fs.replica_health();
    assert_eq!(h.lost, 2, "{h:?}");
    // The lost file can go, and the server serves new files.
    t.fs.unlink(rmemfs::meta::ROOT_INO, b"f").unwrap();
    t.create("g").unwrap();
    t.write_file("g", 0, &bytes(8, MIB)).unwrap();
    assert_eq!(t.read_file("g").unwrap(), bytes(8, MIB));

    // Two copies, both servers restarted empty.
    let mut t = TestFs::replicated(2, 8 << 20, 1 << 20, WritePath::Frrwp, 2);
    t.create("f").unwrap();
    t.write_file("f", 0, &bytes(9, 3 * MIB)).unwrap();
    t.kill_server(0);
    t.kill_server(1);
    rejoin_empty(&mut t, 0);
    rejoin_empty(&mut t, 1);
    assert_eq!(t.read_file("f"), Err(libc::EIO));
    assert_eq!(t.fs.replica_health().lost, 3);
}

#[test]
fn a_second_kill_while_degraded_loses_exactly_the_chunks_it_alone_held() {
    // Two copies on four servers, --min-replicas 1: after the first kill, writes land on
    // the three live servers; the second kill loses the chunks whose every copy was on the
    // two killed servers, no more and no fewer, as a placement read before each kill says.
    let mut t = TestFs::min_replicas(4, 64 << 20, WritePath::Frrwp, 2, 1);
    let mut want = Vec::new();
    for i in 0..12 {
        let p = format!("a{i}");
        t.create(&p).unwrap();
        t.write_file(&p, 0, &bytes(i, 2 * MIB)).unwrap();
        want.push((p, bytes(i, 2 * MIB)));
    }
    t.kill_server(0);
    // Writes while degraded: new files, and overwrites of old ones (which heal them).
    for i in 0..12 {
        let p = format!("b{i}");
        t.create(&p).unwrap();
        t.write_file(&p, 0, &bytes(100 + i, 2 * MIB)).unwrap();
        want.push((p, bytes(100 + i, 2 * MIB)));
    }
    for (p, w) in want.iter_mut().take(4) {
        t.write_file(p, MIB as u64, b"patched").unwrap();
        w[MIB..MIB + 7].copy_from_slice(b"patched");
    }
    // The second victim: the live server that alone holds the most chunks beside server 0
    // (placement, not the test, decides which chunks those are).
    let layouts: Vec<Vec<BTreeSet<usize>>> = want.iter().map(|(p, _)| placement(&t, p)).collect();
    let at_risk = |victim: usize| {
        let killed: BTreeSet<usize> = [0, victim].into();
        let lost: Vec<Vec<bool>> = layouts
            .iter()
            .map(|chunks| chunks.iter().map(|c| c.is_subset(&killed)).collect())
            .collect();
        lost
    };
    let count = |lost: &Vec<Vec<bool>>| lost.iter().flatten().filter(|&&l| l).count();
    let victim = (1..4).max_by_key(|&v| count(&at_risk(v))).unwrap();
    let predicted = at_risk(victim);
    assert!(
        count(&predicted) > 0 && predicted.iter().flatten().any(|&l| !l),
        "a layout that tells nothing: {layouts:?}"
    );
    t.kill_server(victim);
    let mut lost_chunks = 0;
    for ((p, w), lost) in want.iter().zip(&predicted) {
        let ino = t.resolve(p).unwrap();
        let fh = t.fs.open(ino, libc::O_RDONLY).unwrap();
        for (idx, &gone) in lost.iter().enumerate() {
            let got = t.fs.read(ino, fh, (idx * MIB) as u64, MIB as u32);
            if gone {
                lost_chunks += 1;
                assert_eq!(
                    got.map_err(|e| e.errno).err(),
                    Some(libc::EIO),
                    "{p}[{idx}]"
                );
            } else {
                let got = got.unwrap_or_else(|e| panic!("{p}[{idx}]: {e}"));
                assert!(got == w[idx * MIB..(idx + 1) * MIB], "{p}[{idx}] differs");
            }
        }
        t.fs.release(fh);
    }
    assert_eq!(t.fs.replica_health().lost, lost_chunks);
}

#[test]
fn three_copies_survive_a_kill_during_the_rebuild_of_another() {
    use rmemfs::upkeep::figures::RebuildStats;
    use rmemfs::upkeep::rebuild::{pass, Stop};
    let mut t = TestFs::min_replicas(4, 64 << 20, WritePath::Frrwp, 3, 2);
    let mut want = Vec::new();
    for i in 0..10 {
        let p = format!("f{i}");
        t.create(&p).unwrap();
        t.write_file(&p, 0, &bytes(i, 2 * MIB)).unwrap();
        want.push((p, bytes(i, 2 * MIB)));
    }
    t.kill_server(1);
    let stop = Stop::default();
    let shown = rmemfs::upkeep::figures::RebuildStats::default();
    let running = |s: &RebuildStats| s.running.load(Ordering::Relaxed);
    let rebuilt = |s: &RebuildStats| s.chunks_rebuilt.load(Ordering::Relaxed);
    let before = rebuilt(&shown);
    let TestFs {
        fs, servers, nodes, ..
    } = &mut t;
    let fs = &*fs;
    std::thread::scope(|s| {
        // Paced at 4 MiB/s, the pass takes seconds: the second kill lands inside it.
        let rebuild = s.spawn(|| pass(fs, 4 << 20, &stop, &shown));
        let deadline = Instant::now() + Duration::from_secs(30);
        while rebuilt(&shown) < before + 2 {
            assert!(Instant::now() < deadline, "the rebuild made no progress");
            std::thread::yield_now();
        }
        assert!(running(&shown), "the pass ended before the second kill");
        // As TestFs::kill_server: the fabric node and the server process die.
        nodes[3].kill();
        servers[3].shutdown();
        rebuild.join().unwrap();
    });
    assert!(!running(&shown));
    assert!(rebuilt(&shown) > before + 2);
    for (p, w) in &want {
        assert!(t.read_file(p).unwrap() == *w, "{p}");
    }
    let h = t.fs.replica_health();
    assert_eq!(h.lost, 0, "{h:?}");
    // Writes go on: two live servers meet --min-replicas 2.
    t.write_file("f0", 5, b"still").unwrap();
}

#[test]
fn a_write_with_every_server_down_is_eio_not_enospc() {
    // Nothing can be placed because no server is up: that is no lack of room, and a program
    // told ENOSPC would think the pool full (seen in tools/chaos.sh with two of three servers
    // killed: new files failed with ENOSPC).
    for path in [WritePath::Frrwp, WritePath::Serial] {
        let mut t = TestFs::min_replicas(2, 16 << 20, path, 2, 1);
        t.kill_server(0);
        t.kill_server(1);
        let pool = t.fs.data().pool().clone();
        wait_down(&pool, 0);
        wait_down(&pool, 1);
        t.create("new").unwrap();
        assert_eq!(
            t.write_file("new", 0, &bytes(4, 2 * MIB)),
            Err(libc::EIO),
            "{path:?}"
        );
        t.create("small").unwrap();
        assert_eq!(
            t.write_file("small", 0, b"tiny"),
            Err(libc::EIO),
            "{path:?}"
        );
    }
}

/// The copy count changed live (`rmemfs admin set-replicas`): refused below `--min-replicas`
/// or above the live servers; raised, a rebuild pass gives every chunk the new count; lowered,
/// the pass drops the extra copies and their memory goes back; the bytes stay the same.
#[test]
fn the_copy_count_changes_live() {
    use rmemfs::upkeep::rebuild::{pass, Stop};
    let mut t = TestFs::replicated(3, 32 << 20, MIB as u64, WritePath::Frrwp, 2);
    let data = bytes(7, 5 * MIB);
    t.create("f").unwrap();
    t.write_file("f", 0, &data).unwrap();
    assert!(t.fs.data().set_replicas(0).is_err());
    assert!(t.fs.data().set_replicas(4).is_err(), "above the maximum");
    t.kill_server(2);
    wait_down(t.fs.data().pool(), 2);
    let e = t.fs.data().set_replicas(3).unwrap_err();
    assert!(e.message.contains("need 3 live servers"), "{}", e.message);
    drop(t);

    let t = TestFs::replicated(3, 32 << 20, MIB as u64, WritePath::Frrwp, 2);
    t.create("f").unwrap();
    t.write_file("f", 0, &data).unwrap();
    let store = t.fs.data();
    let at_two = t.remote_used();
    store.set_replicas(3).unwrap();
    assert_eq!(
        t.fs.replica_health().degraded,
        5,
        "every chunk short of a copy"
    );
    pass(&t.fs, 0, &Stop::default(), &Default::default());
    assert!(
        placement(&t, "f").iter().all(|c| c.len() == 3),
        "{:?}",
        placement(&t, "f")
    );
    let h = t.fs.replica_health();
    assert_eq!((h.healthy, h.degraded, h.surplus), (5, 0, 0), "{h:?}");
    store.set_replicas(1).unwrap();
    assert_eq!(t.fs.replica_health().surplus, 5);
    pass(&t.fs, 0, &Stop::default(), &Default::default());
    assert!(
        placement(&t, "f").iter().all(|c| c.len() == 1),
        "{:?}",
        placement(&t, "f")
    );
    assert_eq!(t.fs.replica_health().surplus, 0);
    assert_eq!(t.read_file("f").unwrap(), data);
    // The dropped copies' memory is back (frees reach the servers asynchronously).
    let deadline = Instant::now() + Duration::from_secs(10);
    while t.remote_used() > at_two - 5 * MIB as u64 && Instant::now() < deadline {
        std::thread::yield_now();
    }
    assert_eq!(
        t.remote_used(),
        at_two / 2,
        "one copy of five chunks, from two"
    );
}
