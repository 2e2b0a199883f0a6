//! The library (`rmemfs::library`): a volume opened in the program, no FUSE. A holder
//! writes, a follower beside it reads what was committed; `read_many` reads many ranges of
//! many files in one batch; names, handles and errors behave as the calls they mirror; a
//! second holder is refused; a volume dropped and opened again has every fsynced byte.

mod common;

use common::bytes;
use rmemfs::library::{open_volume, Mode, ReadRequest, Volume, VolumeOptions};
use rmemfs::server::{MemoryServer, ServerConfig};
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

/// Memory servers on the tcp fabric, as a program's volume reaches them.
fn servers(n: usize) -> Vec<MemoryServer> {
    (0..n)
        .map(|_| {
            let fabric =
                rmemfs::fabric::open("tcp", &rmemfs::fabric::FabricOptions::default()).unwrap();
            let config = ServerConfig::new("127.0.0.1:0".parse().unwrap(), 128 << 20);
            MemoryServer::start(&config, fabric).unwrap()
        })
        .collect()
}

fn options(servers: &[MemoryServer], name: &str, mode: Mode, create: bool) -> VolumeOptions {
    VolumeOptions {
        servers: servers.iter().map(|s| s.local_addr().to_string()).collect(),
        name: name.into(),
        secret_file: None,
        mode,
        create,
    }
}

fn write_file(v: &Volume, path: &str, data: &[u8]) {
    let fh = v
        .open(path, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o644)
        .unwrap();
    assert_eq!(v.write(fh, data).unwrap(), data.len());
    v.fsync(fh).unwrap();
    v.close(fh).unwrap();
}

fn read_file(v: &Volume, path: &str) -> Vec<u8> {
    let fh = v.open(path, libc::O_RDONLY, 0).unwrap();
    let mut out = vec![0u8; v.stat(path).unwrap().size as usize];
    assert_eq!(v.read(fh, &mut out).unwrap(), out.len());
    v.close(fh).unwrap();
    out
}

/// Waits (bounded) for `done`: a follower sees a commit within its poll.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(20), "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A volume is used from many threads at once (the C ABI and Python hand it to any).
#[test]
fn a_volume_is_shared_between_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<Volume>();
    let s = servers(1);
    let v = open_volume(&options(&s, "threads", Mode::Hold, true)).unwrap();
    let data = bytes(3, 300_000);
    std::thread::scope(|scope| {
        for i in 0..4 {
            let (v, data) = (&v, &data);
            scope.spawn(move || write_file(v, &format!("/t{i}"), data));
        }
    });
    for i in 0..4 {
        assert_eq!(read_file(&v, &format!("/t{i}")), data);
    }
}

#[test]
fn a_holder_writes_and_a_follower_beside_it_reads_what_was_committed() {
    let s = servers(2);
    let holder = open_volume(&options(&s, "lib", Mode::Hold, true)).unwrap();
    holder.mkdir("/ckpt", 0o755).unwrap();
    let a = bytes(1, 3 * MIB + 777);
    write_file(&holder, "/ckpt/a", &a);
    holder.sync().unwrap();
    let follower = open_volume(&options(&s, "lib", Mode::Follow, false)).unwrap();
    assert_eq!(read_file(&follower, "/ckpt/a"), a);
    // Written after the follower opened: seen within a poll.
    let b = bytes(2, 100_000);
    write_file(&holder, "/ckpt/b", &b);
    holder.sync().unwrap();
    eventually("the follower sees /ckpt/b", || {
        follower.stat("/ckpt/b").is_ok()
    });
    assert_eq!(read_file(&follower, "/ckpt/b"), b);
    let mut names: Vec<Vec<u8>> = follower
        .listdir("/ckpt")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    names.sort();
    assert_eq!(names, vec![b"a".to_vec(), b"b".to_vec()]);
    // A follower writes nothing.
    let e = follower
        .open("/ckpt/c", libc::O_WRONLY | libc::O_CREAT, 0o644)
        .unwrap_err();
    assert_eq!(e.errno, libc::EROFS, "{e}");
    // Renames and removals, seen by the follower.
    holder.rename("/ckpt/a", "/ckpt/a2").unwrap();
    holder.unlink("/ckpt/b").unwrap();
    holder.sync().unwrap();
    eventually("the follower sees the rename", || {
        follower.stat("/ckpt/a2").is_ok() && follower.stat("/ckpt/b").is_err()
    });
    assert_eq!(follower.stat("/ckpt/a").unwrap_err().errno, libc::ENOENT);
    assert_eq!(read_file(&follower, "/ckpt/a2"), a);
}

