//! Erasure-coded chunks (`--redundancy ec:K+M`) over in-process servers: cold chunks become
//! stripes holding (K+M)/K of the data, read back whole; with M servers gone they decode;
//! a write to a stripe makes it copies first (never a stripe written in place); the rebuild
//! brings a stripe short of a fragment back to full strength.

mod common;

use common::{bytes, TestFs};
use rmemfs::meta::Coding;
use rmemfs::upkeep::encode::{self, EncodeStats};
use rmemfs::upkeep::figures::RebuildStats;
use rmemfs::upkeep::rebuild::{self, Stop};

const MIB: usize = 1 << 20;

fn code(s: &str) -> Coding {
    s.parse().unwrap()
}

/// One encoder pass; the chunks it left as copies.
fn encode_all(t: &TestFs) -> u64 {
    encode::pass(&t.fs, &Stop::default(), &EncodeStats::default())
}

/// Chunks held as stripes.
fn stripes(t: &TestFs) -> u64 {
    t.fs.replica_health().encoded
}

#[test]
fn cold_chunks_become_stripes_that_read_back_and_hold_half_of_three_copies() {
    let t = TestFs::encoded(6, 32 << 20, code("4+2"));
    // Five whole chunks and a 256 KiB tail (encoded too: it is longer than EC_MIN_CHUNK).
    let data = bytes(1, 5 * MIB + 256 * 1024);
    t.create("big").unwrap();
    t.write_file("big", 0, &data).unwrap();
    let copied = t.remote_used();
    // Chunks after the first are allocated whole: six chunks of 1 MiB.
    assert_eq!(copied, 3 * 6 * MIB as u64, "three copies while hot");
    assert_eq!(stripes(&t), 0, "nothing is encoded before the encoder runs");
    assert_eq!(encode_all(&t), 0, "every chunk of the big file was encoded");
    assert_eq!(stripes(&t), 6);
    t.fs.data().settle_frees(std::time::Duration::from_secs(5));
    // Three copies held 3x the chunks; their stripes hold 1.5x.
    assert_eq!(t.remote_used(), copied / 2);
    // A small file keeps its copies.
    t.create("small").unwrap();
    t.write_file("small", 0, &bytes(2, 8192)).unwrap();
    assert_eq!(encode_all(&t), 0);
    assert_eq!(stripes(&t), 6);
    // Each stripe spans six servers.
    let places = t.placement_addrs("big");
    assert!(places.iter().all(|p| p.len() == 6), "{places:?}");
    assert_eq!(t.read_file("big").unwrap(), data);
    assert_eq!(t.read_file("small").unwrap(), bytes(2, 8192));
    // Unaligned reads across fragment and chunk boundaries.
    let ino = t.resolve("big").unwrap();
    let fh = t.fs.open(ino, libc::O_RDONLY).unwrap();
    for (off, len) in [
        (262_000u64, 5000u32),
        (MIB as u64 - 10, 20),
        (3_333_333, 1 << 20),
    ] {
        let got = t.fs.read(ino, fh, off, len).unwrap();
        let end = (off as usize + len as usize).min(data.len());
        assert_eq!(got, &data[off as usize..end], "read of {len} at {off}");
    }
    t.fs.release(fh);
}

#[test]
fn with_m_servers_lost_every_stripe_still_reads_back() {
    for (servers, c) in [(6, "4+2"), (3, "2+1"), (11, "8+3")] {
        let mut t = TestFs::encoded(servers, 32 << 20, code(c));
        let data = bytes(3, 3 * MIB + 12345);
        t.create("f").unwrap();
        t.write_file("f", 0, &data).unwrap();
        assert_eq!(encode_all(&t), 0);
        assert_eq!(stripes(&t), 4, "{c}");
        let m = code(c).m as usize;
        for i in 0..m {
            t.kill_server(i);
        }
        assert_eq!(t.read_file("f").unwrap(), data, "{c} with {m} servers gone");
    }
}

