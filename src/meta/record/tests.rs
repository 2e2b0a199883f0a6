use super::*;
use crate::meta::{Chunk, Replica};
use proptest::prelude::*;

fn attrs(seed: u64) -> Attrs {
    let t = |s: i64, n: u32| {
        if s >= 0 {
            SystemTime::UNIX_EPOCH + Duration::new(s as u64, n)
        } else {
            SystemTime::UNIX_EPOCH - Duration::from_secs(s.unsigned_abs())
                + Duration::from_nanos(n.into())
        }
    };
    Attrs {
        perm: (seed % 0o7777) as u16,
        uid: seed as u32,
        gid: (seed >> 8) as u32,
        nlink: 1 + (seed % 5) as u32,
        rdev: 0,
        size: seed * 4096 + 7,
        atime: t(1_700_000_000 + seed as i64, 123),
        mtime: t(-315_619_200, 999_999_999),
        ctime: t(0, 0),
        btime: t(-1, 1),
        flags: 0x30,
        tmpfile: seed.is_multiple_of(2),
        overwriting: seed.is_multiple_of(3),
    }
}

fn every_kind_of_change() -> Vec<Change> {
    let r = |server| Replica {
        server,
        addr: 0x7f00_0000_1000 + u64::from(server),
        rkey: 0xdead_beef_0000_0000 | u64::from(server),
    };
    let mut x = Xattrs::new();
    x.insert(
        (*b"system.posix_acl_access").into(),
        vec![2, 0, 0, 0].into(),
    );
    vec![
        Change::Make {
            ino: 2,
            kind: Kind::Dir,
            attrs: attrs(1),
            seed: Seed::Dir { parent: 1 },
            xattrs: Some(x),
        },
        Change::Make {
            ino: 3,
            kind: Kind::Symlink,
            attrs: attrs(2),
            seed: Seed::Symlink((*b"../target").into()),
            xattrs: None,
        },
        Change::Make {
            ino: 4,
            kind: Kind::CharDevice,
            attrs: attrs(3),
            seed: Seed::Special,
            xattrs: None,
        },
        Change::Make {
            ino: 5,
            kind: Kind::File,
            attrs: attrs(4),
            seed: Seed::File,
            xattrs: None,
        },
        Change::Attrs {
            ino: 5,
            attrs: attrs(5),
        },
        Change::Entry {
            dir: 1,
            name: (*b"name with \xff bytes").into(),
            ino: Some(5),
        },
        Change::Entry {
            dir: 1,
            name: (*b"gone").into(),
            ino: None,
        },
        Change::Parent { dir: 2, parent: 1 },
        Change::Xattr {
            ino: 5,
            name: (*b"user.k").into(),
            value: Some((*b"").into()),
        },
        Change::Xattr {
            ino: 5,
            name: (*b"user.gone").into(),
            value: None,
        },
        Change::Extent {
            ino: 5,
            idx: 3,
            chunk: Some(Chunk::with_replicas(1 << 20, &[r(0), r(2), r(1)])),
        },
        Change::Extent {
            ino: 5,
            idx: 4,
            chunk: Some(Chunk::with_replicas(4096, &[])),
        },
        Change::Extent {
            ino: 5,
            idx: 9,
            chunk: None,
        },
        Change::Extent {
            ino: 5,
            idx: 10,
            chunk: Some(encoded_chunk()),
        },
        Change::Drop { ino: 4 },
        Change::EntryAt {
            dir: 1,
            name: (*b"placed").into(),
            ino: 9,
            cookie: 77,
        },
        Change::Cookies { dir: 1, next: 80 },
        Change::Born {
            server: 2,
            birth: (*b"a birth").into(),
            stale: true,
        },
        Change::DirStamp {
            dir: 1,
            time: std::time::UNIX_EPOCH + std::time::Duration::new(1_700_000_000, 5),
            links: -1,
        },
    ]
}

/// A 4+2 stripe with its fifth fragment lost.
fn encoded_chunk() -> Chunk {
    let r = |server: u32| Replica {
        server,
        addr: 0x10000 * server as u64,
        rkey: 0xabc + server as u64,
    };
    let mut frags: Vec<Option<Replica>> = (0..6).map(|s| Some(r(s))).collect();
    frags[4] = None;
    Chunk::encoded(
        (1 << 20) - 5,
        crate::meta::Stripe {
            id: 0x1234_5678_9abc,
            k: 4,
            m: 2,
            frag_len: 1 << 18,
            frags,
        },
    )
}

#[test]
fn only_a_record_naming_a_stripe_or_four_copies_takes_the_newer_format() {
    let version =
        |changes: &[Change]| u16::from_le_bytes(encode(1, changes)[4..6].try_into().unwrap());
    let extent = |chunk: Chunk| Change::Extent {
        ino: 2,
        idx: 0,
        chunk: Some(chunk),
    };
    let r = |server: u32| Replica {
        server,
        addr: 1,
        rkey: 2,
    };
    assert_eq!(version(&[]), 1);
    assert_eq!(
        version(&[extent(Chunk::with_replicas(9, &[r(0), r(1), r(2)]))]),
        1
    );
    assert_eq!(
        version(&[extent(Chunk::with_replicas(9, &[r(0), r(1), r(2), r(3)]))]),
        2
    );
    assert_eq!(version(&[extent(encoded_chunk())]), RECORD_VERSION);
    // A stripe whose fragments cannot hold its length is damage.
    let mut bad = encoded_chunk();
    bad.len = 5 << 20;
    let frame = encode(1, &[extent(bad)]);
    assert!(matches!(read(&frame, 1).stop, Stop::Malformed(_)));
}

