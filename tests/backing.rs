//! Backed memory servers (`serve --backing`) over in-process servers: a restarted server comes
//! back with every extent it lent, its sessions resume and nothing is rebuilt but the chunks
//! written while it was away; a volume whose servers and daemon all stopped attaches again
//! from the files.

mod common;

use common::{bytes, TestFs};
use rmemfs::client::Rejoin;
use rmemfs::fabric::ServerId;
use rmemfs::upkeep::rebuild::{pass, Stop};

const MIB: usize = 1 << 20;

fn six_files(t: &TestFs) {
    for i in 0..6 {
        let p = format!("f{i}");
        t.create(&p).unwrap();
        t.write_file(&p, 0, &bytes(i, MIB)).unwrap();
    }
}

/// Chunks of the mount that list a copy on `server`, and their bytes.
fn listed_on(t: &TestFs, server: u32) -> (u64, u64) {
    t.fs.files().iter().fold((0, 0), |(n, b), f| {
        let chunks = f.chunks.read();
        let on: Vec<u64> = chunks
            .values()
            .filter(|c| c.on(server).is_some())
            .map(|c| c.len)
            .collect();
        (n + on.len() as u64, b + on.iter().sum::<u64>())
    })
}

/// Server `server` holds the bytes of the copies the mount lists there and of its stock, no
/// more.
fn assert_holds_what_is_listed(t: &TestFs, server: usize, why: &str) {
    let used = {
        let c = t.servers[server].capacity();
        c.total - c.free
    };
    let pool = t.fs.data().pool();
    let listed = listed_on(t, server as u32).1 + pool.stocked_bytes(ServerId(server as u32));
    assert_eq!(used, listed, "{why}");
}

#[test]
fn a_restarted_backed_server_resumes_and_only_chunks_written_meanwhile_are_copied() {
    let mut t = TestFs::backed(3, 16 << 20, MIB as u64, 2);
    six_files(&t);
    let pool = t.fs.data().pool().clone();
    let (chunks_before, held) = listed_on(&t, 1);
    assert!(chunks_before >= 2, "server 1 holds too little to tell");

    // It stops (SIGTERM, as `systemctl restart` sends), and while it is away one file is
    // written: that chunk's copy there missed the write.
    t.kill_server(1);
    assert!(!pool.is_live(ServerId(1)));
    t.write_file("f0", 100, b"while away").unwrap();
    t.restart_server(1);

    let rejoin = pool.try_reconnect(ServerId(1));
    assert!(
        matches!(rejoin, Some(Rejoin::Resumed { bytes, .. }) if bytes >= held - MIB as u64),
        "{rejoin:?} (held {held})"
    );
    assert!(pool.is_live(ServerId(1)));
    let (chunks_after, _) = listed_on(&t, 1);
    let missed = chunks_before - chunks_after;
    assert!(missed <= 1, "only f0's chunk was written meanwhile");
    let out = pass(&t.fs, 0, &Stop::default(), &Default::default());
    assert!(
        out.chunks_rebuilt <= missed,
        "copied {} chunks, {missed} were written while the server was away: {out:?}",
        out.chunks_rebuilt
    );
    let h = t.fs.replica_health();
    assert_eq!((h.healthy, h.degraded, h.lost), (6, 0, 0), "{h:?}");
    assert_holds_what_is_listed(
        &t,
        1,
        "the server holds what the mount lists there, no more",
    );

    // What it holds is the data: lose another server and read everything.
    t.kill_server(0);
    for i in 0..6 {
        let mut want = bytes(i, MIB);
        if i == 0 {
            want[100..110].copy_from_slice(b"while away");
        }
        assert!(t.read_file(&format!("f{i}")).unwrap() == want, "f{i}");
    }
}

#[test]
fn a_volume_attaches_again_after_every_server_and_its_daemon_stopped() {
    let mut t = TestFs::backed_volume(2, 32 << 20, MIB as u64, "kept");
    let files: Vec<Vec<u8>> = (0..5).map(|i| bytes(10 + i, 2 * MIB + 333)).collect();
    for (i, d) in files.iter().enumerate() {
        t.create(&format!("f{i}")).unwrap();
        t.write_file(&format!("f{i}"), 0, d).unwrap();
    }
    t.fs.sync().expect("a volume mount syncs").unwrap();

    // The daemon dies, then both servers stop and start again from their files.
    t.fs.data().pool().crash();
    t.kill_server(0);
    t.kill_server(1);
    t.restart_server(0);
    t.restart_server(1);
    t.crash_and_reattach();

    for (i, d) in files.iter().enumerate() {
        assert!(t.read_file(&format!("f{i}")).unwrap() == *d, "f{i}");
    }
    let h = t.fs.replica_health();
    assert_eq!(h.degraded + h.lost, 0, "{h:?}");
    let out = pass(&t.fs, 0, &Stop::default(), &Default::default());
    assert_eq!(out.chunks_rebuilt, 0, "{out:?}");
}

