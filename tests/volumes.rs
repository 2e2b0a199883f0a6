//! Volumes over in-process servers: a namespace that outlives its daemon (crash, re-attach,
//! replay), one holder at a time fenced at the servers, collection of what nothing names,
//! and `volume rm`.

mod common;

use common::rack::{assert_same, Daemon, Rack};
use common::{bytes, ME};
use rmemfs::client::{PoolConfig, Rejoin};
use rmemfs::fabric::ServerId;
use rmemfs::meta::{Ino, ROOT_INO};
use rmemfs::volume::JournalOptions;
use std::collections::BTreeMap;
use std::time::Duration;

const MIB: usize = 1 << 20;

/// A tree of directories, files of several sizes (holes, a file over several chunks), a
/// symlink, a hard link and an extended attribute.
fn populate(d: &Daemon) {
    d.mkdir("a").unwrap();
    d.mkdir("a/b").unwrap();
    for i in 0..20u64 {
        d.write(&format!("a/f{i}"), &bytes(i, (i as usize * 7919) % 5000))
            .unwrap();
    }
    d.write("a/b/big", &bytes(99, 3 * MIB + 123)).unwrap();
    let (p, _) = d.parent("a/link").unwrap();
    d.fs().symlink(p, b"link", b"f1", ME).map(|_| ()).unwrap();
    let f2 = d.resolve("a/f2").unwrap();
    let b = d.resolve("a/b").unwrap();
    d.fs().link(f2, b, b"hard").unwrap();
    d.fs().setxattr(f2, b"user.tag", b"kept", 0, ME).unwrap();
}

#[test]
fn a_volume_outlives_its_daemon_and_keeps_inode_numbers() {
    let rack = Rack::new(2);
    let d = rack.attach("vol", true, false).unwrap();
    assert!(d.0.report.created);
    populate(&d);
    d.sync().unwrap();
    let parts = rmemfs::report::Parts::of(d.fs().clone());
    let j = rmemfs::report::MountReport::gather(&parts)
        .journal
        .expect("a volume mount reports its journal");
    assert_eq!(j.epoch, 1);
    assert!(j.committed > 20 && j.groups > 0 && j.bytes > 0, "{j:?}");
    let text = parts.stats_text();
    assert!(text.contains("journal: epoch 1, committed"), "{text}");
    let before = d.fs().namespace_digest();
    let big_ino = d.resolve("a/b/big").unwrap();
    d.crash();

    let d = rack.attach("vol", false, false).unwrap();
    assert!(!d.0.report.created);
    assert_same(&d.fs().namespace_digest(), &before);
    assert_eq!(
        d.resolve("a/b/big").unwrap(),
        big_ino,
        "inode numbers survive"
    );
    assert_eq!(d.read("a/b/big").unwrap(), bytes(99, 3 * MIB + 123));
    for i in 0..20u64 {
        assert_eq!(
            d.read(&format!("a/f{i}")).unwrap(),
            bytes(i, (i as usize * 7919) % 5000)
        );
    }
    assert_eq!(d.read("a/b/hard").unwrap(), d.read("a/f2").unwrap());
    // New inodes take new numbers (never one a stale handle may still name).
    d.write("new", b"x").unwrap();
    assert!(d.resolve("new").unwrap() > big_ino);
    // And a second crash after more changes, with a checkpoint of the first attach between.
    d.unlink("a/f3").unwrap();
    d.write("a/g4", b"rewritten").unwrap();
    d.sync().unwrap();
    let before = d.fs().namespace_digest();
    d.crash();
    let d = rack.attach("vol", false, false).unwrap();
    assert_same(&d.fs().namespace_digest(), &before);
    assert_eq!(d.resolve("a/f3"), Err(libc::ENOENT));
    assert_eq!(d.read("a/g4").unwrap(), b"rewritten");
}

#[test]
fn an_unknown_volume_fails_and_names_the_known_ones() {
    let rack = Rack::new(1);
    rack.attach("builds", true, false).unwrap().crash();
    let e = rack.attach("biulds", false, false).err().unwrap();
    assert!(e.contains("no volume 'biulds'"), "{e}");
    assert!(e.contains("builds"), "{e}");
    // And --create of an existing one is refused too (never an empty namespace over it).
    let e = rack.attach("builds", true, false).err().unwrap();
    assert!(e.contains("exists already"), "{e}");
}

#[test]
fn a_second_daemon_is_refused_and_a_takeover_fences_the_first() {
    let rack = Rack::new(2);
    let first = rack.attach("vol", true, false).unwrap();
    first.write("before", b"kept").unwrap();
    first.sync().unwrap();
    let e = rack.attach("vol", false, false).err().unwrap();
    assert!(e.contains("is held by test-host pid"), "{e}");
    assert!(e.contains("epoch 1"), "{e}");

    let second = rack.attach("vol", false, true).unwrap();
    assert!(second.0.report.epoch > 1);
    // The first daemon's data path and journal are cut: it can land nothing.
    let late = first.write("late", &bytes(5, 2 * MIB));
    let synced = first.sync();
    assert!(
        late.is_err() || synced.is_err(),
        "the fenced daemon's write and fsync both succeeded"
    );
    assert_eq!(synced, Err(libc::EIO));
    // It may not resume either: the server names the new holder.
    let pool = first.fs().data().pool().clone();
    assert_eq!(pool.try_reconnect(ServerId(0)), None);
    let why = pool.fenced().expect("fenced");
    assert!(why.contains("taken over"), "{why}");
    // Nothing it did after the grant is visible to the new holder.
    assert_eq!(second.read("before").unwrap(), b"kept");
    assert_eq!(second.resolve("late"), Err(libc::ENOENT));
    second.write("after", b"new holder").unwrap();
    second.sync().unwrap();
    drop(first);
    second.crash();
    let third = rack.attach("vol", false, false).unwrap();
    assert_eq!(third.read("after").unwrap(), b"new holder");
    assert_eq!(third.resolve("late"), Err(libc::ENOENT));
}

