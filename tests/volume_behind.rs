//! Write-behind on a volume's holder (`data::behind`): a small write is answered before its
//! bytes are sent, and the journal writes no record before the bytes it names. After a crash
//! every fsynced byte is there, and no file shows a byte it was not written: not another
//! file's, and not the zeros of memory a record named before its bytes were sent.

mod common;

use common::rack::{Daemon, Rack};
use common::{eventually, ME};
use rmemfs::meta::ROOT_INO;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// Word `w` (the 8 bytes at `8 * w`) of file `id`: names the file and the place, never zero.
fn word(id: u64, w: u64) -> [u8; 8] {
    ((id << 40) | (w + 1)).to_le_bytes()
}

/// File `id`'s bytes at `offset` (a multiple of 8), `len` of them (a multiple of 8).
fn pattern(id: u64, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64 / 8)
        .flat_map(|w| word(id, offset / 8 + w))
        .collect()
}

#[test]
fn a_group_commits_after_the_bytes_of_the_writes_it_names() {
    let rack = Rack::new(2);
    let d = rack.attach_behind("vol", true).unwrap();
    let fs = d.fs();
    let (e, fh) = fs
        .create(ROOT_INO, b"f", 0o644, libc::O_WRONLY, ME)
        .unwrap();
    let want = pattern(1, 0, 16 << 10);
    fs.write(e.ino, fh, 0, &want, ME).unwrap();
    let s = fs.data().write_behind_stats();
    assert_eq!(
        (s.deferred, s.sent_inline),
        (1, 0),
        "the write waits: {s:?}"
    );
    // A barrier for names only (fsyncdir): the group holding the file's chunk goes out, and
    // the waiting write before it, though nothing asked for the file's bytes.
    d.sync().unwrap();
    let s = fs.data().write_behind_stats();
    assert_eq!(
        s.sent_inline + s.sent_by_worker,
        1,
        "the group commit sent the waiting write: {s:?}"
    );
    for (server, bytes) in fs.copies_of(e.ino, 0).unwrap() {
        assert!(bytes[..want.len()] == want[..], "copy on server {server}");
    }
    fs.release(fh);
    d.crash();
    let d = rack.attach_behind("vol", false).unwrap();
    assert_eq!(d.read("f").unwrap(), want);
}

/// What the writers did that a check after the crash may count on.
#[derive(Default)]
struct Written {
    /// Every file made, by name, with its id.
    made: Vec<(String, u64)>,
    /// Files whose first bytes an fsync returned for (removed before an unlink).
    fsynced: BTreeMap<String, usize>,
}

/// Writes files in appends of 8 bytes to 64 KiB until an operation fails (the crash): each
/// file a pattern of its own, a quarter of them fsynced, one in five unlinked again (so
/// their memory is handed to later files).
fn writer(d: &Daemon, round: u64, written: &Mutex<Written>, seed: u64) {
    let fs = d.fs();
    let mut x = seed | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0.. {
        let id = round * 100_000 + i + 1;
        let name = format!("r{round}-{i}");
        let Ok((e, fh)) = fs.create(ROOT_INO, name.as_bytes(), 0o644, libc::O_WRONLY, ME) else {
            return;
        };
        written.lock().unwrap().made.push((name.clone(), id));
        let mut len = 0u64;
        for _ in 0..1 + next() % 4 {
            let n = 8 * (1 + next() % 8192) as usize;
            if fs.write(e.ino, fh, len, &pattern(id, len, n), ME).is_err() {
                return;
            }
            len += n as u64;
        }
        fs.release(fh);
        if next() % 4 == 0 {
            match fs.fsync(e.ino) {
                Some(Ok(())) => {
                    written
                        .lock()
                        .unwrap()
                        .fsynced
                        .insert(name.clone(), len as usize);
                }
                _ => return,
            }
        }
        if i > 0 && next() % 5 == 0 {
            let victim = format!("r{round}-{}", next() % i);
            written.lock().unwrap().fsynced.remove(&victim);
            let _ = fs.unlink(ROOT_INO, victim.as_bytes());
        }
    }
}

/// After a crash: every fsynced file holds at least its fsynced bytes, and every word of
/// every file is its own pattern's.
fn check(d: &Daemon, written: &Written) {
    for (name, id) in &written.made {
        let got = match d.read(name) {
            Ok(got) => got,
            Err(libc::ENOENT) => {
                assert!(
                    !written.fsynced.contains_key(name),
                    "{name} was fsynced, and is gone"
                );
                continue;
            }
            Err(e) => panic!("{name}: errno {e}"),
        };
        // Only appends: within the size a record made durable, every byte was written
        // before that record (no zeros of memory named before its bytes came, and no other
        // file's bytes).
        for (w, chunk) in got.chunks(8).enumerate() {
            assert!(
                chunk == &word(*id, w as u64)[..chunk.len()],
                "{name}: word {w} of {} is {chunk:?}, not its own",
                got.len() / 8
            );
        }
        if let Some(&n) = written.fsynced.get(name) {
            assert!(got.len() >= n, "{name}: {} bytes, {n} fsynced", got.len());
            assert!(
                got[..n] == pattern(*id, 0, n)[..],
                "{name}: its fsynced bytes differ"
            );
        }
    }
}

#[test]
fn after_a_crash_each_byte_is_one_written_and_every_fsynced_byte_is_there() {
    let rack = Rack::new(2);
    let written = Mutex::new(Written::default());
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    for round in 0..4u64 {
        let d = rack.attach_behind("crash", round == 0).unwrap();
        check(&d, &written.lock().unwrap());
        let seed = nanos ^ (round + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                writer(&d, round, &written, seed);
                done.store(true, Ordering::SeqCst);
            });
            // Some writes answered before they were sent, then the crash at a moment of
            // this run's own.
            eventually("writes were answered before they were sent", || {
                d.fs().data().write_behind_stats().deferred >= 30
            });
            std::thread::sleep(Duration::from_millis(seed % 40));
            d.fs().data().pool().crash();
        });
        assert!(done.load(Ordering::SeqCst));
        let s = d.fs().data().write_behind_stats();
        eprintln!(
            "round {round}: {s:?}, {} files made",
            written.lock().unwrap().made.len()
        );
        d.crash();
    }
    let d = rack.attach_behind("crash", false).unwrap();
    check(&d, &written.lock().unwrap());
}