#[test]
fn read_many_reads_every_range_of_many_files_in_one_call() {
    let s = servers(2);
    let v = open_volume(&options(&s, "many", Mode::Hold, true)).unwrap();
    let files: Vec<Vec<u8>> = (0..4)
        .map(|i| bytes(10 + i, 2 * MIB + 1000 * i as usize))
        .collect();
    for (i, f) in files.iter().enumerate() {
        write_file(&v, &format!("/f{i}"), f);
    }
    let fhs: Vec<u64> = (0..4)
        .map(|i| v.open(&format!("/f{i}"), libc::O_RDONLY, 0).unwrap())
        .collect();
    // 300 reads of 4 KiB (more than one pooled buffer holds), across chunk edges, one past
    // the end of its file (short), and one larger than a pack.
    let mut wants: Vec<(usize, u64, usize)> = (0..300)
        .map(|n| {
            (
                n % 4,
                (n as u64 * 7919 * 4096 + 13) % (2 * MIB as u64),
                4096,
            )
        })
        .collect();
    wants.push((1, MIB as u64 - 100, 200));
    wants.push((3, files[3].len() as u64 - 10, 4096));
    wants.push((2, 1000, MIB + 5000));
    let mut bufs: Vec<Vec<u8>> = wants.iter().map(|w| vec![0xAA; w.2]).collect();
    let mut reqs: Vec<ReadRequest<'_>> = wants
        .iter()
        .zip(bufs.iter_mut())
        .map(|(w, buf)| ReadRequest {
            fh: fhs[w.0],
            offset: w.1,
            buf,
        })
        .collect();
    let got = v.read_many(&mut reqs).unwrap();
    drop(reqs);
    for ((w, buf), n) in wants.iter().zip(&bufs).zip(&got) {
        let f = &files[w.0];
        let end = (w.1 as usize + w.2).min(f.len());
        assert_eq!(
            *n,
            end - w.1 as usize,
            "read of {} at {} in f{}",
            w.2,
            w.1,
            w.0
        );
        assert!(
            buf[..*n] == f[w.1 as usize..end],
            "read of {} at {} in f{}",
            w.2,
            w.1,
            w.0
        );
    }
    // A handle not open is EBADF, and nothing is read.
    let mut one = [0u8; 10];
    let e = v
        .read_many(&mut [ReadRequest {
            fh: 999_999,
            offset: 0,
            buf: &mut one,
        }])
        .unwrap_err();
    assert_eq!(e.errno, libc::EBADF);
}