#[test]
fn every_change_reads_back_as_written() {
    let changes = every_kind_of_change();
    let mut log = encode(7, &changes);
    log.extend(encode(8, &[]));
    let read = read(&log, 7);
    assert_eq!(read.stop, Stop::End);
    assert_eq!(read.end, log.len());
    assert_eq!(read.records, vec![(7, changes), (8, vec![])]);
}

#[test]
fn a_torn_tail_is_never_applied() {
    let first = encode(1, &every_kind_of_change()[..3]);
    let second = encode(2, &every_kind_of_change());
    let whole = [first.clone(), second.clone()].concat();
    // Cut anywhere in the second frame: only the first comes back, and the journal
    // continues where the first ends.
    for cut in first.len() + 1..whole.len() {
        let r = read(&whole[..cut], 1);
        assert_eq!(r.records.len(), 1, "cut at {cut}");
        assert_eq!(r.end, first.len(), "cut at {cut}");
        assert_ne!(r.stop, Stop::End, "cut at {cut}");
    }
    // Torn in place (the rest still zeros from the ring, or the first bytes of a longer
    // old record): the checksum catches a frame whose payload is half new.
    let mut torn = whole.clone();
    let mid = first.len() + HEADER_LEN + 10;
    torn[mid..].fill(0);
    assert_eq!(read(&torn, 1).stop, Stop::BadChecksum);
}

#[test]
fn any_flipped_bit_stops_reading_at_its_frame() {
    let first = encode(1, &every_kind_of_change());
    let second = encode(2, &every_kind_of_change()[2..]);
    let whole = [first.clone(), second].concat();
    for byte in first.len()..whole.len() {
        for bit in 0..8 {
            let mut damaged = whole.clone();
            damaged[byte] ^= 1 << bit;
            let r = read(&damaged, 1);
            assert_eq!(r.records.len(), 1, "byte {byte} bit {bit}: {:?}", r.stop);
            assert_eq!(r.end, first.len());
        }
    }
}

#[test]
fn older_contents_and_newer_formats_stop_the_reader() {
    // A ring that wrapped: after LSN 11 come the bytes of LSN 3.
    let log = [encode(10, &[]), encode(11, &[]), encode(3, &[])].concat();
    let r = read(&log, 10);
    assert_eq!(r.records.len(), 2);
    assert_eq!(
        r.stop,
        Stop::OutOfSequence {
            expected: 12,
            found: 3
        }
    );
    let mut newer = encode(1, &[]);
    newer[4..6].copy_from_slice(&(RECORD_VERSION + 1).to_le_bytes());
    assert_eq!(
        read(&newer, 1).stop,
        Stop::NewerFormat {
            found: RECORD_VERSION + 1
        }
    );
    assert_eq!(read(&[0u8; 64], 1).stop, Stop::NoRecord);
}

#[test]
fn a_checksummed_frame_with_a_bad_payload_is_malformed_not_applied() {
    // A payload the checksum vouches for but that claims an unknown change: a bug to
    // report, never something to apply part of.
    let payload = [1u32.to_le_bytes().as_slice(), &[99u8]].concat();
    let mut frame = Vec::new();
    put_u32(&mut frame, RECORD_MAGIC);
    frame.extend_from_slice(&RECORD_VERSION.to_le_bytes());
    frame.extend_from_slice(&0u16.to_le_bytes());
    put_u64(&mut frame, 1);
    put_u32(&mut frame, payload.len() as u32);
    put_u32(&mut frame, 0);
    let sum = crc(&frame, &payload);
    frame[20..24].copy_from_slice(&sum.to_le_bytes());
    frame.extend_from_slice(&payload);
    let r = read(&frame, 1);
    assert!(r.records.is_empty());
    assert!(matches!(r.stop, Stop::Malformed(_)), "{:?}", r.stop);
}

proptest! {
    /// Random batches of random changes read back as written, and any prefix of the
    /// bytes gives back a prefix of the records.
    #[test]
    fn random_journals_round_trip(
        picks in proptest::collection::vec(
            proptest::collection::vec(0usize..14, 0..6), 1..8),
        cut in 0usize..4096,
    ) {
        let all = every_kind_of_change();
        let batches: Vec<Vec<Change>> = picks
            .iter()
            .map(|p| p.iter().map(|&i| all[i].clone()).collect())
            .collect();
        let log: Vec<u8> = batches
            .iter()
            .enumerate()
            .flat_map(|(i, b)| encode(100 + i as u64, b))
            .collect();
        let r = read(&log, 100);
        prop_assert_eq!(r.stop, Stop::End);
        let want: Vec<(u64, Vec<Change>)> = batches
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, b)| (100 + i as u64, b))
            .collect();
        prop_assert_eq!(&r.records, &want);
        let cut = cut.min(log.len());
        let p = read(&log[..cut], 100);
        prop_assert!(p.end <= cut);
        prop_assert_eq!(&p.records[..], &want[..p.records.len()]);
    }
}
