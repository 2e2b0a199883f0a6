//! Real FUSE mounts over the in-process fabric (no data crosses a network): `Mount` takes its
//! fabrics as parameters, and the `testing` feature's fault hook injects panics. Needs root
//! and /dev/fuse, as the rest of the test command does.

use rmemfs::fabric::local::LocalNetwork;
use rmemfs::fabric::AlignedBuf;
use rmemfs::fs::{Fs, INJECT_PANIC_XATTR};
use rmemfs::mount::{Mount, MountConfig};
use std::ffi::CString;
use std::io::{Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// A live mount; unmounted (and its daemon thread joined) on drop.
struct Mounted {
    dir: PathBuf,
    fs: Arc<Fs>,
    session: Option<JoinHandle<Result<(), String>>>,
}

impl Mounted {
    /// The mount's report, read through its stats attribute (as `rmemfs stats --json`).
    fn stats_json(&self) -> serde_json::Value {
        rmemfs::mount::report_json(&self.dir).unwrap()
    }

    fn new() -> Mounted {
        Self::with_options(&[])
    }

    /// A mount with these `-o` options.
    fn with_options(options: &[&str]) -> Mounted {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rmemfs-local-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let net = LocalNetwork::new();
        let (client, server) = (net.node(), net.node());
        let mut config = MountConfig::new(dir.clone());
        config.size = Some(64 << 20);
        config.options = options.iter().map(|o| o.to_string()).collect();
        let (ready_tx, ready_rx) = mpsc::channel();
        let (fs_tx, fs_rx) = mpsc::channel();
        let session = std::thread::spawn(move || {
            Mount::new(config)
                .fabrics(client, server)
                .on_mounted(move |fs| {
                    let _ = fs_tx.send(fs);
                })
                .run(&mut || {
                    let _ = ready_tx.send(());
                })
        });
        if ready_rx.recv_timeout(Duration::from_secs(60)).is_err() {
            let res = session.join();
            panic!("the mount did not come up: {res:?}");
        }
        let fs = fs_rx.recv().unwrap();
        Mounted {
            dir,
            fs,
            session: Some(session),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.dir).status();
        if let Some(s) = self.session.take() {
            let res = s.join().expect("session thread");
            if !std::thread::panicking() {
                res.expect("session ended with an error");
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn set_xattr(path: &Path, name: &[u8], value: &[u8]) {
    let p = CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    // SAFETY: both strings are NUL-terminated; `value` is readable for its length.
    let rc = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr() as *const libc::c_void,
            value.len(),
            0,
        )
    };
    assert_eq!(rc, 0, "setxattr: {}", std::io::Error::last_os_error());
}

/// Drops the file's pages from the kernel's cache, so the next read reaches the daemon.
fn drop_cached_pages(f: &std::fs::File) {
    // SAFETY: fadvise on an open descriptor of ours.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0);
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn an_injected_panic_fails_one_request_and_the_mount_keeps_serving() {
    let m = Mounted::new();
    let path = m.path("f");
    let first = pattern(300_000, 1);
    std::fs::write(&path, &first).unwrap();

    // A write whose handler panics (holding the file's lock) fails with EIO ...
    set_xattr(&path, INJECT_PANIC_XATTR, b"write");
    let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let err = f.write_all(&pattern(4096, 2)).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    // ... and the next one, on the same file and lock, works.
    f.seek(SeekFrom::Start(0)).unwrap();
    let second = pattern(4096, 3);
    f.write_all(&second).unwrap();
    drop(f);

    // The same for a read. O_DIRECT, so the kernel does not retry a failed readahead with a
    // second request of its own and hide the error.
    set_xattr(&path, INJECT_PANIC_XATTR, b"read");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .unwrap();
    let buf = AlignedBuf::new(1 << 20).unwrap();
    // SAFETY: `buf` is a writable mapping of 1 MiB that outlives the call.
    let n = unsafe { libc::pread(f.as_raw_fd(), buf.as_ptr() as *mut libc::c_void, 1 << 20, 0) };
    let err = std::io::Error::last_os_error();
    assert_eq!(n, -1, "the read with an injected panic succeeded");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    drop(f);
    let got = std::fs::read(&path).unwrap();
    let mut want = first.clone();
    want[..second.len()].copy_from_slice(&second);
    assert!(
        got == want,
        "file contents differ after the contained panics"
    );

    // Everything else goes on: new files, directories, listing.
    std::fs::create_dir(m.path("d")).unwrap();
    std::fs::write(m.path("d/g"), b"still here").unwrap();
    assert_eq!(std::fs::read(m.path("d/g")).unwrap(), b"still here");
    assert_eq!(std::fs::read_dir(&m.dir).unwrap().count(), 2);
    assert_eq!(m.stats_json()["contained_panics"], 2);
}

#[test]
fn a_mount_over_the_in_process_fabric_moves_no_data_over_a_network() {
    let m = Mounted::new();
    let data = pattern(5 << 20, 7);
    std::fs::write(m.path("big"), &data).unwrap();
    let f = std::fs::File::open(m.path("big")).unwrap();
    drop_cached_pages(&f);
    assert!(std::fs::read(m.path("big")).unwrap() == data);
    let counters = m.fs.data().pool().fabric().counters();
    assert_eq!(m.fs.data().pool().fabric().name(), "local");
    assert!(counters.bytes_written >= 5 << 20, "{counters:?}");
    assert!(counters.bytes_read >= 5 << 20, "{counters:?}");
}

#[test]
fn a_failed_io_uring_queue_ends_the_connection_not_the_process() {
    // Needs the kernel's FUSE over io_uring (Linux 6.14+, as on the machines this runs on): a
    // mount that fell back to /dev/fuse would test nothing, so it fails instead.
    let mut m = Mounted::with_options(&["io_uring"]);
    std::fs::write(m.path("f"), b"through the ring").unwrap();
    assert_eq!(
        m.stats_json()["fuse"]["transport"],
        "io_uring",
        "this test needs FUSE over io_uring (the fuse module's enable_uring)"
    );
    set_xattr(&m.dir, INJECT_PANIC_XATTR, b"ring");
    // The ring thread that takes the fault aborts the connection (through the fuse control
    // file system): the session ends as if unmounted, in this process, which goes on.
    let session = m.session.take().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !session.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "the session still runs 20 s after a ring failed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // It returns (the daemon would exit with this message, after its usual shutdown).
    let ended = session.join().expect("the session thread panicked");
    let e = ended.expect_err("a session ended by a ring failure says so");
    assert!(e.contains("ring failure"), "{e}");
    // And the session's end unmounted it: nothing left that answers ENOTCONN.
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let dir = m.dir.to_string_lossy().into_owned();
    assert!(
        !mounts
            .lines()
            .any(|l| l.split(' ').nth(1) == Some(dir.as_str())),
        "{dir} is still mounted"
    );
}