#[test]
fn names_and_handles_fail_as_the_calls_they_mirror() {
    let s = servers(1);
    let v = open_volume(&options(&s, "errs", Mode::Hold, true)).unwrap();
    assert_eq!(v.stat("/nope").unwrap_err().errno, libc::ENOENT);
    assert_eq!(
        v.open("/nope", libc::O_RDONLY, 0).unwrap_err().errno,
        libc::ENOENT
    );
    v.mkdir("/d", 0o755).unwrap();
    assert_eq!(v.mkdir("/d", 0o755).unwrap_err().errno, libc::EEXIST);
    assert_eq!(
        v.open("/d", libc::O_RDONLY, 0).unwrap_err().errno,
        libc::EISDIR
    );
    write_file(&v, "/d/f", b"hello");
    assert_eq!(v.rmdir("/d").unwrap_err().errno, libc::ENOTEMPTY);
    assert_eq!(v.stat("/d/f/x").unwrap_err().errno, libc::ENOTDIR);
    assert_eq!(v.stat("/d/../d").unwrap_err().errno, libc::EINVAL);
    assert_eq!(
        v.open("/d/f", libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o644)
            .unwrap_err()
            .errno,
        libc::EEXIST
    );
    // Append, positions and pread/pwrite.
    let fh = v.open("/d/f", libc::O_WRONLY | libc::O_APPEND, 0).unwrap();
    v.write(fh, b" world").unwrap();
    v.close(fh).unwrap();
    assert_eq!(read_file(&v, "/d/f"), b"hello world");
    let fh = v.open("/d/f", libc::O_RDWR, 0).unwrap();
    v.pwrite(fh, 6, b"W").unwrap();
    let mut five = [0u8; 5];
    assert_eq!(v.pread(fh, 6, &mut five).unwrap(), 5);
    assert_eq!(&five, b"World");
    assert_eq!(
        v.pread(fh, 100, &mut five).unwrap(),
        0,
        "past the end reads nothing"
    );
    v.close(fh).unwrap();
    assert_eq!(v.close(fh).unwrap_err().errno, libc::EBADF, "closed twice");
    v.unlink("/d/f").unwrap();
    v.rmdir("/d").unwrap();
    assert!(v.listdir("/").unwrap().is_empty());
}

#[test]
fn a_second_holder_is_busy_a_missing_volume_absent_and_a_reopened_one_whole() {
    let s = servers(2);
    let data = bytes(7, 5 * MIB + 3);
    {
        let v = open_volume(&options(&s, "again", Mode::Hold, true)).unwrap();
        write_file(&v, "/big", &data);
        let e = open_volume(&options(&s, "again", Mode::Hold, false))
            .err()
            .expect("a second holder was let in");
        assert_eq!(e.errno, libc::EBUSY, "{e}");
        let e = open_volume(&options(&s, "none", Mode::Follow, false))
            .err()
            .expect("a missing volume was followed");
        assert_eq!(e.errno, libc::ENOENT, "{e}");
        let e = open_volume(&options(&s, "again", Mode::Hold, true))
            .err()
            .expect("an existing volume was made again");
        assert_eq!(e.errno, libc::EEXIST, "{e}");
    }
    let v = open_volume(&options(&s, "again", Mode::Hold, false)).unwrap();
    assert_eq!(read_file(&v, "/big"), data);
}

/// The secret is the mount's: a program without it (or with another) is refused with
/// EACCES and a message; with it, let in.
#[test]
fn a_program_without_the_servers_secret_is_refused() {
    let dir = std::env::temp_dir().join(format!("rmemfs-lib-secret-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (key, other) = (dir.join("key"), dir.join("other"));
    rmemfs::auth::keygen(&key, true).unwrap();
    rmemfs::auth::keygen(&other, true).unwrap();
    let fabric = rmemfs::fabric::open("tcp", &rmemfs::fabric::FabricOptions::default()).unwrap();
    let config = ServerConfig {
        secret: rmemfs::auth::Secret::from_file(&key).unwrap(),
        ..ServerConfig::new("127.0.0.1:0".parse().unwrap(), 64 << 20)
    };
    let s = vec![MemoryServer::start(&config, fabric).unwrap()];
    for wrong in [None, Some(other.clone())] {
        let e = open_volume(&VolumeOptions {
            secret_file: wrong.clone(),
            ..options(&s, "sec", Mode::Hold, true)
        })
        .err()
        .expect("let in without the secret");
        assert_eq!(e.errno, libc::EACCES, "{wrong:?}: {e}");
    }
    let v = open_volume(&VolumeOptions {
        secret_file: Some(key),
        ..options(&s, "sec", Mode::Hold, true)
    })
    .unwrap();
    write_file(&v, "/f", b"kept");
    assert_eq!(read_file(&v, "/f"), b"kept");
    drop(v);
    std::fs::remove_dir_all(&dir).unwrap();
}