#[test]
fn a_degraded_read_decodes_from_what_it_read_and_reads_each_byte_once() {
    let mut t = TestFs::encoded(6, 32 << 20, code("4+2"));
    let data = bytes(9, 4 * MIB);
    t.create("f").unwrap();
    t.write_file("f", 0, &data).unwrap();
    assert_eq!(encode_all(&t), 0);
    t.kill_server(0);
    let ino = t.resolve("f").unwrap();
    let fh = t.fs.open(ino, libc::O_RDONLY).unwrap();
    // Whole chunks: the other data fragments come from the read's own buffer, so only the
    // shards it lacks are read (a chunk's bytes, not K more fragments on top).
    let fabric = t.fs.data().pool().fabric();
    let before = fabric.counters().bytes_read;
    for i in 0..4 {
        let got = t.fs.read(ino, fh, (i * MIB) as u64, MIB as u32).unwrap();
        assert!(got == data[i * MIB..(i + 1) * MIB], "chunk {i}");
    }
    let read = fabric.counters().bytes_read - before;
    assert_eq!(
        read,
        4 * MIB as u64,
        "a degraded sequential read reads each chunk's bytes once"
    );
    // Parts of a lost fragment without its neighbours in the read: decoded from reads of
    // K others, across fragment and chunk edges.
    for (off, len) in [
        (0u64, 4096u32),
        (100, 70_000),
        (262_100, 4000),
        (MIB as u64 - 300_000, 600_000),
        (3 * MIB as u64 + 5, 1 << 20),
    ] {
        let got = t.fs.read(ino, fh, off, len).unwrap();
        let end = (off as usize + len as usize).min(data.len());
        assert!(got == data[off as usize..end], "read of {len} at {off}");
    }
    t.fs.release(fh);
}

#[test]
fn one_server_more_than_m_lost_is_eio_not_wrong_bytes() {
    let mut t = TestFs::encoded(3, 32 << 20, code("2+1"));
    t.create("f").unwrap();
    t.write_file("f", 0, &bytes(4, 2 * MIB)).unwrap();
    assert_eq!(encode_all(&t), 0);
    t.kill_server(0);
    t.kill_server(1);
    assert_eq!(t.read_file("f"), Err(libc::EIO));
}

#[test]
fn a_write_to_a_stripe_makes_its_chunk_copies_again_and_the_rest_stays_encoded() {
    let t = TestFs::encoded(6, 32 << 20, code("4+2"));
    let mut data = bytes(5, 4 * MIB);
    t.create("f").unwrap();
    t.write_file("f", 0, &data).unwrap();
    assert_eq!(encode_all(&t), 0);
    assert_eq!(stripes(&t), 4);
    let patch = bytes(6, 4096);
    t.write_file("f", MIB as u64 + 1000, &patch).unwrap();
    data[MIB + 1000..MIB + 1000 + 4096].copy_from_slice(&patch);
    assert_eq!(stripes(&t), 3, "only the chunk written to left its stripe");
    let places = t.placement_addrs("f");
    assert_eq!(places[1].len(), 3, "the chunk written to has M+1 copies");
    assert_eq!(t.read_file("f").unwrap(), data);
    // A truncate into a stripe, then growing again: the cut bytes read as zeros.
    let ino = t.resolve("f").unwrap();
    t.fs.setattr(
        ino,
        &rmemfs::fs::SetAttr {
            size: Some(2 * MIB as u64 + 100),
            ..Default::default()
        },
        common::ME,
    )
    .unwrap();
    t.fs.setattr(
        ino,
        &rmemfs::fs::SetAttr {
            size: Some(3 * MIB as u64),
            ..Default::default()
        },
        common::ME,
    )
    .unwrap();
    data.truncate(2 * MIB + 100);
    data.resize(3 * MIB, 0);
    assert_eq!(t.read_file("f").unwrap(), data);
    // Cold again, all of it is encoded again.
    assert_eq!(encode_all(&t), 0);
    assert_eq!(t.read_file("f").unwrap(), data);
}

#[test]
fn a_stripe_short_of_a_fragment_is_rebuilt_and_encoded_again() {
    let mut t = TestFs::encoded(7, 32 << 20, code("4+2"));
    let data = bytes(7, 3 * MIB);
    t.create("f").unwrap();
    t.write_file("f", 0, &data).unwrap();
    assert_eq!(encode_all(&t), 0);
    let holders = t.placement_addrs("f");
    let victim = t
        .servers
        .iter()
        .position(|s| holders[0].contains(&s.local_addr().to_string()))
        .unwrap();
    t.kill_server(victim);
    t.fs.data().pool().refresh();
    let health = t.fs.replica_health();
    assert!(health.degraded >= 1, "{health:?}");
    let out = rebuild::pass(&t.fs, 0, &Stop::default(), &RebuildStats::default());
    assert_eq!(out.left_degraded, 0, "{out:?}");
    assert_eq!(t.read_file("f").unwrap(), data);
    // The rebuilt chunks are copies until the encoder makes them stripes on live servers.
    assert_eq!(encode_all(&t), 0);
    let health = t.fs.replica_health();
    assert_eq!((health.encoded, health.degraded), (3, 0), "{health:?}");
    assert_eq!(t.read_file("f").unwrap(), data);
}

