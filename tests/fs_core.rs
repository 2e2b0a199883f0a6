//! Behaviours of the file system core beyond the model test: open-file lifetimes, rename flags,
//! extended attributes, readdir offsets, placement over servers, failures (ENOSPC, a dead
//! server giving EIO), and memory given back.

mod common;

use common::{bytes, TestFs, ME};
use rmemfs::fs::{SetAttr, RENAME_EXCHANGE, RENAME_NOREPLACE};
use rmemfs::meta::{Kind, ROOT_INO};
use std::sync::atomic::Ordering;

fn used(t: &TestFs) -> u64 {
    t.remote_used()
}

#[test]
fn unlinked_open_file_keeps_its_data_until_last_close() {
    let t = TestFs::new(1, 16 << 20, 1 << 20);
    t.create("f").unwrap();
    let data = bytes(1, 3 << 20);
    t.write_file("f", 0, &data).unwrap();
    let ino = t.resolve("f").unwrap();
    let fh = t.fs.open(ino, libc::O_RDONLY).unwrap();
    t.fs.unlink(ROOT_INO, b"f").unwrap();
    assert_eq!(t.resolve("f"), Err(libc::ENOENT));
    assert_eq!(t.fs.read(ino, fh, 0, 1 << 20).unwrap(), &data[..1 << 20]);
    assert!(used(&t) >= 3 << 20);
    t.fs.release(fh);
    assert_eq!(used(&t), 0, "last close frees the remote chunks");
}

#[test]
fn an_unlinked_closed_inode_cannot_be_opened_again() {
    let t = TestFs::new(1, 8 << 20, 1 << 20);
    t.create("f").unwrap();
    t.write_file("f", 0, b"data").unwrap();
    // The kernel may still hold the inode from a lookup that raced with the unlink.
    let ino = t.resolve("f").unwrap();
    t.fs.unlink(ROOT_INO, b"f").unwrap();
    assert_eq!(
        t.fs.open(ino, libc::O_RDONLY).unwrap_err().errno,
        libc::ENOENT
    );
}

#[test]
fn truncate_and_unlink_free_remote_memory() {
    let t = TestFs::new(2, 16 << 20, 1 << 20);
    t.create("f").unwrap();
    t.write_file("f", 0, &bytes(2, 5 << 20)).unwrap();
    assert_eq!(used(&t), 5 << 20);
    let ino = t.resolve("f").unwrap();
    let set = SetAttr {
        size: Some((1 << 20) + 10),
        ..Default::default()
    };
    t.fs.setattr(ino, &set, ME).unwrap();
    assert_eq!(used(&t), 2 << 20, "chunks past the new end are freed");
    let back = t.read_file("f").unwrap();
    assert_eq!(back, bytes(2, 5 << 20)[..(1 << 20) + 10]);
    t.fs.unlink(ROOT_INO, b"f").unwrap();
    assert_eq!(used(&t), 0);
}

#[test]
fn chunks_spread_over_servers_and_a_file_outgrows_one_server() {
    let t = TestFs::new(2, 8 << 20, 1 << 20);
    t.create("big").unwrap();
    let data = bytes(3, 12 << 20); // more than either server holds
    t.write_file("big", 0, &data).unwrap();
    let status = t.fs.data().pool().refresh();
    assert!(
        status.iter().all(|s| s.capacity.free < 4 << 20),
        "{status:?}"
    );
    assert_eq!(t.read_file("big").unwrap(), data);
}

#[test]
fn small_files_cost_pages_not_chunks() {
    let t = TestFs::new(1, 64 << 20, 1 << 20);
    for i in 0..20 {
        let p = format!("s{i}");
        t.create(&p).unwrap();
        t.write_file(&p, 0, b"tiny").unwrap();
    }
    assert_eq!(used(&t), 20 * 4096);
    // Appends grow the first chunk; contents survive the moves.
    let mut want = Vec::new();
    for i in 0..40u64 {
        let piece = bytes(i, 3000);
        t.write_file("s0", want.len() as u64 + 4, &piece).unwrap();
        want.extend_from_slice(&piece);
    }
    assert_eq!(&t.read_file("s0").unwrap()[4..], &want[..]);
}

/// A write that grows a file's short first chunk writes the old bytes it does not cover and
/// itself to the new extents once, in one round (not a move of the whole old chunk and then
/// the write): both write paths, two copies, a payload copied or sent where it lies, a write
/// starting inside the old chunk and one past it (a hole, zeros). A copy that fails in that
/// round sends the write back to the move, and its bytes are right.
#[test]
fn a_write_that_grows_the_first_chunk_writes_old_and_new_bytes_once() {
    use rmemfs::data::WritePath;
    let (first, second) = (bytes(1, 6144), bytes(2, 5015));
    let want = |at: u64| {
        let mut want = first.clone();
        want.resize(at as usize, 0);
        want.extend_from_slice(&second);
        want
    };
    for path in [WritePath::Serial, WritePath::Frrwp] {
        let t = TestFs::replicated(2, 16 << 20, 1 << 20, path, 2);
        let fabric = t.fs.data().pool().fabric().clone();
        // (name, in place, where the second write starts)
        for (name, in_place, at) in [
            ("f", false, 6144),
            ("g", true, 6144),
            ("h", false, 4096),
            ("i", true, 9000),
        ] {
            t.create(name).unwrap();
            t.write_file(name, 0, &first).unwrap();
            let before = fabric.counters();
            match in_place {
                true => t.write_file_in_place(name, at, &second).unwrap(),
                false => t.write_file(name, at, &second).unwrap(),
            }
            let after = fabric.counters();
            // Each copy: the old chunk's bytes before the write (it is 8 KiB: 6,144 bytes in
            // pages), and the write; the old read once.
            let kept = at.min(8192);
            let written = after.bytes_written - before.bytes_written;
            assert_eq!(written, 2 * (kept + 5015), "{path:?} {name}");
            assert_eq!(after.reads - before.reads, 1, "{path:?} {name}");
            assert_eq!(t.read_file(name).unwrap(), want(at), "{path:?} {name}");
        }
        // A copy's server fails an operation of that round: the move, then the write.
        let t = TestFs::replicated(2, 16 << 20, 1 << 20, path, 2);
        t.create("f").unwrap();
        t.write_file("f", 0, &first).unwrap();
        t.nodes[1].fail_nth(1, false);
        t.write_file("f", 6144, &second).unwrap();
        assert_eq!(t.read_file("f").unwrap(), want(6144), "{path:?}");
    }
}