/// The fence closes the data path itself, not only the journal: a one-sided WRITE the fenced
/// daemon posts after the takeover (its queue pairs were connected before) lands nothing. (A
/// WRITE already admitted when the fence comes is cut or finished before the takeover goes on:
/// `a_fence_stops_a_write_already_admitted` in the TCP NIC's tests.)
#[test]
fn a_fenced_holder_lands_no_byte_through_its_old_queue_pairs() {
    let rack = Rack::new(2);
    let first = rack.attach("vol", true, false).unwrap();
    first.write("f", b"before the takeover").unwrap();
    first.sync().unwrap();
    let ino = first.resolve("f").unwrap();
    let regions: Vec<rmemfs::fabric::RemoteRegion> = first
        .fs()
        .files_by_ino()
        .into_iter()
        .filter(|(i, _)| *i == ino)
        .flat_map(|(_, f)| {
            let view = first.fs().data().view(&f);
            let c = view.get(&0).expect("one chunk").clone();
            c.replicas()
                .iter()
                .map(|r| rmemfs::fabric::RemoteRegion {
                    server: ServerId(r.server),
                    addr: r.addr,
                    len: c.len,
                    rkey: r.rkey,
                })
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(regions.len(), 2);
    let second = rack.attach("vol", false, true).unwrap();
    // Below the file system (which knows it is fenced): straight onto the old queue pairs.
    let late = first.fs().data().write_regions(&regions, 0, b"STALE");
    assert!(late.is_err(), "a fenced daemon's one-sided write completed");
    assert_eq!(second.read("f").unwrap(), b"before the takeover");
}

#[test]
fn removing_every_file_gives_the_memory_back_and_volume_rm_frees_the_rest() {
    let rack = Rack::new(2);
    let start = rack.free();
    let d = rack.attach("vol", true, false).unwrap();
    d.sync().unwrap();
    d.fs().data().settle_frees(Duration::from_secs(5));
    let empty = rack.free();
    populate(&d);
    d.sync().unwrap();
    assert!(rack.free().iter().sum::<u64>() < empty.iter().sum::<u64>());
    for i in 0..20 {
        d.unlink(&format!("a/f{i}")).unwrap();
    }
    d.unlink("a/b/big").unwrap();
    d.unlink("a/b/hard").unwrap();
    d.sync().unwrap();
    // One more commit lets the frees held for the last one go.
    d.write("x", b"").unwrap();
    d.unlink("x").unwrap();
    d.sync().unwrap();
    d.fs().data().settle_frees(Duration::from_secs(5));
    let stocked: u64 = (0..2)
        .map(|i| d.fs().data().pool().stocked_bytes(ServerId(i)))
        .sum();
    assert_eq!(
        rack.free().iter().sum::<u64>() + stocked,
        empty.iter().sum::<u64>(),
        "after rm -rf: the journal and checkpoint and stock are all that is held"
    );
    d.crash();
    // A crashed daemon's stock and everything else is the volume's until `volume rm`.
    assert!(rack.free().iter().sum::<u64>() < start.iter().sum::<u64>());
    let config = PoolConfig::default();
    let out = rmemfs::volume::admin::rm(&rack.addrs(), &config, "vol", None).unwrap();
    assert!(out.contains("removed volume 'vol'"), "{out}");
    assert_eq!(
        rack.free(),
        start,
        "volume rm frees every extent on every server"
    );
    let ls = rmemfs::volume::admin::ls(&rack.addrs(), &config).unwrap();
    assert!(ls.contains("no volumes"), "{ls}");
}

#[test]
fn attach_frees_what_no_record_names() {
    let rack = Rack::new(1);
    let d = rack.attach("vol", true, false).unwrap();
    d.write("f", &bytes(1, 100_000)).unwrap();
    d.sync().unwrap();
    // Allocations that never reached the journal (a crash between allocation and commit).
    let pool = d.fs().data().pool().clone();
    for _ in 0..5 {
        pool.alloc(64 << 10).unwrap();
    }
    d.crash();
    let d = rack.attach("vol", false, false).unwrap();
    assert!(
        d.0.report.collected >= 5,
        "collected {}",
        d.0.report.collected
    );
    assert_eq!(d.read("f").unwrap(), bytes(1, 100_000));
}

#[test]
fn a_server_restarted_while_no_daemon_runs_costs_no_fsynced_file() {
    let mut rack = Rack::new(2);
    let d = rack.attach("vol", true, false).unwrap();
    populate(&d);
    d.sync().unwrap();
    d.crash();
    rack.restart(1);
    let d = rack.attach("vol", false, false).unwrap();
    assert_eq!(d.0.report.restarted, 1);
    assert_eq!(d.read("a/b/big").unwrap(), bytes(99, 3 * MIB + 123));
    for i in 0..20u64 {
        assert_eq!(
            d.read(&format!("a/f{i}")).unwrap(),
            bytes(i, (i as usize * 7919) % 5000)
        );
    }
    // The restarted server holds the volume again (new chunks and the journal land there).
    d.write("new", &bytes(3, 2 * MIB)).unwrap();
    d.sync().unwrap();
    d.crash();
    let d = rack.attach("vol", false, false).unwrap();
    assert_eq!(d.read("new").unwrap(), bytes(3, 2 * MIB));
}

#[test]
fn a_clean_detach_keeps_everything() {
    let rack = Rack::new(1);
    let d = rack.attach("vol", true, false).unwrap();
    populate(&d);
    let before = d.fs().namespace_digest();
    d.0.journal.stop().unwrap();
    drop(d);
    let d = rack.attach("vol", false, false).unwrap();
    assert_same(&d.fs().namespace_digest(), &before);
}

#[test]
fn an_unlinked_file_keeps_its_memory_until_the_unlink_is_committed() {
    let rack = Rack::new(1);
    let d = rack.attach("vol", true, false).unwrap();
    d.write("f", &bytes(4, 3 * MIB)).unwrap();
    d.sync().unwrap();
    // The unlink is made but never committed: the daemon dies first.
    d.0.journal.hold_commits(true);
    d.unlink("f").unwrap();
    d.fs().data().settle_frees(Duration::from_secs(5));
    d.crash();
    let d = rack.attach("vol", false, false).unwrap();
    // The journal still names the file, so its memory must still hold its bytes (a free
    // sent before the commit would have zeroed it, or handed it to another file).
    assert_eq!(d.read("f").unwrap(), bytes(4, 3 * MIB));
}

#[test]
fn a_full_ring_is_checkpointed_and_the_replay_still_matches() {
    let rack = Rack::new(2);
    // 64 KiB rings: a few hundred records fill one; checkpoints copy 50 inodes per slice,
    // with operations going on between the slices.
    let ring = JournalOptions {
        ring_bytes: 64 << 10,
        checkpoint_slice: 50,
        ..Default::default()
    };
    let d = rack.attach_ring("vol", true, false, ring).unwrap();
    d.mkdir("d").unwrap();
    for i in 0..1500u64 {
        d.write(&format!("d/f{i}"), &bytes(i, (i % 7) as usize * 100))
            .unwrap();
        if i % 3 == 0 {
            d.unlink(&format!("d/f{i}")).unwrap();
        }
    }
    d.sync().unwrap();
    let before = d.fs().namespace_digest();
    d.crash();
    let d = rack.attach_ring("vol", false, false, ring).unwrap();
    assert!(d.0.report.inodes > 900, "{:?}", d.0.report);
    assert_same(&d.fs().namespace_digest(), &before);
    assert_eq!(d.read("d/f1000").unwrap(), bytes(1000, 600));
}

/// One operation of the crash model.
#[derive(Debug, Clone)]
enum Op {
    Write(u8, usize),
    Append(u8, usize),
    Mkdir(u8),
    Rename(u8, u8),
    Unlink(u8),
    Sync,
}

fn name(n: u8) -> String {
    format!("n{}", n % 6)
}

fn op_strategy() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        3 => (any::<u8>(), 0usize..300_000).prop_map(|(n, l)| Op::Write(n, l)),
        2 => (any::<u8>(), 1usize..5000).prop_map(|(n, l)| Op::Append(n, l)),
        1 => any::<u8>().prop_map(Op::Mkdir),
        2 => (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Op::Rename(a, b)),
        2 => any::<u8>().prop_map(Op::Unlink),
        1 => Just(Op::Sync),
    ]
}

