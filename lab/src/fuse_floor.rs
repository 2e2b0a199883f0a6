//! `rmemfs-bench fuse-floor`: what FUSE's cheapest round trip costs on this machine.
//!
//! Several of #13's targets are bounded below by the kernel's FUSE round trip, which no
//! daemon can make cheaper: extracting a tree costs the requests the kernel sends per file,
//! and a 4 KiB read costs one request plus a fabric read. This measures that floor with a
//! null file system (fuser, no rmemfs code: one file, every `getxattr` answered ENODATA at
//! once, served by as many threads as an rmemfs mount has), and beside it the same request on
//! a file of a real rmemfs mount, so the difference is rmemfs's own per-request cost.

use fuser::{
    Errno, FileAttr, FileType, Filesystem, Generation, INodeNo, ReplyAttr, ReplyEntry, ReplyXattr,
    Request,
};
use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

/// Entries and attributes never expire here: only `getxattr` reaches the daemon.
const TTL: Duration = Duration::from_secs(3600);
/// FUSE's root inode number.
const ROOT_INO: u64 = 1;
/// The null file system's one file.
const FILE_NAME: &str = "f";
const FILE_INO: u64 = 2;
/// Untimed round trips before each round, so the switch from the other file system (and
/// thread start-up) is not measured.
const WARMUP: usize = 200;

/// One file, no data; every extended attribute is absent.
struct NullFs;

fn attr(ino: u64) -> FileAttr {
    let dir = ino == ROOT_INO;
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
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

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::from_i32(libc::ENODATA));
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

/// Mounts the null file system on a fresh directory and measures it, alternating in rounds
/// with `against` (a file on an rmemfs mount) if given; unmounts. Prints one row each.
pub fn run(iters: usize, threads: usize, against: Option<&Path>) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("rmemfs-fuse-floor.{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("rmemfs-null".into()),
        fuser::MountOption::DefaultPermissions,
    ];
    config.n_threads = Some(threads.max(1));
    config.clone_fd = threads > 1;
    let null = fuser::spawn_mount(NullFs, &dir, &config).map_err(|e| {
        format!(
            "cannot mount the null file system on {}: {e}",
            dir.display()
        )
    });
    let targets: Vec<(&str, std::path::PathBuf)> =
        std::iter::once(("null FUSE file system", dir.join(FILE_NAME)))
            .chain(against.map(|p| ("rmemfs", p.to_path_buf())))
            .collect();
    let measured = null.and_then(|session| {
        let mut samples = vec![Vec::with_capacity(iters); targets.len()];
        let r = (0..ROUNDS).try_for_each(|_| {
            targets
                .iter()
                .zip(samples.iter_mut())
                .try_for_each(|((_, path), all)| {
                    all.extend(time_getxattr(path, iters.div_ceil(ROUNDS))?);
                    Ok::<(), String>(())
                })
        });
        if let Err(e) = session.umount_and_join() {
            eprintln!("rmemfs-bench: unmounting {}: {e}", dir.display());
        }
        r.map(|()| samples)
    });
    let _ = std::fs::remove_dir(&dir);
    let samples = measured?;
    println!(
        "# FUSE round trip: getxattr answered ENODATA, {iters} calls each in {ROUNDS} alternating \
         rounds, {threads} daemon threads"
    );
    println!(
        "{:<24} {:>9} {:>9} {:>9}",
        "file system", "p50 us", "p99 us", "mean us"
    );
    for ((what, _), mut us) in targets.iter().zip(samples) {
        us.sort_by(f64::total_cmp);
        let mean = us.iter().sum::<f64>() / us.len() as f64;
        println!(
            "{:<24} {:>9.1} {:>9.1} {:>9.1}",
            what,
            crate::bench::percentile(&us, 0.5),
            crate::bench::percentile(&us, 0.99),
            mean
        );
    }
    Ok(())
}