/// A small file's extent comes from the pool's stock, refilled at once: the next file of that
/// length needs no allocation round trip, and the stock is the pool's, not the files'. A
/// server that refuses an allocation for lack of room gets its stock back first, so the room
/// it held is not lost to the file system.
#[test]
fn small_files_take_stocked_extents_and_a_full_server_gets_the_stock_back() {
    use rmemfs::config::STOCK_DEPTH;
    use rmemfs::fabric::ServerId;
    const PAGE: u64 = 4096;
    let t = TestFs::new(1, 1 << 20, 1 << 20);
    let pool = t.fs.data().pool().clone();
    t.create("a").unwrap();
    t.write_file("a", 0, b"first").unwrap();
    assert_eq!(used(&t), PAGE);
    assert_eq!(pool.stocked_bytes(ServerId(0)), STOCK_DEPTH as u64 * PAGE);
    t.create("b").unwrap();
    t.write_file("b", 0, b"second").unwrap();
    // The refill's answer is handled before the answer to any later request on the control
    // connection (served in order): one round trip makes sure it has landed.
    pool.refresh();
    assert_eq!(used(&t), 2 * PAGE);
    assert_eq!(
        pool.stocked_bytes(ServerId(0)),
        STOCK_DEPTH as u64 * PAGE,
        "one taken, and asked for again"
    );
    assert_eq!(t.read_file("b").unwrap(), b"second");
    t.fs.unlink(ROOT_INO, b"b").unwrap();
    // Page by page, the server gives every page but file a's: the last ones only once the
    // stock is given back.
    let mut pages = Vec::new();
    while let Ok(r) = pool.alloc_on(ServerId(0), PAGE) {
        pages.push(r);
    }
    assert_eq!(pages.len() as u64, (1 << 20) / PAGE - 1);
    assert_eq!(pool.stocked_bytes(ServerId(0)), 0);
    pool.free_all(&pages);
    assert_eq!(t.read_file("a").unwrap(), b"first");
}

/// A chunk's copies drawn from two servers' stocks, one of which has none of that length:
/// the other's extent goes back, and its stock stays at its depth (the refill counts it).
#[test]
fn a_partial_take_from_the_stock_does_not_overfill_it() {
    use rmemfs::config::STOCK_DEPTH;
    use rmemfs::fabric::ServerId;
    const PAGE: u64 = 4096;
    let t = TestFs::replicated(3, 1 << 20, 1 << 20, rmemfs::data::WritePath::Frrwp, 2);
    let pool = t.fs.data().pool().clone();
    // Placement goes by free memory, so the two copies move around the three servers and
    // some files find one chosen server with that length in stock and one without.
    for i in 0..8 {
        let name = format!("f{i}");
        t.create(&name).unwrap();
        t.write_file(&name, 0, b"small").unwrap();
        pool.refresh();
        for s in 0..3 {
            let stocked = pool.stocked_bytes(ServerId(s));
            assert!(
                stocked <= STOCK_DEPTH as u64 * PAGE,
                "after {name}: server {s} holds {stocked} bytes in stock"
            );
        }
    }
    for i in 0..8 {
        assert_eq!(t.read_file(&format!("f{i}")).unwrap(), b"small");
    }
}

#[test]
fn full_pool_gives_enospc_and_keeps_existing_files() {
    let t = TestFs::new(2, 4 << 20, 1 << 20);
    t.create("keep").unwrap();
    let keep = bytes(4, 1 << 20);
    t.write_file("keep", 0, &keep).unwrap();
    t.create("fill").unwrap();
    let err = t.write_file("fill", 0, &bytes(5, 16 << 20)).unwrap_err();
    assert_eq!(err, libc::ENOSPC);
    assert_eq!(t.read_file("keep").unwrap(), keep);
    t.fs.unlink(ROOT_INO, b"fill").unwrap();
    t.create("again").unwrap();
    t.write_file("again", 0, &bytes(6, 2 << 20)).unwrap();
    let stat = t.fs.statfs();
    assert_eq!(stat.blocks, (8 << 20) / 4096);
    assert!(stat.blocks_free < stat.blocks);
}

#[test]
fn two_copies_on_two_servers_fill_at_half_the_raw_capacity() {
    // 2 × 4 MiB raw, two copies of everything: 4 MiB of files at most.
    let t = TestFs::replicated(2, 4 << 20, 1 << 20, rmemfs::data::WritePath::Frrwp, 2);
    assert_eq!(t.fs.statfs().blocks, (4 << 20) / 4096);
    t.create("keep").unwrap();
    let keep = bytes(4, 1 << 20);
    t.write_file("keep", 0, &keep).unwrap();
    t.create("fill").unwrap();
    let err = t.write_file("fill", 0, &bytes(5, 8 << 20)).unwrap_err();
    assert_eq!(err, libc::ENOSPC);
    assert_eq!(t.read_file("keep").unwrap(), keep);
    let fill = t.fs.getattr(t.resolve("fill").unwrap()).unwrap().size;
    assert!(
        fill <= 3 << 20,
        "{fill} bytes written next to a 1 MiB file in 4 MiB"
    );
    let h = t.fs.replica_health();
    assert_eq!((h.degraded, h.lost), (0, 0), "{h:?}");
    assert!(h.healthy >= 1);
}

#[test]
fn a_dead_server_costs_no_byte_with_two_copies_and_writes_restore_them() {
    let mut t = TestFs::replicated(3, 16 << 20, 1 << 20, rmemfs::data::WritePath::Frrwp, 2);
    for i in 0..6 {
        let p = format!("f{i}");
        t.create(&p).unwrap();
        t.write_file(&p, 0, &bytes(i, 1 << 20)).unwrap();
    }
    assert_eq!(t.fs.replica_health().healthy, 6);
    t.kill_server(1);
    for i in 0..6 {
        assert_eq!(t.read_file(&format!("f{i}")).unwrap(), bytes(i, 1 << 20));
    }
    let h = t.fs.replica_health();
    assert!(h.degraded > 0 && h.lost == 0, "{h:?}");
    // A write to a chunk that lost a copy first places a new one on the third server.
    for i in 0..6 {
        t.write_file(&format!("f{i}"), 100, b"again").unwrap();
    }
    let h = t.fs.replica_health();
    assert_eq!((h.healthy, h.degraded, h.lost), (6, 0, 0), "{h:?}");
    // The other live server dies too: every chunk still has a copy (on the third one).
    t.kill_server(0);
    for i in 0..6 {
        let mut want = bytes(i, 1 << 20);
        want[100..105].copy_from_slice(b"again");
        assert_eq!(t.read_file(&format!("f{i}")).unwrap(), want);
    }
}

