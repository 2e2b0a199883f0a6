//! `rmemfs-bench fuse-floor`: what FUSE's cheapest round trip costs on this machine.
//!
//! Several of #13's targets are bounded below by the kernel's FUSE round trip, which no
//! daemon can make cheaper: extracting a tree costs the requests the kernel sends per file,
//! and a 4 KiB read costs one request plus a fabric read. This measures that floor with a
//! null file system (fuser, no rmemfs code: one file, every `getxattr` answered ENODATA at
//! once, served by as many threads as an rmemfs mount has), and beside it the same request on
//! a file of a real rmemfs mount, so the difference is rmemfs's own per-request cost.
//!
//! A read costs more than that cheapest request: the kernel allocates page-cache pages and
//! copies the reply into them. So the null file system also answers reads (zeros), and 4 KiB
//! reads that miss the page cache, as fio's random reads do, are timed too: that round trip
//! plus the fabric's own READ is the floor under a 4 KiB read on any FUSE file system here.

use fuser::{
    Errno, FileAttr, FileType, Filesystem, Generation, INodeNo, ReplyAttr, ReplyData, ReplyEntry,
    ReplyXattr, Request,
};
use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// Entries and attributes never expire here: only `getxattr` reaches the daemon.
const TTL: Duration = Duration::from_secs(3600);
/// FUSE's root inode number.
const ROOT_INO: u64 = 1;
/// The null file system's one file.
const FILE_NAME: &str = "f";
const FILE_INO: u64 = 2;
/// The null file's size: reads at random 4 KiB offsets in it practically never repeat, so
/// every one misses the page cache (1 TiB of zeros that exist nowhere).
const FILE_SIZE: u64 = 1 << 40;
/// The read size timed: fio's random reads in bench-latency and bench-rxe.
const READ_SIZE: usize = 4096;
/// Untimed round trips before each round, so the switch from the other file system (and
/// thread start-up) is not measured.
const WARMUP: usize = 200;

/// One file, no data; every extended attribute is absent. `uring`: asks the kernel for FUSE
/// over io_uring at INIT (fuser then serves requests from its ring threads).
struct NullFs {
    uring: bool,
    /// getxattr requests served by fuser's ring threads (so a ring figure is known to be one).
    on_ring: Arc<AtomicU64>,
}

fn attr(ino: u64) -> FileAttr {
    let dir = ino == ROOT_INO;
    FileAttr {
        ino: INodeNo(ino),
        size: if dir { 0 } else { FILE_SIZE },
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind: if dir {
            FileType::Directory
        } else {
            FileType::RegularFile
        },
        perm: if dir { 0o755 } else { 0o644 },
        nlink: if dir { 2 } else { 1 },
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl Filesystem for NullFs {
    fn init(&mut self, _req: &Request, config: &mut fuser::KernelConfig) -> std::io::Result<()> {
        if self.uring {
            // Ring payload buffers must hold the largest request this mount can send.
            let _ = config.set_max_write(64 << 10);
            config
                .add_capabilities(fuser::InitFlags::FUSE_OVER_IO_URING)
                .map_err(|_| std::io::Error::other("the kernel offers no FUSE over io_uring"))?;
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent.0 == ROOT_INO && name.as_bytes() == FILE_NAME.as_bytes() {
            reply.entry(&TTL, &attr(FILE_INO), Generation(0));
        } else {
            reply.error(Errno::from_i32(libc::ENOENT));
        }
    }

    fn getattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: Option<fuser::FileHandle>,
        reply: ReplyAttr,
    ) {
        reply.attr(&TTL, &attr(ino.0));
    }

    /// Plain stat instead (the kernel stops asking after one ENOSYS).
    fn statx(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: Option<fuser::FileHandle>,
        _flags: u32,
        _mask: u32,
        reply: fuser::ReplyStatx,
    ) {
        reply.error(Errno::from_i32(libc::ENOSYS));
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        if std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("fuser-ring"))
        {
            self.on_ring.fetch_add(1, Ordering::Relaxed);
        }
        reply.error(Errno::from_i32(libc::ENODATA));
    }

    /// Nothing to write back.
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: fuser::FileHandle,
        _lock_owner: fuser::LockOwner,
        reply: fuser::ReplyEmpty,
    ) {
        reply.ok();
    }

    /// Zeros, at once.
    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: fuser::FileHandle,
        offset: u64,
        size: u32,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        static ZEROS: [u8; 128 << 10] = [0; 128 << 10];
        let n = (size as usize)
            .min(ZEROS.len())
            .min(FILE_SIZE.saturating_sub(offset) as usize);
        reply.data(&ZEROS[..n]);
    }
}