#[test]
fn a_volumes_stripes_are_in_its_journal_and_outlive_its_daemon() {
    let mut t = TestFs::encoded_volume(6, 32 << 20, code("4+2"), "ec");
    let data = bytes(8, 3 * MIB + 4321);
    t.create("f").unwrap();
    t.write_file("f", 0, &data).unwrap();
    assert_eq!(encode_all(&t), 0);
    assert_eq!(stripes(&t), 4);
    t.fs.sync().expect("a volume mount syncs").unwrap();
    t.crash_and_reattach();
    assert_eq!(stripes(&t), 4, "the stripes were replayed from the journal");
    assert_eq!(t.read_file("f").unwrap(), data);
    // The copies the stripes replaced were freed, and nothing else was: every extent the
    // servers hold is named by the table or the journal.
    let h = t.fs.replica_health();
    assert_eq!((h.copy_bytes, h.stripes_degraded), (0, 0), "{h:?}");
    t.kill_server(0);
    t.kill_server(1);
    assert_eq!(
        t.read_file("f").unwrap(),
        data,
        "decoded with two servers gone"
    );
}

#[test]
fn a_daemon_killed_between_the_fragments_and_the_switch_leaves_the_copies_whole() {
    let mut t = TestFs::encoded_volume(6, 32 << 20, code("4+2"), "hole");
    let data = bytes(9, 2 * MIB);
    t.create("f").unwrap();
    t.write_file("f", 0, &data).unwrap();
    t.fs.sync().expect("a volume mount syncs").unwrap();
    let copies = t.remote_used();
    t.fs.data().die_before_switch();
    assert_eq!(encode_all(&t), 2, "no chunk was switched to its stripe");
    t.fs.data().settle_frees(std::time::Duration::from_secs(5));
    assert!(t.remote_used() > copies, "the fragments were written");
    t.crash_and_reattach();
    assert_eq!(stripes(&t), 0);
    assert_eq!(t.read_file("f").unwrap(), data);
    // The fragments no record names were collected at attach.
    t.fs.data().settle_frees(std::time::Duration::from_secs(5));
    assert_eq!(t.remote_used(), copies);
    // The next daemon encodes the chunks whole.
    assert_eq!(encode_all(&t), 0);
    t.kill_server(2);
    t.kill_server(5);
    assert_eq!(t.read_file("f").unwrap(), data);
}

#[test]
fn a_drain_moves_every_fragment_off_its_server() {
    let t = TestFs::encoded(7, 32 << 20, code("4+2"));
    let data = bytes(10, 3 * MIB);
    t.create("f").unwrap();
    t.write_file("f", 0, &data).unwrap();
    assert_eq!(encode_all(&t), 0);
    let gone = t.servers[0].local_addr();
    let holds = |t: &TestFs| {
        t.placement_addrs("f")
            .iter()
            .any(|c| c.contains(&gone.to_string()))
    };
    assert!(
        holds(&t),
        "server 0 held fragments (all seven servers take part)"
    );
    rmemfs::upkeep::membership::drain(
        &t.fs,
        None,
        &Default::default(),
        gone,
        0,
        &Stop::default(),
        &|_| {},
    )
    .unwrap();
    assert!(!holds(&t), "{:?}", t.placement_addrs("f"));
    assert_eq!(t.read_file("f").unwrap(), data);
    // The chunks the drain made copies become stripes again, on the six servers left.
    assert_eq!(encode_all(&t), 0);
    assert_eq!(stripes(&t), 3);
    assert!(!holds(&t));
    assert_eq!(t.read_file("f").unwrap(), data);
}

#[test]
fn writes_racing_the_encoder_and_the_rebuild_lose_nothing() {
    let mut t = TestFs::encoded(7, 64 << 20, code("4+2"));
    let mut model = bytes(11, 6 * MIB);
    t.create("f").unwrap();
    t.write_file("f", 0, &model).unwrap();
    assert_eq!(encode_all(&t), 0);
    t.kill_server(6);
    let barrier = std::sync::Barrier::new(3);
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            barrier.wait();
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                encode_all(&t);
            }
        });
        s.spawn(|| {
            barrier.wait();
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                rebuild::pass(&t.fs, 0, &Stop::default(), &RebuildStats::default());
            }
        });
        barrier.wait();
        // Writes of 4 KiB to 64 KiB spread over every chunk, each also made to the model.
        for i in 0..200u64 {
            let len = 4096 * (1 + (i * 7) % 16) as usize;
            let off = ((i * 2_654_435_761) % (6 * MIB as u64 - len as u64)) as usize;
            let patch = bytes(100 + i, len);
            t.write_file("f", off as u64, &patch).unwrap();
            model[off..off + len].copy_from_slice(&patch);
        }
        done.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    assert_eq!(t.read_file("f").unwrap(), model);
    // Cold at last, every chunk a whole stripe on the six live servers.
    assert_eq!(encode_all(&t), 0);
    let h = t.fs.replica_health();
    assert_eq!((h.encoded, h.degraded, h.lost), (6, 0, 0), "{h:?}");
    assert_eq!(t.read_file("f").unwrap(), model);
}

