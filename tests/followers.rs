//! Followers of a volume over in-process servers (`mount --volume NAME --read-only`): they
//! replay what the holder commits, are told what the kernel must forget, never write one-sided,
//! hold the holder's frees back until they have applied them, and reload the checkpoint when
//! they fall behind the ring.

mod common;

use common::rack::{read, resolve, Rack};
use common::{bytes, claim, control, eventually};
use rmemfs::fabric::{RemoteRegion, ServerId};
use rmemfs::fs::{Barrier, Invalidation};
use rmemfs::volume::JournalOptions;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

#[test]
fn a_follower_replays_what_the_holder_commits_and_tells_the_kernel() {
    let rack = Rack::new(2);
    let d = rack.attach("vol", true, false).unwrap();
    d.mkdir("a").unwrap();
    d.write("a/one", &bytes(1, 5000)).unwrap();
    d.write("a/big", &bytes(2, 3 * MIB + 17)).unwrap();
    d.sync().unwrap();
    let r = rack.follow("vol").unwrap();
    r.follower.pause(true);
    assert_eq!(r.fs.namespace_digest(), d.fs().namespace_digest());
    assert_eq!(read(&r.fs, "a/big").unwrap(), bytes(2, 3 * MIB + 17));
    let told: Arc<Mutex<Vec<Invalidation>>> = Arc::default();
    let t = told.clone();
    r.fs.on_followed(Box::new(move |i| t.lock().unwrap().extend_from_slice(i)));

    // A new file, an overwrite, an unlink: seen after one poll, as the holder has them.
    d.write("a/two", &bytes(3, 100)).unwrap();
    d.write("a/one", &bytes(4, 7000)).unwrap();
    d.unlink("a/big").unwrap();
    d.sync().unwrap();
    assert!(r.follower.poll_now().unwrap());
    assert_eq!(r.fs.namespace_digest(), d.fs().namespace_digest());
    assert_eq!(read(&r.fs, "a/two").unwrap(), bytes(3, 100));
    assert_eq!(read(&r.fs, "a/one").unwrap(), bytes(4, 7000));
    assert_eq!(resolve(&r.fs, "a/big"), Err(libc::ENOENT));
    let a = resolve(&r.fs, "a").unwrap();
    let one = resolve(&r.fs, "a/one").unwrap();
    let told = told.lock().unwrap().clone();
    for want in [
        Invalidation::Entry {
            dir: a,
            name: b"two".as_slice().into(),
        },
        Invalidation::Entry {
            dir: a,
            name: b"big".as_slice().into(),
        },
        Invalidation::Inode(one),
    ] {
        assert!(told.contains(&want), "{want:?} not among {told:?}");
    }
    // Nothing new: nothing applied.
    assert!(!r.follower.poll_now().unwrap());
    // Read-only.
    let root = rmemfs::meta::ROOT_INO;
    let e = r.fs.mkdir(root, b"x", 0o755, common::ME).unwrap_err();
    assert_eq!(e.errno, libc::EROFS);
}

#[test]
fn a_follower_cannot_write_the_volume_one_sided() {
    let rack = Rack::new(2);
    let d = rack.attach("vol", true, false).unwrap();
    d.write("f", &bytes(7, 64 << 10)).unwrap();
    d.sync().unwrap();
    let r = rack.follow("vol").unwrap();
    let ino = resolve(&r.fs, "f").unwrap();
    let (_, file) =
        r.fs.files_by_ino()
            .into_iter()
            .find(|(i, _)| *i == ino)
            .unwrap();
    let chunk = file.chunks.read().values().next().unwrap().clone();
    let replica = chunk.replicas()[0];
    let region = RemoteRegion {
        server: ServerId(replica.server),
        addr: replica.addr,
        len: chunk.len,
        rkey: replica.rkey,
    };
    // It may read the chunk, and may not write it.
    let got = r.fs.data().read_region(region, 0, 4096).unwrap();
    assert_eq!(got, bytes(7, 64 << 10)[..4096]);
    assert!(r
        .fs
        .data()
        .write_regions(&[region], 0, &[0xEE; 4096])
        .is_err());
    assert_eq!(d.read("f").unwrap(), bytes(7, 64 << 10));
}