/// Latencies of `iters` getxattr calls (a name that is absent) on `path`, in µs, after
/// [`WARMUP`] untimed ones.
fn time_getxattr(path: &Path, iters: usize) -> Result<Vec<f64>, String> {
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    let name = c"user.rmemfs-bench.absent";
    let call = || {
        // SAFETY: both strings are NUL-terminated and live across the call; a null buffer
        // with size 0 asks only for the value's length.
        let rc = unsafe { libc::getxattr(c_path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
        let errno = std::io::Error::last_os_error().raw_os_error();
        if rc < 0 && errno == Some(libc::ENODATA) {
            Ok(())
        } else {
            Err(format!(
                "getxattr on {} answered {rc} ({:?}), not ENODATA",
                path.display(),
                std::io::Error::last_os_error()
            ))
        }
    };
    timed(iters, call)
}

/// Latencies of `iters` reads of [`READ_SIZE`] bytes at random aligned offsets of the null
/// file `path` (each a page-cache miss, as fio's random reads: `POSIX_FADV_RANDOM`, so the
/// kernel reads no more than asked), in µs, after [`WARMUP`] untimed ones. `seed` varies the
/// offsets between rounds.
fn time_read(path: &Path, iters: usize, seed: u64) -> Result<Vec<f64>, String> {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: an advice call on a descriptor we own; no memory is passed.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    let mut rng = seed | 1;
    let blocks = FILE_SIZE / READ_SIZE as u64;
    let mut buf = vec![0u8; READ_SIZE];
    let read_one = || {
        // xorshift64: offsets need only to spread, not to be good random numbers.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let at = (rng % blocks) * READ_SIZE as u64;
        match file.read_at(&mut buf, at) {
            Ok(n) if n == READ_SIZE => Ok(()),
            Ok(n) => Err(format!(
                "a read at {at} of {} gave {n} bytes",
                path.display()
            )),
            Err(e) => Err(format!("read at {at} of {}: {e}", path.display())),
        }
    };
    timed(iters, read_one)
}

/// Latencies of `iters` calls of `call`, in µs, after [`WARMUP`] untimed ones.
fn timed(iters: usize, mut call: impl FnMut() -> Result<(), String>) -> Result<Vec<f64>, String> {
    for _ in 0..WARMUP {
        call()?;
    }
    let mut us = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        call()?;
        us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(us)
}

/// Rounds the calls are split into, alternating between the file systems, so a slow spell of
/// the machine (this VM's timings drift by tens of percent) falls on both alike.
const ROUNDS: usize = 10;

/// A mounted null file system: its session, and with `uring` the queue threads serving it.
struct NullMount {
    dir: PathBuf,
    session: fuser::BackgroundSession,
    on_ring: Arc<AtomicU64>,
}

impl NullMount {
    /// Mounts a null file system on a fresh directory named after `tag`.
    fn mount(tag: &str, threads: usize, uring: bool) -> Result<NullMount, String> {
        let dir =
            std::env::temp_dir().join(format!("rmemfs-fuse-floor.{}.{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName("rmemfs-null".into()),
            fuser::MountOption::DefaultPermissions,
        ];
        config.n_threads = Some(threads.max(1));
        config.clone_fd = threads > 1;
        let on_ring = Arc::new(AtomicU64::new(0));
        let null = NullFs {
            uring,
            on_ring: on_ring.clone(),
        };
        let session = fuser::spawn_mount(null, &dir, &config).map_err(|e| {
            let _ = std::fs::remove_dir(&dir);
            format!(
                "cannot mount the null file system on {}: {e}",
                dir.display()
            )
        })?;
        let mount = NullMount {
            dir,
            session,
            on_ring,
        };
        // The file's entry and attributes: cached from here on.
        std::fs::metadata(mount.file()).map_err(|e| format!("{}: {e}", mount.file().display()))?;
        Ok(mount)
    }

    fn file(&self) -> PathBuf {
        self.dir.join(FILE_NAME)
    }

    /// Unmounts; with `ring`, also checks that the ring carried at least `expected`
    /// requests (else the kernel kept to /dev/fuse and the figure would be mislabelled).
    fn unmount(self, ring: bool, expected: u64) -> Result<(), String> {
        let NullMount {
            dir,
            session,
            on_ring,
        } = self;
        let unmounted = session
            .umount_and_join()
            .map_err(|e| format!("unmounting {}: {e}", dir.display()));
        let _ = std::fs::remove_dir(&dir);
        let served = on_ring.load(Ordering::SeqCst);
        if ring && served < expected {
            return Err(format!(
                "the ring served {served} requests of {expected}: the kernel kept to /dev/fuse"
            ));
        }
        unmounted
    }
}

/// Sets the kernel's FUSE-over-io_uring switch to `on`; returns what it was.
fn set_uring_switch(on: bool) -> Result<bool, String> {
    let param = rmemfs::mount::ENABLE_URING;
    let was = std::fs::read_to_string(param).map_err(|e| format!("{param}: {e}"))?;
    std::fs::write(param, if on { "Y" } else { "N" }).map_err(|e| format!("{param}: {e}"))?;
    Ok(was.trim() == "Y")
}

/// A measured target: its key in the JSON summary, its row label, its read row's label.
struct Target {
    key: &'static str,
    label: &'static str,
    read_label: &'static str,
}

const NULL: Target = Target {
    key: "null",
    label: "null FUSE file system",
    read_label: "4K read, /dev/fuse",
};
const NULL_RING: Target = Target {
    key: "null_ring",
    label: "null, FUSE over io_uring",
    read_label: "4K read, io_uring",
};
const RMEMFS_KEY: &str = "rmemfs";

/// Measures the null file system through /dev/fuse and, with `uring`, through FUSE over
/// io_uring, alternating in rounds with `against` (a file on an rmemfs mount) if given; then
/// unmounts. Prints one row each; with `json`, also writes the figures there (getxattr and
/// 4 KiB read, per target key: `null`, `null_ring`, `rmemfs`), for the benchmark scripts.
pub fn run(
    iters: usize,
    threads: usize,
    against: Option<&Path>,
    uring: bool,
    json: Option<&Path>,
) -> Result<(), String> {
    let mut mounts = vec![(NULL, NullMount::mount("dev", threads, false)?)];
    if uring {
        let was = set_uring_switch(true)?;
        let ring = NullMount::mount("uring", threads, true);
        let _ = set_uring_switch(was);
        match ring {
            Ok(m) => mounts.push((NULL_RING, m)),
            Err(e) => {
                for (_, m) in mounts {
                    let _ = m.unmount(false, 0);
                }
                return Err(format!("FUSE over io_uring: {e}"));
            }
        }
    }
    let targets: Vec<(&str, &str, PathBuf)> = mounts
        .iter()
        .map(|(t, m)| (t.key, t.label, m.file()))
        .chain(against.map(|p| (RMEMFS_KEY, "rmemfs", p.to_path_buf())))
        .collect();
    let mut samples = vec![Vec::with_capacity(iters); targets.len()];
    // Reads on the null file systems only (an rmemfs file's reads are what is being floored).
    let mut read_samples = vec![Vec::with_capacity(iters); mounts.len()];
    let measured = (0..ROUNDS).try_for_each(|round| {
        targets
            .iter()
            .zip(samples.iter_mut())
            .try_for_each(|((_, _, path), all)| {
                all.extend(time_getxattr(path, iters.div_ceil(ROUNDS))?);
                Ok::<(), String>(())
            })?;
        mounts
            .iter()
            .zip(read_samples.iter_mut())
            .enumerate()
            .try_for_each(|(i, ((_, m), all))| {
                let seed = ((round * mounts.len() + i) as u64 + 1) * 0x9E37_79B9_7F4A_7C15;
                all.extend(time_read(&m.file(), iters.div_ceil(ROUNDS), seed)?);
                Ok::<(), String>(())
            })
    });
    let reads: Vec<(&str, &str)> = mounts.iter().map(|(t, _)| (t.key, t.read_label)).collect();
    let mut unmounted = Ok(());
    for (i, (_, m)) in mounts.into_iter().enumerate() {
        let r = m.unmount(i == 1, iters as u64);
        if unmounted.is_ok() {
            unmounted = r;
        }
    }
    measured?;
    unmounted?;
    println!(
        "# FUSE round trip: getxattr answered ENODATA, {iters} calls each in {ROUNDS} alternating \
         rounds, {threads} daemon threads"
    );
    println!(
        "{:<26} {:>9} {:>9} {:>9}",
        "file system", "p50 us", "p99 us", "mean us"
    );
    let mut getxattr = serde_json::Map::new();
    for ((key, label, _), us) in targets.iter().zip(samples) {
        getxattr.insert(key.to_string(), print_row(label, us));
    }
    println!(
        "# 4 KiB reads of the null file (zeros), each missing the page cache: {iters} each, in \
         the same rounds"
    );
    let mut read_4k = serde_json::Map::new();
    for ((key, label), us) in reads.into_iter().zip(read_samples) {
        read_4k.insert(key.to_string(), print_row(label, us));
    }
    if let Some(path) = json {
        let summary = serde_json::json!({"getxattr": getxattr, "read_4k": read_4k});
        std::fs::write(path, format!("{summary:#}\n"))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// One table row: p50, p99 and mean of `us`; returned as a JSON object too.
fn print_row(what: &str, mut us: Vec<f64>) -> serde_json::Value {
    us.sort_by(f64::total_cmp);
    let mean = us.iter().sum::<f64>() / us.len() as f64;
    let (p50, p99) = (
        crate::bench::percentile(&us, 0.5),
        crate::bench::percentile(&us, 0.99),
    );
    println!("{what:<26} {p50:>9.1} {p99:>9.1} {mean:>9.1}");
    serde_json::json!({"p50_us": p50, "p99_us": p99, "mean_us": mean})
}