/// `mkdir PATH` from the root.
fn mkdir(t: &TestFs, name: &str) {
    let (p, n) = t.parent(name).unwrap();
    t.fs.mkdir(p, n.as_bytes(), 0o755, common::ME).unwrap();
}

fn set_redundancy(t: &TestFs, path: &str, value: &str) -> Result<(), i32> {
    let ino = t.resolve(path).unwrap();
    t.fs.setxattr(
        ino,
        rmemfs::fs::REDUNDANCY_XATTR,
        value.as_bytes(),
        0,
        common::ME,
    )
    .map_err(|e| e.errno)
}

#[test]
fn a_directorys_redundancy_is_what_new_files_in_it_keep() {
    // Three servers, two copies, no --redundancy: only files given a code are encoded.
    let t = TestFs::copies_encoding_on_request(3, 32 << 20, 2);
    mkdir(&t, "bulk");
    set_redundancy(&t, "bulk", "ec:2+1").unwrap();
    mkdir(&t, "bulk/sub");
    let data = bytes(12, 2 * MIB);
    for f in ["bulk/a", "bulk/sub/b", "c"] {
        t.create(f).unwrap();
        t.write_file(f, 0, &data).unwrap();
    }
    assert_eq!(encode_all(&t), 0);
    let stripes_of = |f: &str| t.placement_addrs(f).iter().filter(|c| c.len() == 3).count();
    assert_eq!(
        (
            stripes_of("bulk/a"),
            stripes_of("bulk/sub/b"),
            stripes_of("c")
        ),
        (2, 2, 0),
        "files in the directory (and in its new subdirectory) are encoded, the other not"
    );
    let ino = t.resolve("bulk/sub/b").unwrap();
    assert_eq!(
        t.fs.getxattr(ino, rmemfs::fs::REDUNDANCY_XATTR).unwrap(),
        b"ec:2+1"
    );
    for f in ["bulk/a", "bulk/sub/b", "c"] {
        assert_eq!(t.read_file(f).unwrap(), data, "{f}");
    }
}

#[test]
fn a_file_set_to_copies_keeps_them_on_an_encoding_mount() {
    let t = TestFs::encoded(6, 32 << 20, code("4+2"));
    let data = bytes(13, 2 * MIB);
    for f in ["hot", "cold"] {
        t.create(f).unwrap();
        t.write_file(f, 0, &data).unwrap();
    }
    set_redundancy(&t, "hot", "copies").unwrap();
    assert_eq!(encode_all(&t), 0);
    assert_eq!(stripes(&t), 2, "only the cold file's two chunks");
    assert!(t.placement_addrs("hot").iter().all(|c| c.len() == 3));
}

#[test]
fn a_redundancy_the_mount_cannot_keep_is_refused_at_setxattr() {
    let t = TestFs::encoded(6, 32 << 20, code("4+2"));
    t.create("f").unwrap();
    for bad in ["ec:4", "ec:1+1", "ec:4+9", "raid6", "copies:2", ""] {
        assert_eq!(set_redundancy(&t, "f", bad), Err(libc::EINVAL), "{bad:?}");
    }
    assert_eq!(
        set_redundancy(&t, "f", "ec:8+3"),
        Err(libc::ENOSPC),
        "11 fragments on six"
    );
    set_redundancy(&t, "f", "ec:3+3").unwrap();
    set_redundancy(&t, "f", "copies").unwrap();
}

#[test]
fn chunks_waiting_for_servers_are_counted_pending() {
    let mut t = TestFs::encoded(6, 32 << 20, code("4+2"));
    t.create("f").unwrap();
    t.write_file("f", 0, &bytes(14, 2 * MIB)).unwrap();
    t.kill_server(5);
    t.fs.data().pool().refresh();
    // Five servers cannot take six fragments: encoding has not finished, and says so.
    assert_eq!(encode_all(&t), 2);
    assert_eq!(stripes(&t), 0);
}