#[test]
fn a_server_without_backing_still_comes_back_empty() {
    // The contrast: the same restart of an unbacked server loses what it held.
    let mut t = TestFs::replicated(3, 16 << 20, MIB as u64, rmemfs::data::WritePath::Frrwp, 2);
    six_files(&t);
    let pool = t.fs.data().pool().clone();
    t.kill_server(1);
    assert!(!pool.is_live(ServerId(1)));
    t.restart_server(1);
    assert_eq!(pool.try_reconnect(ServerId(1)), Some(Rejoin::Empty));
}

/// Every copy's key on `server`, by address.
fn keys_on(t: &TestFs, server: u32) -> std::collections::HashMap<u64, u64> {
    t.fs.files()
        .iter()
        .flat_map(|f| {
            f.chunks
                .read()
                .values()
                .filter_map(|c| c.on(server))
                .map(|r| (r.addr, r.rkey))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn on_a_device_that_issues_keys_a_restarted_server_resumes_under_new_keys() {
    // As verbs: the restart registers every extent again and the device picks new keys.
    let mut t = TestFs::backed_device_keys(3, 16 << 20, MIB as u64, 2);
    six_files(&t);
    let pool = t.fs.data().pool().clone();
    let before = keys_on(&t, 1);
    assert!(before.len() >= 2);
    t.kill_server(1);
    assert!(!pool.is_live(ServerId(1)));
    t.restart_server(1);
    let Some(Rejoin::Rekeyed { keys }) = pool.try_reconnect(ServerId(1)) else {
        panic!("a server back under new keys must say so");
    };
    // Out of service until its copies took the new keys.
    assert!(!pool.is_live(ServerId(1)));
    for addr in before.keys() {
        assert!(
            keys.contains_key(addr),
            "the server lists every extent it kept"
        );
    }
    let changed = rmemfs::upkeep::rebuild::rekey_server(&t.fs, ServerId(1), &keys);
    assert_eq!(
        changed as usize,
        before.len(),
        "every copy there took a new key"
    );
    pool.admit(ServerId(1));
    assert!(pool.is_live(ServerId(1)));
    let after = keys_on(&t, 1);
    assert_eq!(after.len(), before.len());
    for (addr, rkey) in &after {
        assert_ne!(
            before[addr], *rkey,
            "a key the device no longer knows is still used"
        );
        assert_eq!(keys[addr], *rkey);
    }
    let out = pass(&t.fs, 0, &Stop::default(), &Default::default());
    assert_eq!(out.chunks_rebuilt, 0, "{out:?}");
    // Its copies are read under their new keys: lose another server and read.
    t.kill_server(0);
    for i in 0..6 {
        assert!(
            t.read_file(&format!("f{i}")).unwrap() == bytes(i, MIB),
            "f{i}"
        );
    }
}

#[test]
fn on_a_device_that_issues_keys_a_volume_resumes_and_attaches_again() {
    let mut t = TestFs::backed_volume(3, 32 << 20, MIB as u64, "rekeyed");
    t.device_keys = true;
    let files: Vec<Vec<u8>> = (0..4).map(|i| bytes(20 + i, 2 * MIB + 99)).collect();
    for (i, d) in files.iter().enumerate() {
        t.create(&format!("f{i}")).unwrap();
        t.write_file(&format!("f{i}"), 0, d).unwrap();
    }
    t.fs.sync().unwrap().unwrap();
    let pool = t.fs.data().pool().clone();

    // One server restarts under the live daemon: its chunk copies and the journal's places
    // there take the new keys, and the journal goes on committing to it.
    t.kill_server(1);
    assert!(!pool.is_live(ServerId(1)));
    t.restart_server(1);
    let Some(Rejoin::Rekeyed { keys }) = pool.try_reconnect(ServerId(1)) else {
        panic!("a server back under new keys must say so");
    };
    rmemfs::upkeep::rebuild::rekey_server(&t.fs, ServerId(1), &keys);
    pool.admit(ServerId(1));
    t.create("after").unwrap();
    t.write_file("after", 0, b"written after the rekey")
        .unwrap();
    t.fs.sync().unwrap().unwrap();

    // Then the daemon dies and every server restarts: the attach finds the checkpoint and
    // ring under keys no record names.
    pool.crash();
    for i in 0..3 {
        t.kill_server(i);
    }
    for i in 0..3 {
        t.restart_server(i);
    }
    t.crash_and_reattach();
    for (i, d) in files.iter().enumerate() {
        assert!(t.read_file(&format!("f{i}")).unwrap() == *d, "f{i}");
    }
    assert_eq!(t.read_file("after").unwrap(), b"written after the rekey");
    let out = pass(&t.fs, 0, &Stop::default(), &Default::default());
    assert_eq!(out.chunks_rebuilt, 0, "{out:?}");
}

/// Six files written, then overwritten after server 1's last write-back, and server 1's host
/// loses power: its file goes back to that write-back and it starts in another boot.
fn power_loss_of_server_1(t: &mut TestFs) {
    six_files(t);
    let file = t.backing[1].clone().expect("backed");
    // What the medium holds at the last write-back: the file as it is now (reads go through
    // the page cache, which holds every store so far).
    let written_back = file.with_extension("written-back");
    std::fs::copy(&file, &written_back).unwrap();
    for i in 0..6 {
        t.write_file(&format!("f{i}"), 0, &bytes(100 + i, MIB))
            .unwrap();
    }
    // The power goes: the stores since the write-back are lost with the page cache, and the
    // host boots again.
    t.kill_server(1);
    assert!(!t.fs.data().pool().is_live(ServerId(1)));
    std::fs::rename(&written_back, &file).unwrap();
    t.server_config.boot_id = Some("the boot after the power loss".into());
    t.restart_server(1);
}

/// A power loss: the server's file holds what was written back, older than what its clients
/// were told was written. Its session resumes, but its copies are taken for stale where a
/// chunk has others: losing another server afterwards returns the new bytes, never the old.
#[test]
fn a_server_back_from_a_power_loss_gives_no_old_bytes() {
    let mut t = TestFs::backed(3, 16 << 20, MIB as u64, 2);
    let pool = t.fs.data().pool().clone();
    power_loss_of_server_1(&mut t);

    let Some(Rejoin::Behind { keys: None }) = pool.try_reconnect(ServerId(1)) else {
        panic!("a server back from a power loss must say it may be behind");
    };
    assert!(
        !pool.is_live(ServerId(1)),
        "in service before its copies were sorted"
    );
    let listed = listed_on(&t, 1).0;
    let (gone, kept) = rmemfs::upkeep::rebuild::let_go_of_behind_server(&t.fs, ServerId(1), None);
    assert_eq!(
        (gone, kept),
        (listed, 0),
        "every chunk there had another copy"
    );
    assert!(pool.is_live(ServerId(1)));
    for i in 0..6 {
        assert!(
            t.read_file(&format!("f{i}")).unwrap() == bytes(100 + i, MIB),
            "f{i}"
        );
    }
    let out = pass(&t.fs, 0, &Stop::default(), &Default::default());
    assert_eq!(out.chunks_rebuilt, listed, "{out:?}");
    let h = t.fs.replica_health();
    assert_eq!((h.healthy, h.degraded, h.lost), (6, 0, 0), "{h:?}");
    // The stale copies' memory went back: the server holds what the mount lists there.
    assert_holds_what_is_listed(&t, 1, "the copies let go of stayed allocated");
    // Redundant again, from copies known whole: lose another server.
    t.kill_server(0);
    for i in 0..6 {
        assert!(
            t.read_file(&format!("f{i}")).unwrap() == bytes(100 + i, MIB),
            "f{i} read old bytes after a power loss and a second fault"
        );
    }
}

/// A server stopped in order writes everything back first: after a host restart its session
/// resumes whole, and nothing is copied.
#[test]
fn a_server_stopped_in_order_is_whole_after_a_host_restart() {
    let mut t = TestFs::backed(3, 16 << 20, MIB as u64, 2);
    six_files(&t);
    let pool = t.fs.data().pool().clone();
    t.kill_server(1);
    assert!(!pool.is_live(ServerId(1)));
    t.server_config.boot_id = Some("the next boot".into());
    t.restart_server(1);
    let rejoin = pool.try_reconnect(ServerId(1));
    assert!(matches!(rejoin, Some(Rejoin::Resumed { .. })), "{rejoin:?}");
    let out = pass(&t.fs, 0, &Stop::default(), &Default::default());
    assert_eq!(out.chunks_rebuilt, 0, "{out:?}");
}

/// A server back from a power loss and restarted again in the same boot before its client
/// came back: the second start finds a file that says nothing of a power loss, yet the
/// client's copies there are still old. Each owner keeps the mark in the file until its
/// resume has told it.
#[test]
fn a_server_behind_stays_behind_across_restarts_until_its_client_resumes() {
    let mut t = TestFs::backed(3, 16 << 20, MIB as u64, 2);
    let pool = t.fs.data().pool().clone();
    power_loss_of_server_1(&mut t);
    // Stopped and started again in this boot, before the client asked.
    t.kill_server(1);
    t.restart_server(1);
    let Some(Rejoin::Behind { keys: None }) = pool.try_reconnect(ServerId(1)) else {
        panic!("the second start forgot that the file was behind");
    };
    rmemfs::upkeep::rebuild::let_go_of_behind_server(&t.fs, ServerId(1), None);
    assert!(pool.is_live(ServerId(1)));
    pass(&t.fs, 0, &Stop::default(), &Default::default());
    // Told: the next restart in this boot is a plain one.
    t.kill_server(1);
    common::eventually("the mount saw server 1 go", || !pool.is_live(ServerId(1)));
    t.restart_server(1);
    let rejoin = pool.try_reconnect(ServerId(1));
    assert!(matches!(rejoin, Some(Rejoin::Resumed { .. })), "{rejoin:?}");
    for i in 0..6 {
        assert!(
            t.read_file(&format!("f{i}")).unwrap() == bytes(100 + i, MIB),
            "f{i}"
        );
    }
}