#[test]
fn rebuild_restores_every_copy_while_files_are_written() {
    use rmemfs::upkeep::rebuild::{pass, Stop};
    let mut t = TestFs::replicated(3, 32 << 20, 1 << 20, rmemfs::data::WritePath::Frrwp, 2);
    let mut want = Vec::new();
    for i in 0..8 {
        let p = format!("f{i}");
        t.create(&p).unwrap();
        let data = bytes(i, 2 << 20);
        t.write_file(&p, 0, &data).unwrap();
        want.push(data);
    }
    t.kill_server(1);
    assert!(t.fs.replica_health().degraded > 0);
    let shown = rmemfs::upkeep::figures::RebuildStats::default();
    // A writer rewrites parts of every file while the rebuild copies their chunks.
    let start = std::sync::Barrier::new(2);
    let stop = Stop::default();
    let outcome = std::thread::scope(|s| {
        s.spawn(|| {
            start.wait();
            for round in 0..4u64 {
                for (i, w) in want.iter_mut().enumerate() {
                    let off = ((round * 300_000 + i as u64 * 7919) % (2 << 20)) as usize;
                    let patch = bytes(100 + round * 10 + i as u64, 200_000.min(w.len() - off));
                    t.write_file(&format!("f{i}"), off as u64, &patch).unwrap();
                    w[off..off + patch.len()].copy_from_slice(&patch);
                }
            }
        });
        start.wait();
        pass(&t.fs, 0, &stop, &shown)
    });
    let h = t.fs.replica_health();
    assert_eq!((h.degraded, h.lost), (0, 0), "{h:?} after {outcome:?}");
    assert_eq!(
        shown
            .left_degraded
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    // Every copy holds the latest bytes: lose another server and read from what is left.
    t.kill_server(0);
    for (i, w) in want.iter().enumerate() {
        assert!(
            t.read_file(&format!("f{i}")).unwrap() == *w,
            "f{i} after two deaths"
        );
    }
}

#[test]
fn dead_server_gives_eio_for_its_files_only() {
    let t = TestFs::new(2, 16 << 20, 1 << 20);
    // One chunk each: placement alternates between the two (equally free) servers.
    for i in 0..6 {
        let p = format!("f{i}");
        t.create(&p).unwrap();
        t.write_file(&p, 0, &bytes(i, 1 << 20)).unwrap();
    }
    t.nodes[1].kill();
    let (mut ok, mut eio) = (0, 0);
    for i in 0..6 {
        match t.read_file(&format!("f{i}")) {
            Ok(d) => {
                assert_eq!(d, bytes(i, 1 << 20));
                ok += 1;
            }
            Err(e) => {
                assert_eq!(e, libc::EIO);
                eio += 1;
            }
        }
    }
    assert!(ok > 0 && eio > 0, "ok {ok}, eio {eio}");
    // New data goes to the live server.
    t.create("new").unwrap();
    t.write_file("new", 0, &bytes(9, 2 << 20)).unwrap();
    assert_eq!(t.read_file("new").unwrap(), bytes(9, 2 << 20));
}

#[test]
fn rename_flags() {
    let t = TestFs::new(1, 8 << 20, 1 << 20);
    t.create("a").unwrap();
    t.write_file("a", 0, b"AAA").unwrap();
    t.create("b").unwrap();
    t.write_file("b", 0, b"B").unwrap();
    let e =
        t.fs.rename(ROOT_INO, b"a", ROOT_INO, b"b", RENAME_NOREPLACE, ME)
            .unwrap_err();
    assert_eq!(e.errno, libc::EEXIST);
    t.fs.rename(ROOT_INO, b"a", ROOT_INO, b"b", RENAME_EXCHANGE, ME)
        .unwrap();
    assert_eq!(t.read_file("a").unwrap(), b"B");
    assert_eq!(t.read_file("b").unwrap(), b"AAA");
    // Exchange a file and a directory across directories: parents and link counts follow.
    let d = t.fs.mkdir(ROOT_INO, b"d", 0o755, ME).unwrap();
    t.fs.mkdir(ROOT_INO, b"e", 0o755, ME).unwrap();
    let e_ino = t.resolve("e").unwrap();
    t.create("e/x").unwrap();
    t.fs.rename(e_ino, b"x", ROOT_INO, b"d", RENAME_EXCHANGE, ME)
        .unwrap();
    assert_eq!(
        t.fs.getattr(t.resolve("e/x").unwrap()).unwrap().kind,
        Kind::Dir
    );
    assert_eq!(
        t.fs.lookup(t.resolve("e/x").unwrap(), b"..").unwrap().ino,
        e_ino
    );
    assert_eq!(t.fs.getattr(e_ino).unwrap().nlink, 3);
    assert_eq!(t.fs.getattr(d.ino).unwrap().nlink, 2);
    let e =
        t.fs.rename(ROOT_INO, b"nothere", ROOT_INO, b"a", RENAME_EXCHANGE, ME)
            .unwrap_err();
    assert_eq!(e.errno, libc::ENOENT);
}

#[test]
fn readdir_offsets_survive_changes() {
    let t = TestFs::new(1, 8 << 20, 1 << 20);
    for i in 0..10 {
        t.create(&format!("n{i}")).unwrap();
    }
    let mut first = Vec::new();
    let fh = t.fs.opendir(ROOT_INO).unwrap();
    t.fs.readdir(ROOT_INO, fh, 0, &mut |e| {
        first.push(e);
        first.len() < 5
    })
    .unwrap();
    assert_eq!(first[0].name, b".");
    assert_eq!(first[1].name, b"..");
    // Remove an entry already listed and one not yet listed, then resume.
    t.fs.unlink(ROOT_INO, b"n0").unwrap();
    t.fs.unlink(ROOT_INO, b"n9").unwrap();
    let mut rest = Vec::new();
    t.fs.readdir(ROOT_INO, fh, first.last().unwrap().offset, &mut |e| {
        rest.push(String::from_utf8(e.name).unwrap());
        true
    })
    .unwrap();
    assert_eq!(rest, ["n3", "n4", "n5", "n6", "n7", "n8"]);
}

#[test]
fn append_xattrs_fallocate_links_symlinks_fifos() {
    let t = TestFs::new(1, 8 << 20, 1 << 20);
    t.create("f").unwrap();
    let ino = t.resolve("f").unwrap();
    let fh = t.fs.open(ino, libc::O_WRONLY | libc::O_APPEND).unwrap();
    t.fs.write(ino, fh, 0, b"one", ME).unwrap();
    t.fs.write(ino, fh, 0, b"two", ME).unwrap();
    t.fs.fallocate(ino, fh, 0, 10 << 10, 0, ME).unwrap();
    t.fs.release(fh);
    let mut want = b"onetwo".to_vec();
    want.resize(10 << 10, 0);
    assert_eq!(t.read_file("f").unwrap(), want);

    t.fs.setxattr(ino, b"user.k", b"v", 0, ME).unwrap();
    assert_eq!(t.fs.getxattr(ino, b"user.k").unwrap(), b"v");
    assert_eq!(
        t.fs.setxattr(ino, b"user.k", b"w", libc::XATTR_CREATE, ME)
            .unwrap_err()
            .errno,
        libc::EEXIST
    );
    assert_eq!(
        t.fs.setxattr(ino, b"user.z", b"w", libc::XATTR_REPLACE, ME)
            .unwrap_err()
            .errno,
        libc::ENODATA
    );
    assert_eq!(
        t.fs.setxattr(ino, b"os2.k", b"w", 0, ME).unwrap_err().errno,
        libc::EOPNOTSUPP
    );
    assert_eq!(t.fs.listxattr(ino).unwrap(), b"user.k\0");
    t.fs.removexattr(ino, b"user.k").unwrap();
    assert_eq!(
        t.fs.getxattr(ino, b"user.k").unwrap_err().errno,
        libc::ENODATA
    );

    let l = t.fs.link(ino, ROOT_INO, b"g").unwrap();
    assert_eq!(l.nlink, 2);
    t.write_file("g", 0, b"ONE").unwrap();
    assert_eq!(&t.read_file("f").unwrap()[..6], b"ONEtwo");

    let s = t.fs.symlink(ROOT_INO, b"s", b"f", ME).unwrap();
    assert_eq!(t.fs.readlink(s.ino).unwrap(), b"f");
    assert_eq!(s.size, 1);
    let p =
        t.fs.mknod(ROOT_INO, b"p", libc::S_IFIFO | 0o600, 0, ME)
            .unwrap();
    assert_eq!(p.kind, Kind::Fifo);

    // O_EXCL, O_TRUNC, rmdir of a non-empty directory, names too long.
    assert_eq!(
        t.fs.create(ROOT_INO, b"f", 0o644, libc::O_WRONLY | libc::O_EXCL, ME)
            .unwrap_err()
            .errno,
        libc::EEXIST
    );
    let fh = t.fs.open(ino, libc::O_WRONLY | libc::O_TRUNC).unwrap();
    t.fs.release(fh);
    assert_eq!(t.fs.getattr(ino).unwrap().size, 0);
    let d = t.fs.mkdir(ROOT_INO, b"d", 0o755, ME).unwrap();
    t.fs.mknod(d.ino, b"x", libc::S_IFREG | 0o644, 0, ME)
        .unwrap();
    assert_eq!(
        t.fs.rmdir(ROOT_INO, b"d").unwrap_err().errno,
        libc::ENOTEMPTY
    );
    assert_eq!(
        t.fs.mkdir(ROOT_INO, &[b'x'; 256], 0o755, ME)
            .unwrap_err()
            .errno,
        libc::ENAMETOOLONG
    );
}

#[test]
fn parallel_writers_on_different_files() {
    let t = TestFs::new(2, 64 << 20, 1 << 20);
    std::thread::scope(|s| {
        for w in 0..4u64 {
            let t = &t;
            s.spawn(move || {
                let p = format!("w{w}");
                t.create(&p).unwrap();
                let data = bytes(w + 100, 3 << 20);
                for (i, piece) in data.chunks(256 << 10).enumerate() {
                    t.write_file(&p, (i * (256 << 10)) as u64, piece).unwrap();
                }
                assert_eq!(t.read_file(&p).unwrap(), data);
            });
        }
    });
}

/// Files f0..f5 of 1 MiB each (`bytes(i, 1 MiB)`).
fn six_files(t: &TestFs) {
    for i in 0..6 {
        let p = format!("f{i}");
        t.create(&p).unwrap();
        t.write_file(&p, 0, &bytes(i, 1 << 20)).unwrap();
    }
}

/// One rebuild pass over `t`, at no rate limit.
fn rebuild_pass(t: &TestFs) -> rmemfs::upkeep::rebuild::PassOutcome {
    rmemfs::upkeep::rebuild::pass(
        &t.fs,
        0,
        &rmemfs::upkeep::rebuild::Stop::default(),
        &Default::default(),
    )
}

/// Files f0.. f`files - 1` read back as written (`bytes(i, 1 MiB)`), with "again" at byte
/// 100 of those `again` picks.
fn reads_back(t: &TestFs, files: u64, again: impl Fn(u64) -> bool) {
    for i in 0..files {
        let mut want = bytes(i, 1 << 20);
        if again(i) {
            want[100..105].copy_from_slice(b"again");
        }
        assert!(t.read_file(&format!("f{i}")).unwrap() == want, "f{i}");
    }
}

/// Bytes of server `server`'s memory the file system's chunk maps list.
fn listed_on(t: &TestFs, server: u32) -> u64 {
    t.fs.files()
        .iter()
        .map(|f| {
            f.chunks
                .read()
                .values()
                .filter(|c| c.on(server).is_some())
                .map(|c| c.len)
                .sum::<u64>()
        })
        .sum()
}

#[test]
fn a_cut_off_server_resumes_its_session_with_every_copy_intact() {
    use rmemfs::client::Rejoin;
    use rmemfs::fabric::ServerId;
    let mut t = TestFs::replicated(3, 16 << 20, 1 << 20, rmemfs::data::WritePath::Frrwp, 2);
    six_files(&t);
    let pool = t.fs.data().pool().clone();
    let held = listed_on(&t, 1);
    assert!(held > 0);
    pool.cut(ServerId(1));
    assert!(!pool.is_live(ServerId(1)));
    // Written while server 1 is unreachable: chunks it held a copy of lose that copy (it
    // misses the write) and get one elsewhere.
    for i in 0..6 {
        t.write_file(&format!("f{i}"), 100, b"again").unwrap();
    }
    let during = listed_on(&t, 1);
    assert_eq!(during, 0, "a copy that missed a write is still listed");
    // The server kept the session (its lease): the pool resumes it, and the copies it let
    // go of meanwhile are freed there.
    let rejoin = pool.try_reconnect(ServerId(1));
    assert!(
        matches!(rejoin, Some(Rejoin::Resumed { bytes, .. }) if bytes >= held),
        "{rejoin:?}"
    );
    assert!(pool.is_live(ServerId(1)));
    let cap = t.servers[1].capacity();
    assert_eq!(
        cap.total - cap.free,
        listed_on(&t, 1) + pool.stocked_bytes(ServerId(1)),
        "stale copies not freed"
    );
    // New copies land on it again, and what it holds is read back exactly.
    for i in 6..12 {
        let p = format!("f{i}");
        t.create(&p).unwrap();
        t.write_file(&p, 0, &bytes(i, 1 << 20)).unwrap();
    }
    assert!(listed_on(&t, 1) > 0);
    t.kill_server(0);
    reads_back(&t, 12, |i| i < 6);
}

#[test]
fn a_session_untouched_while_cut_off_needs_no_rebuild() {
    use rmemfs::fabric::ServerId;
    let t = TestFs::replicated(3, 16 << 20, 1 << 20, rmemfs::data::WritePath::Frrwp, 2);
    six_files(&t);
    let pool = t.fs.data().pool().clone();
    pool.cut(ServerId(2));
    assert!(t.fs.replica_health().degraded > 0);
    assert!(pool.try_reconnect(ServerId(2)).is_some());
    let h = t.fs.replica_health();
    assert_eq!((h.healthy, h.degraded, h.lost), (6, 0, 0), "{h:?}");
    let out = rebuild_pass(&t);
    assert_eq!(out.bytes_copied, 0, "{out:?}");
}

/// Two servers, two copies, one cut off: the rebuild has nowhere to put the missing copies,
/// so it keeps those on the unreachable server listed (they missed no write). When the
/// server resumes, only the chunk written meanwhile is copied again, and every copy it kept
/// is read back exactly with the other server gone.
#[test]
fn a_rebuild_with_nowhere_to_copy_keeps_the_copies_a_server_may_resume_with() {
    use rmemfs::client::Rejoin;
    use rmemfs::fabric::ServerId;
    let mut t = TestFs::replicated(2, 16 << 20, 1 << 20, rmemfs::data::WritePath::Frrwp, 2);
    six_files(&t);
    let pool = t.fs.data().pool().clone();
    let held = listed_on(&t, 1);
    assert_eq!(held, 6 << 20);
    pool.cut(ServerId(1));
    let out = rebuild_pass(&t);
    assert_eq!((out.bytes_copied, out.left_degraded), (0, 6), "{out:?}");
    assert_eq!(
        listed_on(&t, 1),
        held,
        "the rebuild let go of copies it could not replace"
    );
    // A write lets go of the copy that misses it.
    t.write_file("f3", 100, b"again").unwrap();
    assert_eq!(listed_on(&t, 1), held - (1 << 20));
    assert!(matches!(
        pool.try_reconnect(ServerId(1)),
        Some(Rejoin::Resumed { .. })
    ));
    let h = t.fs.replica_health();
    assert_eq!((h.healthy, h.degraded, h.lost), (5, 1, 0), "{h:?}");
    let out = rebuild_pass(&t);
    assert_eq!(
        (out.chunks_rebuilt, out.bytes_copied),
        (1, 1 << 20),
        "{out:?}"
    );
    t.kill_server(0);
    reads_back(&t, 6, |i| i == 3);
}

/// Four copies on five servers, one cut off: a chunk has no slot for a fifth copy, so the
/// rebuild lets go of the unreachable one to list the new one, and leaves no extent copied
/// and unlisted on any server.
#[test]
fn a_rebuild_of_a_chunk_with_every_slot_taken_lists_each_new_copy() {
    use rmemfs::fabric::ServerId;
    let t = TestFs::replicated(5, 16 << 20, 1 << 20, rmemfs::data::WritePath::Frrwp, 4);
    six_files(&t);
    let pool = t.fs.data().pool().clone();
    let on_0 = listed_on(&t, 0) >> 20;
    assert!(on_0 > 0);
    pool.cut(ServerId(0));
    let out = rebuild_pass(&t);
    assert_eq!(
        (out.chunks_rebuilt, out.left_degraded),
        (on_0, 0),
        "{out:?}"
    );
    let h = t.fs.replica_health();
    assert_eq!((h.healthy, h.degraded, h.lost), (6, 0, 0), "{h:?}");
    assert_eq!(listed_on(&t, 0), 0);
    for i in 1..5 {
        let cap = t.servers[i].capacity();
        assert_eq!(
            cap.total - cap.free,
            listed_on(&t, i as u32) + pool.stocked_bytes(ServerId(i as u32)),
            "server {i} holds extents no chunk lists"
        );
    }
}

#[test]
fn a_restarted_server_is_admitted_empty_and_rebuilt_onto() {
    use rmemfs::client::Rejoin;
    use rmemfs::fabric::ServerId;
    let mut t = TestFs::replicated(3, 16 << 20, 1 << 20, rmemfs::data::WritePath::Frrwp, 2);
    six_files(&t);
    let pool = t.fs.data().pool().clone();
    t.kill_server(1);
    assert!(!pool.is_live(ServerId(1)));
    t.restart_server(1);
    assert_eq!(pool.try_reconnect(ServerId(1)), Some(Rejoin::Empty));
    // Not in service until every copy it listed is forgotten.
    assert!(!pool.is_live(ServerId(1)));
    let forgot = rmemfs::upkeep::rebuild::forget_server(&t.fs, ServerId(1));
    assert!(forgot > 0);
    pool.admit(ServerId(1));
    assert!(pool.is_live(ServerId(1)));
    let h = t.fs.replica_health();
    assert_eq!(h.degraded, forgot, "{h:?}");
    let out = rebuild_pass(&t);
    assert_eq!(out.chunks_rebuilt, forgot, "{out:?}");
    let h = t.fs.replica_health();
    assert_eq!((h.healthy, h.degraded, h.lost), (6, 0, 0), "{h:?}");
    // The copies on the restarted server are real: lose another server and read.
    t.kill_server(2);
    for i in 0..6 {
        assert!(
            t.read_file(&format!("f{i}")).unwrap() == bytes(i, 1 << 20),
            "f{i}"
        );
    }
}

#[test]
fn an_expired_lease_gives_the_memory_back_and_the_server_returns_empty() {
    use rmemfs::client::Rejoin;
    use rmemfs::fabric::ServerId;
    let t = TestFs::with_lease(
        2,
        16 << 20,
        1 << 20,
        rmemfs::data::WritePath::Frrwp,
        2,
        std::time::Duration::from_secs(1),
    );
    t.create("f").unwrap();
    t.write_file("f", 0, &bytes(1, 2 << 20)).unwrap();
    let pool = t.fs.data().pool().clone();
    let cap = t.servers[0].capacity();
    assert!(cap.free < cap.total);
    pool.cut(ServerId(0));
    // Held for the lease, then freed: wait for the server to say so (bounded).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let cap = t.servers[0].capacity();
        if t.servers[0].departed_sessions() == 0 && cap.free == cap.total {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "lease never expired");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(pool.try_reconnect(ServerId(0)), Some(Rejoin::Empty));
    assert!(t.read_file("f").unwrap() == bytes(1, 2 << 20));
}

/// Reads are answered from the pooled buffer the fabric read into, which the read before
/// filled: what no chunk covers (a missing chunk, the tail of a short one) must read as zeros.
#[test]
fn a_reused_read_buffer_gives_holes_as_zeros() {
    let t = TestFs::new(1, 16 << 20, 64 << 10);
    t.create("full").unwrap();
    let full = bytes(7, 1 << 20);
    t.write_file("full", 0, &full).unwrap();
    t.create("sparse").unwrap();
    let at = 200 << 10;
    t.write_file("sparse", at, &[0xAB; 100]).unwrap();
    let sparse = t.resolve("sparse").unwrap();
    let set = SetAttr {
        size: Some(1 << 20),
        ..Default::default()
    };
    t.fs.setattr(sparse, &set, ME).unwrap();
    let mut expect = vec![0u8; 1 << 20];
    expect[at as usize..at as usize + 100].fill(0xAB);
    let (f, s) = (t.resolve("full").unwrap(), sparse);
    let (fh_f, fh_s) = (
        t.fs.open(f, libc::O_RDONLY).unwrap(),
        t.fs.open(s, libc::O_RDONLY).unwrap(),
    );
    for _ in 0..3 {
        // One loan at a time: each read takes the buffer the one before gave back.
        assert_eq!(
            t.fs.read_buf(f, fh_f, 0, 1 << 20).unwrap().bytes(),
            &full[..]
        );
        let back = t.fs.read_buf(s, fh_s, 0, 1 << 20).unwrap();
        assert_eq!(back.bytes().len(), 1 << 20);
        assert!(back.bytes() == &expect[..], "holes read as zeros");
    }
    t.fs.release(fh_f);
    t.fs.release(fh_s);
}

// ---- fallocate and truncate: all or nothing -------------------------------------------------

/// Takes 1 MiB extents on server `s` until it has `free` bytes left (memory the file system
/// does not hold, as another client's would be).
fn hog(t: &TestFs, s: u32, free: u64) -> Vec<rmemfs::fabric::RemoteRegion> {
    use rmemfs::fabric::ServerId;
    let pool = t.fs.data().pool();
    let mut taken = Vec::new();
    while t.servers[s as usize].capacity().free > free {
        taken.push(pool.alloc_on(ServerId(s), 1 << 20).unwrap());
    }
    assert_eq!(t.servers[s as usize].capacity().free, free);
    taken
}

/// Two copies of every chunk over three servers with 12, 2 and 2 MiB free: 8 MiB of chunks
/// (16 MiB of copies) sum as fitting, but every chunk needs a copy on server 1 or 2, which
/// hold 4 between them. The fallocate is refused before any server is asked.
#[test]
fn fallocate_that_cannot_place_every_copy_on_distinct_servers_allocates_nothing() {
    let t = TestFs::replicated(3, 16 << 20, 1 << 20, rmemfs::data::WritePath::Frrwp, 2);
    let _hogs = [
        hog(&t, 0, 12 << 20),
        hog(&t, 1, 2 << 20),
        hog(&t, 2, 2 << 20),
    ];
    t.create("f").unwrap();
    let ino = t.resolve("f").unwrap();
    let fh = t.fs.open(ino, libc::O_WRONLY).unwrap();
    let before = used(&t);
    let refused = || -> u64 {
        t.servers
            .iter()
            .map(|s| s.counters().refused_no_space)
            .sum()
    };
    for mode in [0, libc::FALLOC_FL_KEEP_SIZE] {
        let e = t.fs.fallocate(ino, fh, 0, 8 << 20, mode, ME).unwrap_err();
        assert_eq!(e.errno, libc::ENOSPC, "mode {mode}: {e}");
        assert_eq!(
            refused(),
            0,
            "mode {mode}: refused by the check, not by a server"
        );
        assert_eq!(used(&t), before, "mode {mode}: chunks left allocated");
        let a = t.fs.getattr(ino).unwrap();
        assert_eq!((a.size, a.blocks), (0, 0), "mode {mode}");
    }
    // What does fit is allocated: four chunks, a copy of each on server 0.
    t.fs.fallocate(ino, fh, 0, 4 << 20, 0, ME).unwrap();
    assert_eq!(used(&t), before + (8 << 20));
    assert_eq!(t.fs.getattr(ino).unwrap().size, 4 << 20);
    t.fs.release(fh);
}

/// A server whose free memory sums as room for two chunks but holds one 1 MiB hole (the
/// rest is single pages): the check cannot see that, the second chunk is refused, and what
/// the fallocate did before that is undone: the file keeps its short first chunk and its
/// bytes, and holds no more memory than before.
#[test]
fn fallocate_refused_partway_by_fragmentation_gives_back_what_it_took() {
    use rmemfs::fabric::ServerId;
    const PAGE: u64 = 4096;
    let t = TestFs::new(1, 4 << 20, 1 << 20);
    t.create("f").unwrap();
    t.write_file("f", 0, b"hello").unwrap();
    let pool = t.fs.data().pool().clone();
    let hole = pool.alloc_on(ServerId(0), 1 << 20).unwrap();
    let mut pages = Vec::new();
    while let Ok(r) = pool.alloc_on(ServerId(0), PAGE) {
        pages.push(r);
    }
    pool.free(hole).unwrap();
    for p in pages.iter().skip(1).step_by(2) {
        pool.free(*p).unwrap();
    }
    let cap = pool.refresh()[0].capacity;
    assert_eq!(cap.largest_free, 1 << 20);
    assert!(cap.free >= 2 << 20, "{cap:?}");
    let ino = t.resolve("f").unwrap();
    let blocks = t.fs.getattr(ino).unwrap().blocks;
    let before = used(&t);
    let fh = t.fs.open(ino, libc::O_WRONLY).unwrap();
    let refused = t.servers[0].counters().refused_no_space;
    let e = t.fs.fallocate(ino, fh, 0, 2 << 20, 0, ME).unwrap_err();
    t.fs.release(fh);
    assert_eq!(e.errno, libc::ENOSPC, "{e}");
    assert!(
        t.servers[0].counters().refused_no_space > refused,
        "refused by the server (partway), not by the check"
    );
    assert_eq!(used(&t), before, "chunks left allocated");
    let a = t.fs.getattr(ino).unwrap();
    assert_eq!((a.size, a.blocks), (5, blocks));
    assert_eq!(t.read_file("f").unwrap(), b"hello");
}

/// A truncate whose zeroing of the chunk it ends in fails (that chunk's only copy is on a
/// dead server) changes nothing: the chunks past the new end are still there and read back,
/// and the size stays.
#[test]
fn a_truncate_whose_zeroing_fails_frees_nothing_and_keeps_the_size() {
    let mut t = TestFs::new(2, 16 << 20, 1 << 20);
    t.create("f").unwrap();
    let data = bytes(11, 3 << 20);
    t.write_file("f", 0, &data).unwrap();
    let holder = |idx: u64| {
        let files = t.fs.files();
        let c = files[0].chunks.read()[&idx].clone();
        c.replicas()[0].server
    };
    let (ends_in, past) = (holder(1), holder(2));
    assert_ne!(ends_in, past, "chunks 1 and 2 on different servers");
    t.kill_server(ends_in as usize);
    let ino = t.resolve("f").unwrap();
    let blocks = t.fs.getattr(ino).unwrap().blocks;
    let set = SetAttr {
        size: Some((1 << 20) + 10),
        ..Default::default()
    };
    let e = t.fs.setattr(ino, &set, ME).unwrap_err();
    assert_eq!(e.errno, libc::EIO, "{e}");
    let a = t.fs.getattr(ino).unwrap();
    assert_eq!((a.size, a.blocks), (3 << 20, blocks));
    let fh = t.fs.open(ino, libc::O_RDONLY).unwrap();
    let back = t.fs.read(ino, fh, 2 << 20, 1 << 20).unwrap();
    t.fs.release(fh);
    assert!(back == data[2 << 20..], "chunk 2 was freed");
}

/// A punch whose zeroing of a chunk it cuts fails (that chunk's only copy is on a dead
/// server) gives back none of the chunks wholly inside it.
#[test]
fn a_punch_whose_zeroing_fails_frees_nothing() {
    let mut t = TestFs::new(2, 16 << 20, 1 << 20);
    t.create("f").unwrap();
    let data = bytes(12, 3 << 20);
    t.write_file("f", 0, &data).unwrap();
    let holder = |idx: u64| {
        let files = t.fs.files();
        let c = files[0].chunks.read()[&idx].clone();
        c.replicas()[0].server
    };
    let (whole, cut) = (holder(1), holder(2));
    assert_ne!(whole, cut, "chunks 1 and 2 on different servers");
    t.kill_server(cut as usize);
    let ino = t.resolve("f").unwrap();
    let blocks = t.fs.getattr(ino).unwrap().blocks;
    let fh = t.fs.open(ino, libc::O_RDWR).unwrap();
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // All of chunk 1 and the first half of chunk 2.
    let e =
        t.fs.fallocate(ino, fh, 1 << 20, 3 << 19, punch, ME)
            .unwrap_err();
    assert_eq!(e.errno, libc::EIO, "{e}");
    assert_eq!(t.fs.getattr(ino).unwrap().blocks, blocks);
    let back = t.fs.read(ino, fh, 1 << 20, 1 << 20).unwrap();
    t.fs.release(fh);
    assert!(back == data[1 << 20..2 << 20], "chunk 1 was freed");
}

/// Collapse and insert ranges that are not whole chunks copy the file's bytes within it,
/// writing every byte of where they go: holes there take chunks. Without the room for them,
/// the operation is refused before it moves a byte or takes a chunk.
#[test]
fn collapse_and_insert_without_room_to_copy_into_change_nothing() {
    const MIB: u64 = 1 << 20;
    // A 3 MiB server, room for one more chunk. Collapse: chunks 0 and 3 of a 4 MiB file; its
    // copy down fills holes 1 and 2. Insert: chunks 0 and 2 of a 3 MiB file; its copy up
    // (back to front) fills the new chunk 3, then hole 1.
    for (mode, at) in [
        (libc::FALLOC_FL_COLLAPSE_RANGE, [0, 3 * MIB]),
        (libc::FALLOC_FL_INSERT_RANGE, [0, 2 * MIB]),
    ] {
        let t = TestFs::new(1, 3 * MIB, MIB);
        t.create("f").unwrap();
        for (i, &a) in at.iter().enumerate() {
            t.write_file("f", a, &bytes(20 + i as u64, MIB as usize))
                .unwrap();
        }
        let want = t.read_file("f").unwrap();
        let ino = t.resolve("f").unwrap();
        let attr = t.fs.getattr(ino).unwrap();
        let before = used(&t);
        let fh = t.fs.open(ino, libc::O_RDWR).unwrap();
        let e = t.fs.fallocate(ino, fh, 4096, 4096, mode, ME).unwrap_err();
        t.fs.release(fh);
        assert_eq!(e.errno, libc::ENOSPC, "mode {mode}: {e}");
        assert_eq!(used(&t), before, "mode {mode}: chunks left allocated");
        let a = t.fs.getattr(ino).unwrap();
        assert_eq!((a.size, a.blocks), (attr.size, attr.blocks), "mode {mode}");
        assert!(
            t.read_file("f").unwrap() == want,
            "mode {mode}: bytes moved"
        );
    }
}

/// Waits up to `within` for `cond` to hold; whether it did.
fn eventually(within: std::time::Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + within;
    while !cond() {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    true
}

/// The upkeep threads over `t`, noticing a server silent for a second, rebuilding after
/// `delay` of unchanged live servers.
fn upkeep(t: &TestFs, delay: std::time::Duration) -> rmemfs::upkeep::rebuild::Rebuilder {
    let upkeep = rmemfs::upkeep::rebuild::Upkeep {
        rate: 0,
        delay,
        detection: std::time::Duration::from_secs(1),
        rebuild: true,
    };
    rmemfs::upkeep::rebuild::Rebuilder::start(t.fs.clone(), upkeep, Default::default()).unwrap()
}

/// Makes the next round of upkeep thread `thread` panic.
fn inject_panic(t: &TestFs, thread: &str) {
    let name = rmemfs::fs::INJECT_PANIC_XATTR;
    t.fs.setxattr(ROOT_INO, name, thread.as_bytes(), 0, ME)
        .unwrap();
}

/// A frozen server (connections open, nothing answered) is noticed only by the heartbeat
/// (a closed connection is noticed by whoever looks at the server next): after a panic in
/// the heartbeat thread, a server frozen for good is still marked down.
#[test]
fn a_panic_in_the_heartbeat_thread_does_not_end_failure_detection() {
    use rmemfs::fabric::ServerId;
    let t = TestFs::behind_relays(3, 2);
    six_files(&t);
    // No rebuild within the test: the health must show what the detection left.
    let threads = upkeep(&t, std::time::Duration::from_secs(3600));
    inject_panic(&t, "heartbeat");
    let pool = t.fs.data().pool().clone();
    let frozen = t.relays[2].freeze();
    let within = std::time::Duration::from_secs(20);
    assert!(
        eventually(within, || !pool.is_live(ServerId(2))),
        "the frozen server was not marked down within {within:?}"
    );
    assert_eq!(threads.figures().panics.of("heartbeat"), 1);
    let h = t.fs.replica_health();
    assert!(h.degraded > 0 && h.lost == 0, "{h:?}");
    for i in 0..6 {
        assert!(
            t.read_file(&format!("f{i}")).unwrap() == bytes(i, 1 << 20),
            "f{i}"
        );
    }
    // Thawed first, so a reconnect attempt waiting on it ends and the threads stop.
    drop(frozen);
    drop(threads);
}

/// After a panic in the rebuild thread, a dead server's copies are still rebuilt.
#[test]
fn a_panic_in_the_rebuild_thread_does_not_end_the_rebuild() {
    let mut t = TestFs::replicated(3, 16 << 20, 1 << 20, rmemfs::data::WritePath::Frrwp, 2);
    six_files(&t);
    let threads = upkeep(&t, std::time::Duration::from_millis(100));
    inject_panic(&t, "rebuild");
    t.kill_server(1);
    let rebuilt = || {
        let h = t.fs.replica_health();
        let copied = threads
            .figures()
            .rebuild
            .chunks_rebuilt
            .load(Ordering::Relaxed);
        copied > 0 && (h.healthy, h.degraded, h.lost) == (6, 0, 0)
    };
    let within = std::time::Duration::from_secs(20);
    assert!(
        eventually(within, rebuilt),
        "no rebuild within {within:?}: {:?}",
        t.fs.replica_health()
    );
    assert_eq!(threads.figures().panics.of("rebuild"), 1);
    drop(threads);
    // The copies are real: lose another server and read.
    t.kill_server(0);
    for i in 0..6 {
        assert!(
            t.read_file(&format!("f{i}")).unwrap() == bytes(i, 1 << 20),
            "f{i}"
        );
    }
}

/// After a panic in the reconnect thread, a server cut off (its session kept) is still
/// reconnected to.
#[test]
fn a_panic_in_the_reconnect_thread_does_not_end_reconnecting() {
    use rmemfs::fabric::ServerId;
    let t = TestFs::replicated(3, 16 << 20, 1 << 20, rmemfs::data::WritePath::Frrwp, 2);
    six_files(&t);
    let threads = upkeep(&t, std::time::Duration::from_secs(3600));
    inject_panic(&t, "reconnect");
    let pool = t.fs.data().pool().clone();
    pool.cut(ServerId(2));
    let within = std::time::Duration::from_secs(20);
    assert!(
        eventually(within, || pool.is_live(ServerId(2))),
        "the cut-off server was not reconnected to within {within:?}"
    );
    assert_eq!(threads.figures().panics.of("reconnect"), 1);
    let h = t.fs.replica_health();
    assert_eq!((h.healthy, h.degraded, h.lost), (6, 0, 0), "{h:?}");
    drop(threads);
}

/// A volume's records (journal ring, checkpoint) move through the store's own bounce
/// buffers: no heap buffer is left in the registration cache. Freed and allocated again, a
/// heap buffer may sit on new pages while a cached registration still pins the old ones, and
/// a device (verbs) would then send the old pages' bytes, or read into them and leave the new
/// buffer zero (the rxe tier's volume came back with a fsynced file all zeros).
#[test]
fn whole_extent_transfers_leave_no_heap_buffer_in_the_registration_cache() {
    let t = TestFs::new(1, 64 << 20, 1 << 20);
    let data = t.fs.data();
    let region = data.pool().alloc(4 << 20).unwrap();
    let written = bytes(1, (2 << 20) + 123);
    data.write_regions(&[region], 4096, &written).unwrap();
    let back = data.read_region(region, 4096, written.len()).unwrap();
    assert!(back == written, "the bytes read back differ");
    let cached = data.cached_ranges();
    assert!(
        !cached.is_empty(),
        "the bounce buffers are registered through the cache"
    );
    for (what, v) in [("written", &written), ("read", &back)] {
        let (start, end) = (v.as_ptr() as u64, v.as_ptr() as u64 + v.len() as u64);
        assert!(
            !cached.iter().any(|&(a, b)| a < end && start < b),
            "the cache holds a registration of the {what} heap buffer ({start:#x}..{end:#x}): {cached:x?}"
        );
    }
}