#[test]
fn frees_wait_until_every_follower_applied_them() {
    let rack = Rack::new(2);
    let d = rack.attach("vol", true, false).unwrap();
    d.write("big", &bytes(5, 4 * MIB)).unwrap();
    d.sync().unwrap();
    let r = rack.follow("vol").unwrap();
    r.follower.pause(true);
    let before = rack.free();
    d.unlink("big").unwrap();
    d.sync().unwrap();
    // The follower has not applied the unlink: for a while (many of the holder's asks), the
    // file's memory stays as it was, and the follower still reads it whole.
    let window = Instant::now() + Duration::from_millis(300);
    while Instant::now() < window {
        assert!(d.0.journal.stats().frees_held > 0);
        assert_eq!(rack.free(), before);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(read(&r.fs, "big").unwrap(), bytes(5, 4 * MIB));
    // Applied: the frees go.
    r.follower.poll_now().unwrap();
    assert_eq!(resolve(&r.fs, "big"), Err(libc::ENOENT));
    eventually("the frees went", || {
        d.0.journal.stats().frees_held == 0 && rack.free() > before
    });

    // A follower that leaves holds nothing back.
    d.write("big2", &bytes(6, 2 * MIB)).unwrap();
    d.sync().unwrap();
    r.follower.poll_now().unwrap();
    let before = rack.free();
    d.unlink("big2").unwrap();
    d.sync().unwrap();
    assert!(d.0.journal.stats().frees_held > 0);
    drop(r);
    eventually("the frees went once the follower left", || {
        d.0.journal.stats().frees_held == 0 && rack.free() > before
    });
}

#[test]
fn a_follower_follows_a_new_ring_and_reloads_once_behind_it() {
    let rack = Rack::new(2);
    let ring = JournalOptions {
        ring_bytes: 64 << 10,
        ..JournalOptions::default()
    };
    let d = rack.attach_ring("vol", true, false, ring).unwrap();
    d.mkdir("d").unwrap();
    d.sync().unwrap();
    let r = rack.follow("vol").unwrap();
    r.follower.pause(true);

    // Caught up when the holder starts a new ring: read from the new ring's start.
    d.write("d/before", &bytes(1, 10)).unwrap();
    d.sync().unwrap();
    r.follower.poll_now().unwrap();
    d.0.journal.checkpoint().unwrap();
    d.write("d/after", &bytes(2, 10)).unwrap();
    d.sync().unwrap();
    r.follower.poll_now().unwrap();
    let figures = r.follower.figures();
    assert_eq!(figures.reloads.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(r.fs.namespace_digest(), d.fs().namespace_digest());

    // Behind: the ring went round (checkpoints) while it did not look.
    let checkpoints = d.0.journal.stats().checkpoints;
    for i in 0..400u64 {
        d.write(&format!("d/f{i}"), &bytes(i, 300)).unwrap();
    }
    d.sync().unwrap();
    assert!(d.0.journal.stats().checkpoints > checkpoints);
    r.follower.poll_now().unwrap();
    assert_eq!(figures.reloads.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(r.fs.namespace_digest(), d.fs().namespace_digest());
    assert_eq!(read(&r.fs, "d/f399").unwrap(), bytes(399, 300));

    // And on its own, unpaused, it keeps up.
    r.follower.pause(false);
    d.write("d/last", &bytes(9, 99)).unwrap();
    d.sync().unwrap();
    eventually("the follower saw d/last", || {
        read(&r.fs, "d/last").is_ok_and(|b| b == bytes(9, 99))
    });
}

#[test]
fn a_follower_session_may_report_and_read_and_nothing_else() {
    use rmemfs::proto::{ClaimMode, Message};
    let rack = Rack::new(1);
    let d = rack.attach("vol", true, false).unwrap();
    d.write("f", &bytes(1, 100)).unwrap();
    d.sync().unwrap();
    let addr = rack.addrs()[0];
    let connect = || control(addr);
    let pool = d.fs().data().pool().clone();
    assert_eq!(pool.follower_floor(), u64::MAX, "no follower yet");

    let c = connect();
    let claimed = claim(&c, "vol", "test follower", ClaimMode::Follow);
    assert!(
        matches!(claimed, Message::VolumeClaimed { created: false, ref root, .. } if !root.is_empty()),
        "{claimed:?}"
    );
    // Until it reports, it holds every free back.
    assert_eq!(pool.follower_floor(), 0);
    let at = c.request(|tag| Message::FollowAt { tag, lsn: 5 }).unwrap();
    assert!(
        matches!(at, Message::FollowRoot { ref root, .. } if !root.is_empty()),
        "{at:?}"
    );
    assert_eq!(pool.follower_floor(), 5);
    // It may not allocate: the session ends, and it holds nothing back any more.
    assert!(c.request(|tag| Message::Alloc { tag, len: 4096 }).is_err());
    eventually("the follower that allocated is gone", || {
        pool.follower_floor() == u64::MAX
    });

    // A session that follows nothing may not report; a follower may not ask for the floor.
    let c = connect();
    assert!(c.request(|tag| Message::FollowAt { tag, lsn: 1 }).is_err());
    let c = connect();
    claim(&c, "vol", "test follower", ClaimMode::Follow);
    assert!(c.request(|tag| Message::Followers { tag }).is_err());
    // Nor follow a volume that is not there.
    let c = connect();
    let refused = claim(&c, "nosuch", "test follower", ClaimMode::Follow);
    assert!(
        matches!(refused, Message::Refused { ref message, .. } if message.contains("it holds: vol")),
        "{refused:?}"
    );
}

/// A holder that dies with frees held for a lagging follower: the next holder's attach
/// frees what no record names, and must hold those frees back for the follower as the dead
/// holder did (the follower still maps the memory and reads through it).
#[test]
fn attach_holds_its_frees_for_a_follower_behind() {
    let rack = Rack::new(2);
    let d = rack.attach("vol", true, false).unwrap();
    d.write("big", &bytes(7, 4 * MIB)).unwrap();
    d.sync().unwrap();
    let r = rack.follow("vol").unwrap();
    r.follower.pause(true);
    d.unlink("big").unwrap();
    d.sync().unwrap();
    assert!(d.0.journal.stats().frees_held > 0);
    d.crash();

    // The next holder replays the unlink: "big"'s memory is named by nothing, yet the
    // follower has not applied the unlink and still reads the file.
    let d = rack.attach("vol", false, false).unwrap();
    assert!(d.0.report.collected > 0, "{:?}", d.0.report.collected);
    // New files take whatever memory is free: the follower's file must not be one of them.
    for i in 0..4u64 {
        d.write(&format!("new{i}"), &bytes(100 + i, 2 * MIB))
            .unwrap();
    }
    d.sync().unwrap();
    assert_eq!(read(&r.fs, "big").unwrap(), bytes(7, 4 * MIB));
    assert!(d.0.journal.stats().frees_held > 0);
    // Applied: the follower reloads the new holder's journal and the frees go.
    r.follower.poll_now().unwrap();
    assert_eq!(resolve(&r.fs, "big"), Err(libc::ENOENT));
    assert_eq!(read(&r.fs, "new3").unwrap(), bytes(103, 2 * MIB));
    // It reports how far it applied at its next poll.
    r.follower.pause(false);
    eventually("the attach's frees went", || {
        d.0.journal.stats().frees_held == 0
    });
}

/// A follower that applied a record the next holder never read (the holder died between
/// the ring copies' writes, and the copy holding the record went with its server): the next
/// holder numbers its own records from where its replay ended, so the follower's sequence
/// numbers now name other changes. It must load the new holder's checkpoint, not skip them.
#[test]
fn a_follower_ahead_of_the_next_holder_reloads() {
    let mut rack = Rack::new(2);
    let d = rack.attach("vol", true, false).unwrap();
    d.mkdir("d").unwrap();
    d.sync().unwrap();
    let r = rack.follow("vol").unwrap();
    r.follower.pause(true);
    r.follower.poll_now().unwrap();
    // One group, written whole to the first copy and not at all to the second.
    d.0.journal.hold_commits(true);
    d.write("d/x", &bytes(1, 10)).unwrap();
    d.0.journal.tear_next_group(0);
    d.0.journal.hold_commits(false);
    let _ = d.sync();
    r.follower.poll_now().unwrap();
    assert_eq!(
        read(&r.fs, "d/x").unwrap(),
        bytes(1, 10),
        "the follower read the whole copy"
    );
    d.crash();
    rack.restart(0);

    let d = rack.attach("vol", false, false).unwrap();
    assert_eq!(d.resolve("d/x"), Err(libc::ENOENT));
    d.write("d/y", &bytes(2, 10)).unwrap();
    d.sync().unwrap();
    r.follower.poll_now().unwrap();
    assert_eq!(resolve(&r.fs, "d/x"), Err(libc::ENOENT));
    assert_eq!(read(&r.fs, "d/y").unwrap(), bytes(2, 10));
    assert_eq!(r.fs.namespace_digest(), d.fs().namespace_digest());
}