/// Applies `op` (errors such as ENOENT are part of the model: the namespace is compared,
/// not the results), pushing the namespace after every file-system call onto `states`: each
/// call commits on its own, so a crash may land between two calls of one `op`. With
/// `held` (commits held back to make one group), a write truncates first: a write over
/// bytes a file holds waits for its file's overwrite mark to commit (`fs::overwrite`).
fn run(d: &Daemon, op: &Op, seed: u64, states: &mut Vec<rmemfs::meta::Digest>, held: bool) {
    let fs = d.fs();
    let mut mark = || states.push(fs.namespace_digest());
    let write = |ino: Ino, flags: i32, len: usize, mark: &mut dyn FnMut()| {
        if let Ok(fh) = fs.open(ino, flags) {
            mark();
            let _ = fs.write(ino, fh, 0, &bytes(seed, len), ME);
            mark();
            fs.release(fh);
            mark();
        }
    };
    match op {
        Op::Write(n, len) => match d.resolve(&name(*n)) {
            Ok(ino) if held => write(ino, libc::O_WRONLY | libc::O_TRUNC, *len, &mut mark),
            Ok(ino) => write(ino, libc::O_WRONLY, *len, &mut mark),
            Err(_) => {
                if let Ok((e, fh)) =
                    fs.create(ROOT_INO, name(*n).as_bytes(), 0o644, libc::O_WRONLY, ME)
                {
                    mark();
                    let _ = fs.write(e.ino, fh, 0, &bytes(seed, *len), ME);
                    mark();
                    fs.release(fh);
                    mark();
                }
            }
        },
        Op::Append(n, len) => {
            if let Ok(ino) = d.resolve(&name(*n)) {
                write(ino, libc::O_WRONLY | libc::O_APPEND, *len, &mut mark);
            }
        }
        Op::Mkdir(n) => {
            let _ = d.mkdir(&format!("dir{}", n % 3));
            mark();
        }
        Op::Rename(a, b) => {
            let _ = fs.rename(
                ROOT_INO,
                name(*a).as_bytes(),
                ROOT_INO,
                name(*b).as_bytes(),
                0,
                ME,
            );
            mark();
        }
        Op::Unlink(n) => {
            let _ = d.unlink(&name(*n));
            mark();
        }
        Op::Sync => d.sync().unwrap(),
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

    /// A crash between the journal copies' writes of one group (the first copy whole, the
    /// other torn at a random byte), with or without the first copy's server restarted
    /// before attach: the replayed namespace is the model's after some prefix of the
    /// operations that holds every fsynced one.
    #[test]
    fn a_crash_between_the_journal_copies_replays_to_a_prefix_holding_every_fsync(
        ops in proptest::collection::vec(op_strategy(), 1..24),
        last in proptest::collection::vec(op_strategy(), 1..8),
        tear in 0usize..4000,
        lose_first in proptest::bool::ANY,
    ) {
        let mut rack = Rack::new(2);
        let d = rack.attach("model", true, false).unwrap();
        let mut states = vec![d.fs().namespace_digest()];
        let mut fsynced = 0;
        for (i, op) in ops.iter().enumerate() {
            run(&d, op, i as u64, &mut states, false);
            if matches!(op, Op::Sync) {
                fsynced = states.len() - 1;
            }
        }
        // Everything so far is committed; the last operations form one group, torn.
        d.sync().unwrap();
        fsynced = fsynced.max(states.len() - 1);
        d.0.journal.hold_commits(true);
        for (i, op) in last.iter().filter(|o| !matches!(o, Op::Sync)).enumerate() {
            run(&d, op, 1000 + i as u64, &mut states, true);
        }
        d.0.journal.tear_next_group(tear);
        d.0.journal.hold_commits(false);
        let _ = d.sync();
        d.crash();
        if lose_first {
            rack.restart(0);
        }
        let d = rack.attach("model", false, false).unwrap();
        let got = d.fs().namespace_digest();
        let strip = |dg: &rmemfs::meta::Digest| -> Vec<(u64, String)> {
            // Chunk copies on a restarted server are forgotten at attach: compare what the
            // namespace says, and the surviving copies' contents by reading below.
            dg.iter().map(|(k, v)| (*k, v.0.clone())).collect()
        };
        let found = states[fsynced..].iter().position(|s| {
            if lose_first { strip(s) == strip(&got) } else { *s == got }
        });
        proptest::prop_assert!(
            found.is_some(),
            "the replayed namespace is none of the {} states from the last fsync on",
            states.len() - fsynced
        );
    }
}

#[test]
fn a_server_gone_for_good_needs_force_without_and_costs_only_its_copies() {
    let mut rack = Rack::new(3);
    let d = rack.attach("vol", true, false).unwrap();
    populate(&d);
    d.sync().unwrap();
    d.crash();
    rack.nodes[2].kill();
    rack.servers[2].shutdown();
    let e = rack.attach_without("vol", &[2], false).err().unwrap();
    assert!(e.contains("--force-without"), "{e}");
    let d = rack.attach_without("vol", &[2], true).unwrap();
    assert_eq!(d.0.report.without, 1);
    // Two copies of every chunk on three servers: each chunk kept one at least.
    assert_eq!(d.read("a/b/big").unwrap(), bytes(99, 3 * MIB + 123));
    for i in 0..20u64 {
        assert_eq!(
            d.read(&format!("a/f{i}")).unwrap(),
            bytes(i, (i as usize * 7919) % 5000)
        );
    }
}

#[test]
fn a_silent_holder_is_replaced_after_the_lease_and_fenced() {
    // The holder here sends nothing (no heartbeats run in this test): silent, as a frozen
    // (SIGSTOP) daemon is to its servers.
    let rack = Rack::with_lease(2, Duration::from_millis(300));
    let first = rack.attach("vol", true, false).unwrap();
    first.write("kept", b"before the freeze").unwrap();
    first.sync().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let second = loop {
        match rack.attach("vol", false, false) {
            Ok(d) => break d,
            Err(e) if e.contains("is held by") => {
                assert!(std::time::Instant::now() < deadline, "never replaced: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("{e}"),
        }
    };
    // The first daemon wakes up: everything it does fails, and nothing of it is seen.
    let late = first.write("late", &bytes(1, 2 * MIB));
    assert!(late.is_err() || first.sync().is_err());
    assert_eq!(second.read("kept").unwrap(), b"before the freeze");
    assert_eq!(second.resolve("late"), Err(libc::ENOENT));
}

/// Every path under the root: its attributes and xattrs (the digest's first half, which
/// names no server address) and, for a file, its bytes.
fn tree(d: &Daemon) -> BTreeMap<String, (String, Vec<u8>)> {
    // Files are read first: a read may move an access time, which the digest then shows.
    let mut found = Vec::new();
    let mut stack = vec![(String::new(), ROOT_INO)];
    while let Some((path, ino)) = stack.pop() {
        let fh = match d.fs().opendir(ino) {
            Ok(fh) => fh,
            Err(_) => {
                let bytes = d.read(&path).unwrap_or_default();
                found.push((path, ino, bytes));
                continue;
            }
        };
        let mut names = Vec::new();
        d.fs()
            .readdir(ino, fh, 0, &mut |e| {
                names.push((String::from_utf8(e.name).unwrap(), e.ino));
                true
            })
            .unwrap();
        d.fs().releasedir(fh);
        for (n, child) in names {
            if n != "." && n != ".." {
                stack.push((
                    format!("{path}/{n}").trim_start_matches('/').to_string(),
                    child,
                ));
            }
        }
        found.push((path, ino, Vec::new()));
    }
    let digest = d.fs().namespace_digest();
    found
        .into_iter()
        .map(|(path, ino, bytes)| {
            let (attrs, contents) = digest[&ino].clone();
            // Without the access time: reading a file within the clock tick of its last
            // write leaves atime == mtime, so the next read (here, after the import) moves it.
            let attrs = match (attrs.find("atime: "), attrs.find("mtime: ")) {
                (Some(a), Some(m)) => format!("{}{}", &attrs[..a], &attrs[m..]),
                _ => attrs,
            };
            // A file's bytes; for the rest the digest's contents (entries with cookies,
            // targets, xattrs), which name no chunk address.
            let bytes = if attrs.starts_with("File") {
                bytes
            } else {
                contents.into_bytes()
            };
            (path, (attrs, bytes))
        })
        .collect()
}

fn same_tree(
    got: &BTreeMap<String, (String, Vec<u8>)>,
    want: &BTreeMap<String, (String, Vec<u8>)>,
) {
    for (path, (attrs, bytes)) in want {
        let Some((a, b)) = got.get(path) else {
            panic!("{path:?} is missing");
        };
        assert_eq!(a, attrs, "{path:?}: attributes");
        assert!(
            b == bytes,
            "{path:?}: contents differ: {:?} / {:?}",
            String::from_utf8_lossy(&b[..b.len().min(400)]),
            String::from_utf8_lossy(&bytes[..bytes.len().min(400)])
        );
    }
    assert_eq!(got.len(), want.len(), "paths only after the import");
}

#[test]
fn an_export_imported_on_empty_servers_is_the_same_tree() {
    let path = std::env::temp_dir().join(format!("rmemfs-export-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    let dir = rmemfs::volume::store::DirStore(path.clone());
    let rack = Rack::new(2);
    let d = rack.attach("vol", true, false).unwrap();
    populate(&d);
    // A file with a hole of two chunks before its data.
    d.write("holes", b"").unwrap();
    let ino = d.resolve("holes").unwrap();
    let fh = d.fs().open(ino, libc::O_WRONLY).unwrap();
    d.fs()
        .write(ino, fh, 3 * MIB as u64, &bytes(8, 1000), ME)
        .unwrap();
    d.fs().release(fh);
    d.sync().unwrap();
    let want = tree(&d);
    let first = rmemfs::volume::transfer::export(d.fs(), "vol", &dir).unwrap();
    assert!(first.chunks_copied > 0 && first.chunks == first.chunks_copied);
    let again = rmemfs::volume::transfer::export(d.fs(), "vol", &dir).unwrap();
    assert_eq!(
        again.chunks_copied, 0,
        "a second export copies only what changed"
    );
    d.crash();
    drop(rack);

    // Every server stopped, started empty: the import is the same tree, holes and all.
    let rack = Rack::new(2);
    let d = rack.import("back", &dir).unwrap();
    same_tree(&tree(&d), &want);
    assert_eq!(d.read("holes").unwrap()[..3 * MIB], vec![0u8; 3 * MIB][..]);
    // And it is a volume like any other: it survives its daemon.
    d.sync().unwrap();
    d.crash();
    let d = rack.attach("back", false, false).unwrap();
    same_tree(&tree(&d), &want);
    d.crash();

    // A damaged chunk is refused by hash; an export without its manifest is no export.
    let chunks = path.join("chunks");
    let sub = std::fs::read_dir(&chunks)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let one = std::fs::read_dir(&sub)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut bad = std::fs::read(&one).unwrap();
    bad[0] ^= 1;
    std::fs::write(&one, &bad).unwrap();
    let e = rack.import("bad", &dir).err().unwrap();
    assert!(e.contains("is damaged"), "{e}");
    std::fs::remove_file(path.join("manifest.json")).unwrap();
    let e = rack.import("partial", &dir).err().unwrap();
    assert!(e.contains("no complete export"), "{e}");
    let _ = std::fs::remove_dir_all(&path);
}

/// The same through object storage (an in-memory bucket, under a prefix): keys, a second
/// export that copies nothing, a damaged object and a missing manifest refused.
#[test]
fn an_export_to_object_storage_round_trips() {
    use object_store::ObjectStore;
    let bucket = std::sync::Arc::new(object_store::memory::InMemory::new());
    let store =
        rmemfs::volume::store::ObjectExport::over(bucket.clone(), "mem://bucket", "exports/vol")
            .unwrap();
    let rack = Rack::new(2);
    let d = rack.attach("vol", true, false).unwrap();
    populate(&d);
    d.sync().unwrap();
    let want = tree(&d);
    let first = rmemfs::volume::transfer::export(d.fs(), "vol", &store).unwrap();
    assert!(first.chunks_copied > 0);
    let again = rmemfs::volume::transfer::export(d.fs(), "vol", &store).unwrap();
    assert_eq!(
        again.chunks_copied, 0,
        "a second export copies only what changed"
    );
    d.crash();
    drop(rack);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let keys: Vec<String> = rt.block_on(async {
        use futures::TryStreamExt;
        bucket
            .list(None)
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .unwrap()
    });
    assert!(
        keys.contains(&"exports/vol/manifest.json".to_string()),
        "{keys:?}"
    );
    assert!(
        keys.iter().all(|k| k.starts_with("exports/vol/")),
        "{keys:?}"
    );

    let rack = Rack::new(2);
    let d = rack.import("back", &store).unwrap();
    same_tree(&tree(&d), &want);
    d.crash();
    let chunk = keys.iter().find(|k| k.contains("/chunks/")).unwrap();
    let path = object_store::path::Path::from(chunk.as_str());
    let mut bad = rt
        .block_on(async { bucket.get(&path).await.unwrap().bytes().await.unwrap() })
        .to_vec();
    bad[0] ^= 1;
    rt.block_on(bucket.put(&path, bad.into())).unwrap();
    let e = rack.import("bad", &store).err().unwrap();
    assert!(e.contains("is damaged"), "{e}");
    let manifest = object_store::path::Path::from("exports/vol/manifest.json");
    rt.block_on(bucket.delete(&manifest)).unwrap();
    let e = rack.import("partial", &store).err().unwrap();
    assert!(e.contains("no complete export"), "{e}");
}

#[test]
fn a_lost_journal_copy_is_dropped_then_made_whole_at_the_next_checkpoint() {
    let mut rack = Rack::new(2);
    let ring = JournalOptions {
        ring_bytes: 64 << 10,
        checkpoint_slice: 50,
        ..Default::default()
    };
    let d = rack.attach_ring("vol", true, false, ring).unwrap();
    d.write("before", b"two copies").unwrap();
    d.sync().unwrap();
    let copies = |addrs: &[std::net::SocketAddr]| {
        let st = rmemfs::volume::admin::status(addrs, &PoolConfig::default(), "vol").unwrap();
        st.lines()
            .find_map(|l| {
                l.split("journal ring: ")
                    .nth(1)
                    .and_then(|r| r.split(", ").nth(1))
                    .map(|c| c.trim_end_matches(" copies").to_string())
            })
            .unwrap()
    };
    assert_eq!(copies(&rack.addrs()), "2");
    // Server 1 dies: the next commit drops its copy from the root before it counts.
    rack.nodes[1].kill();
    rack.servers[1].shutdown();
    d.write("during", b"one copy").unwrap();
    d.sync().unwrap();
    // Read while server 1 is still down: once it is admitted again, the journal's next
    // commit (the forgotten copies' records) may heal the ring at any moment.
    assert_eq!(copies(&rack.addrs()[..1]), "1");
    // It comes back empty and is taken in again, as the upkeep threads do.
    rack.restart(1);
    let pool = d.fs().data().pool().clone();
    assert_eq!(
        pool.try_reconnect(ServerId(1)),
        Some(rmemfs::client::Rejoin::Empty)
    );
    rmemfs::upkeep::rebuild::forget_server(d.fs(), ServerId(1));
    pool.admit(ServerId(1));
    // Enough records to fill the small ring: its checkpoint puts a copy on server 1 again.
    for i in 0..600 {
        d.write(&format!("f{i}"), b"x").unwrap();
    }
    d.sync().unwrap();
    assert_eq!(copies(&rack.addrs()), "2");
    assert_eq!(d.read("during").unwrap(), b"one copy");
}

/// Syncs, or fails naming why the journal refused.
fn sync_or_say(d: &Daemon) {
    if let Err(e) = d.fs().sync().expect("a volume mount has a barrier") {
        panic!("sync: {e}");
    }
}

/// Fills the pool: 1 MiB files until ENOSPC, then smaller ones, so that no page is left for
/// anything but what the volume set aside. Returns the files written.
fn fill_pool(d: &Daemon, dir: &str) -> Vec<String> {
    let mut names = Vec::new();
    for size in [MIB, 64 << 10, 4 << 10] {
        loop {
            let name = format!("{dir}/fill{}", names.len());
            match d.write(&name, &bytes(names.len() as u64, size)) {
                Ok(()) => names.push(name),
                Err(libc::ENOSPC) => {
                    let _ = d.unlink(&name);
                    break;
                }
                Err(e) => panic!("filling {name}: errno {e}"),
            }
        }
    }
    names
}

#[test]
fn a_full_pool_answers_enospc_for_growth_and_still_frees_and_reattaches() {
    let rack = Rack::new(2);
    // 64 KiB rings wrap every few hundred records: a full pool sees many wraps below.
    let ring = JournalOptions {
        ring_bytes: 64 << 10,
        ..Default::default()
    };
    let d = rack.attach_ring("vol", true, false, ring).unwrap();
    d.mkdir("fill").unwrap();
    d.mkdir("churn").unwrap();
    let filled = fill_pool(&d, "fill");
    assert!(filled.len() > 100, "filled {} files", filled.len());
    sync_or_say(&d);
    // Empty files made and removed on the full pool: each is ENOSPC or success, never an
    // error of the journal, across many wraps of the ring.
    let mut made = 0;
    for i in 0..3000u64 {
        let name = format!("churn/e{i}");
        match d.write(&name, b"") {
            Ok(()) => {
                made += 1;
                assert_eq!(d.unlink(&name), Ok(()), "removing {name}");
            }
            Err(libc::ENOSPC) => {}
            Err(e) => panic!("creating {name} on a full pool: errno {e}"),
        }
    }
    assert!(made > 0, "no empty file could be made on the full pool");
    // Freeing works: the first half of the fill goes, and its room is usable again.
    for name in &filled[..filled.len() / 2] {
        assert_eq!(d.unlink(name), Ok(()), "removing {name}");
    }
    sync_or_say(&d);
    d.fs().data().settle_frees(Duration::from_secs(5));
    for (i, name) in filled.iter().enumerate().skip(filled.len() / 2) {
        let got = d
            .read(name)
            .unwrap_or_else(|e| panic!("{name} before the crash: errno {e}"));
        assert_eq!(got, bytes(i as u64, got.len()), "{name} before the crash");
    }
    d.write("after-rm", &bytes(7, MIB)).unwrap();
    sync_or_say(&d);
    let before = d.fs().namespace_digest();
    d.crash();
    // Attach again on a pool that is still nearly full (the other half of the fill).
    let d = rack.attach_ring("vol", false, false, ring).unwrap();
    assert_same(&d.fs().namespace_digest(), &before);
    assert_eq!(d.read("after-rm").unwrap(), bytes(7, MIB));
    for (i, name) in filled.iter().enumerate().skip(filled.len() / 2) {
        let got = d
            .read(name)
            .unwrap_or_else(|e| panic!("{name} after attach: errno {e}"));
        assert_eq!(got, bytes(i as u64, got.len()), "{name} after attach");
    }
    let last = filled.last().unwrap();
    assert_eq!(d.read(last).unwrap().len(), 4 << 10);
    // Fill it to the brim again, crash, and attach once more.
    d.mkdir("fill2").unwrap();
    assert!(!fill_pool(&d, "fill2").is_empty());
    sync_or_say(&d);
    let before = d.fs().namespace_digest();
    d.crash();
    let d = rack.attach_ring("vol", false, false, ring).unwrap();
    assert_same(&d.fs().namespace_digest(), &before);
    d.write("churn/last", b"x")
        .unwrap_or_else(|e| assert_eq!(e, libc::ENOSPC));
    d.unlink(last).unwrap();
    sync_or_say(&d);
}

/// The frees a commit lets go are sent before the commit's waiters learn of it: with the
/// committer stopped right after it woke them, an unlinked file's memory still comes back.
/// (With the frees sent after the wake, an `rm`, `fsync` and write found ENOSPC on a full
/// pool: `a_full_pool_answers_enospc_for_growth_and_still_frees_and_reattaches` on CI.)
#[test]
fn a_commit_sends_its_frees_before_its_waiters_learn_of_it() {
    let rack = Rack::new(2);
    let d = rack.attach("vol", true, false).unwrap();
    d.write("f", &bytes(1, MIB)).unwrap();
    sync_or_say(&d);
    let written = rack.free();
    let before = d.0.journal.committed();
    d.0.journal.stop_after_next_commit();
    d.unlink("f").unwrap();
    common::eventually("the unlink is committed", || {
        d.0.journal.committed() > before
    });
    common::eventually("the unlinked file's memory is back", || {
        let free = rack.free();
        free.iter()
            .zip(&written)
            .all(|(now, then)| *now >= then + MIB as u64)
    });
    d.0.journal.go_on();
}

/// A file unlinked while the kernel still knows it (its inode stays until FORGET) gives its
/// memory back: the chunks must leave the journal before that memory goes, or a replay names
/// memory another file holds by then, and attach hands the new file's bytes to the orphan
/// (and frees them with it).
#[test]
fn memory_an_unlinked_file_gave_back_is_never_named_after_a_replay() {
    let rack = Rack::new(2);
    let d = rack.attach("vol", true, false).unwrap();
    d.mkdir("fill").unwrap();
    let filled = fill_pool(&d, "fill");
    // Our files are never forgotten by a kernel: each unlinked one stays an orphan. The
    // only 1 MiB free after this is the one it held, on each server.
    assert_eq!(d.unlink(&filled[0]), Ok(()));
    sync_or_say(&d);
    d.fs().data().settle_frees(Duration::from_secs(5));
    d.write("new", &bytes(7, MIB)).unwrap();
    sync_or_say(&d);
    d.crash();
    let d = rack.attach("vol", false, false).unwrap();
    assert_eq!(d.read("new").unwrap(), bytes(7, MIB));
    assert_eq!(d.read(&filled[1]).unwrap(), bytes(1, MIB));
}

/// A fenced holder that reaches a server which forgot the volume (it restarted) before any
/// server that remembers the fence takes it back: nothing there says no. It lets go of it the
/// moment another server says it is fenced, so the volume's holder gets it back; and the roots
/// it wrote there meanwhile, at its old epoch and any generation, never win an attach.
#[test]
fn a_fenced_holder_lets_go_of_a_server_that_forgot_it_and_its_roots_never_win() {
    let mut rack = Rack::new(3);
    let first = rack.attach("vol", true, false).unwrap();
    first.write("before", b"kept").unwrap();
    first.sync().unwrap();
    let second = rack.attach("vol", false, true).unwrap();
    second.write("after", b"new holder").unwrap();
    second.sync().unwrap();
    rack.restart(2);

    let old = first.fs().data().pool().clone();
    for i in 0..3 {
        old.cut(ServerId(i));
    }
    assert_eq!(old.try_reconnect(ServerId(2)), Some(Rejoin::Empty));
    rmemfs::upkeep::rebuild::forget_server(first.fs(), ServerId(2));
    old.admit(ServerId(2));
    // Its journal publishes there (a dropped ring copy, a checkpoint): a root far ahead in
    // generation, at its own epoch.
    let newest = second
        .fs()
        .data()
        .pool()
        .claims()
        .iter()
        .filter_map(|c| rmemfs::volume::root::Root::decode(&c.root).ok().flatten())
        .max_by_key(|r| r.order())
        .expect("a root");
    let stale = rmemfs::volume::root::Root {
        generation: newest.generation + 1000,
        epoch: old.epoch(),
        ..newest
    };
    assert_eq!(old.set_root(&stale.encode()).unwrap(), 1);
    // A server that remembers says it is fenced: it lets go of every server.
    assert_eq!(old.try_reconnect(ServerId(0)), None);
    assert!(old.fenced().is_some());
    assert!(
        !old.is_live(ServerId(2)),
        "a fenced daemon kept its link to a server, which holds the volume for it"
    );

    let pool = second.fs().data().pool().clone();
    pool.cut(ServerId(2));
    common::eventually("the volume's holder gets the restarted server back", || {
        pool.try_reconnect(ServerId(2)) == Some(Rejoin::Empty)
    });
    rmemfs::upkeep::rebuild::forget_server(second.fs(), ServerId(2));
    pool.admit(ServerId(2));
    assert!(pool.is_live(ServerId(2)));
    drop(first);
    second.crash();
    let third = rack.attach("vol", false, false).unwrap();
    assert_eq!(third.read("after").unwrap(), b"new holder");
    assert_eq!(third.read("before").unwrap(), b"kept");
}

/// Whether every copy of chunk `idx` of `ino` holds the same bytes; panics naming the
/// servers otherwise.
fn assert_copies_agree(t: &common::TestFs, ino: Ino, idx: u64) {
    let copies = t.fs.copies_of(ino, idx).unwrap();
    assert!(copies.len() >= 2, "chunk {idx} has {} copies", copies.len());
    for (server, bytes) in &copies[1..] {
        assert!(
            *bytes == copies[0].1,
            "chunk {idx}: the copy on server {server} differs from the one on server {}",
            copies[0].0
        );
    }
}

#[test]
fn copies_a_crash_cut_mid_overwrite_agree_after_attach_and_reads_never_flip() {
    use rmemfs::data::WritePath;
    let mut t = common::TestFs::volume(2, 32 << 20, MIB as u64, WritePath::Frrwp, "torn");
    let old = bytes(1, 2 * MIB);
    for name in ["db", "closed", "fresh"] {
        t.create(name).unwrap();
        t.write_file(name, 0, &old).unwrap();
    }
    t.fs.sync().expect("a volume syncs").unwrap();

    // "closed": changed in place and closed (its mark goes with its last writer).
    t.write_file("closed", 4096, &bytes(2, 8192)).unwrap();
    // "fresh": a new file still open, only ever appended to (never marked).
    let fresh = t.resolve("fresh").unwrap();
    let fresh_fh = t.fs.open(fresh, libc::O_WRONLY).unwrap();
    t.fs.write(fresh, fresh_fh, old.len() as u64, &bytes(3, 4096), ME)
        .unwrap();
    // "db": changed in place while open, then a write the crash cut after one copy of
    // chunk 1 (it reached the second server in that chunk's order and not the first).
    let db = t.resolve("db").unwrap();
    let fh = t.fs.open(db, libc::O_WRONLY).unwrap();
    t.fs.write(db, fh, 100, &bytes(4, 4096), ME).unwrap();
    let second = t.fs.copies_of(db, 1).unwrap()[1].0;
    t.fs.write_one_copy(db, 1, second, 5000, &bytes(5, 4096))
        .unwrap();
    assert!(
        t.fs.copies_of(db, 1).unwrap()[0].1 != t.fs.copies_of(db, 1).unwrap()[1].1,
        "the cut write left the copies disagreeing"
    );

    let report = t.crash_and_reattach();
    let db = t.resolve("db").unwrap();
    assert_copies_agree(&t, db, 0);
    assert_copies_agree(&t, db, 1);
    assert_eq!(report.reconciled, 1, "only db was marked: {report:?}");
    // What a read returns now, it returns with either server gone.
    let seen = t.read_file("db").unwrap();
    assert_eq!(seen.len(), old.len());
    assert!(
        seen[100..4196] == bytes(4, 4096)[..],
        "the write before the cut"
    );
    let first = t.fs.copies_of(db, 1).unwrap()[0].0;
    t.kill_server(first as usize);
    assert!(t.read_file("db").unwrap() == seen, "a read flipped");
}

/// A crash mid-append leaves bytes past the committed size, on some copies only: a later
/// extension (a truncate up, a write past a gap) must show zeros there, from either copy.
#[test]
fn bytes_a_crash_cut_mid_append_never_show_when_the_file_grows() {
    use rmemfs::data::WritePath;
    let mut t = common::TestFs::volume(2, 32 << 20, MIB as u64, WritePath::Frrwp, "tail");
    let half = MIB + MIB / 2;
    for name in ["up", "gap"] {
        t.create(name).unwrap();
        t.write_file(name, 0, &bytes(1, half)).unwrap();
    }
    t.fs.sync().expect("a volume syncs").unwrap();
    // The appends the crash cut: on the copy of chunk 1 on server 1 only, past the committed
    // size (server 0 is killed at the end, so that copy serves the last reads).
    for name in ["up", "gap"] {
        let ino = t.resolve(name).unwrap();
        t.fs.write_one_copy(ino, 1, 1, (MIB / 2) as u64, &bytes(7, 8192))
            .unwrap();
    }
    t.crash_and_reattach();

    let up = t.resolve("up").unwrap();
    let grow = rmemfs::fs::SetAttr {
        size: Some(2 * MIB as u64),
        ..Default::default()
    };
    t.fs.setattr(up, &grow, ME).unwrap();
    let gap = t.resolve("gap").unwrap();
    let fh = t.fs.open(gap, libc::O_WRONLY).unwrap();
    t.fs.write(gap, fh, (half + 16384) as u64, &bytes(8, 100), ME)
        .unwrap();
    t.fs.release(fh);
    let want_up = [bytes(1, half), vec![0; MIB / 2]].concat();
    let want_gap = [bytes(1, half), vec![0; 16384], bytes(8, 100)].concat();
    assert!(
        t.read_file("up").unwrap() == want_up,
        "a truncate up showed the cut append"
    );
    assert!(
        t.read_file("gap").unwrap() == want_gap,
        "a write past a gap showed the cut append"
    );
    // The copy that held the cut bytes alone serves the reads now.
    t.kill_server(0);
    assert!(
        t.read_file("up").unwrap() == want_up,
        "the other copy shows the cut append"
    );
    assert!(
        t.read_file("gap").unwrap() == want_gap,
        "the other copy shows the cut append"
    );
}

#[test]
fn a_write_right_after_an_rm_on_a_full_volume_finds_the_room_the_rm_made() {
    let rack = Rack::new(2);
    let d = rack.attach("vol", true, false).unwrap();
    d.mkdir("fill").unwrap();
    let filled = fill_pool(&d, "fill");
    assert!(filled.len() > 10, "filled {} files", filled.len());
    // The first files of the fill are of 1 MiB. Their memory goes back once the unlink's
    // record is committed (every few ms): the write right after waits for it, and does not
    // answer ENOSPC.
    for (round, name) in filled.iter().take(5).enumerate() {
        d.unlink(name).unwrap();
        let after = format!("after{round}");
        d.write(&after, &bytes(round as u64, MIB))
            .unwrap_or_else(|e| panic!("writing {after} right after removing {name}: errno {e}"));
    }
    for round in 0..5 {
        assert_eq!(d.read(&format!("after{round}")).unwrap(), bytes(round, MIB));
    }
}
