//! The FUSE adapter: the only module that touches fuser. Every handler calls `fs` and replies
//! exactly once, with the result or its errno.
//!
//! Its rooms follow the kernel's `fs/fuse`: `ops` is the dispatch table (fuser's
//! `Filesystem`), `contain` what every request goes through, `init` what the mount asks of
//! the kernel; `dir`, `file`, `attr`, `locks` and `ioctl` the requests of each concern;
//! `reply` the translations between the core's types and fuser's; `connection` the
//! connection around them (its abort, the kernel's cache invalidations).
//!
//! Every handler runs inside [`FuseFs::contain`]: a panic (a bug) fails that one request with
//! EIO (fuser answers EIO for a reply dropped unsent, and the unwinding drops it), is logged
//! with the request, and the worker goes on serving. Without it one bug ended the session and
//! took every file of the mount with it.

mod attr;
mod connection;
mod contain;
mod dir;
mod figures;
mod file;
mod init;
mod ioctl;
mod locks;
mod ops;
mod reply;

use crate::data::RequestBuffer;
use crate::error::Error;
use crate::fs::{Attr, Caller, Fs, SetAttr, SetTime};
use crate::meta::Kind;
pub use connection::FUSECTL;
pub use figures::{AdapterFigures, StatsSource, STATS_JSON_XATTR, STATS_XATTR};
use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType,
    Filesystem, FopenFlags, Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner,
    OpenFlags, PollEvents, PollFlags, PollNotifier, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLock, ReplyLseek,
    ReplyOpen, ReplyPoll, ReplyStatfs, ReplyStatx, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use ioctl::inode_flags_ioctl;
use reply::{
    caller, creator, empty, entry, errno, file_attr, file_type, nothing_to_sync, set_time, sync,
    xattr,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

/// Largest write request we ask the kernel for (its cap on current kernels is 1 MiB).
const MAX_WRITE: u32 = crate::config::IO_SIZE as u32;

/// The fuser file system: a thin shell around [`Fs`].
pub struct FuseFs {
    fs: Arc<Fs>,
    offers: Offers,
    /// What this adapter counts (see [`figures`]).
    figures: Arc<AdapterFigures>,
    /// The mount's report, for the root's stats attributes.
    report: StatsSource,
    /// The fuse control file system's `abort` file of this mount's connection, known once it
    /// is mounted ([`FuseFs::connection`]): how a failed io_uring queue ends the connection.
    abort_file: Arc<std::sync::OnceLock<std::path::PathBuf>>,
    /// How long the kernel may keep entries and attributes ([`crate::config::ATTR_TTL`];
    /// shorter on a shared volume).
    ttl: std::time::Duration,
    /// Each inode's FUSE generation on a connection kept across daemons (see
    /// `mount::keeper`); none: every generation is 0.
    generations: Option<Generations>,
    /// Lock requests waiting on their own threads, which an INTERRUPT ends.
    interrupts: Arc<locks::Interrupts>,
}

/// An inode's FUSE generation, by number.
pub type Generations = Box<dyn Fn(u64) -> u64 + Send + Sync>;

/// What the mount asks of the kernel at INIT beyond what it always asks.
#[derive(Debug, Clone, Copy)]
pub struct Offers {
    /// READDIRPLUS (`-o nordirplus`: no).
    pub readdirplus: bool,
    /// FUSE over io_uring (`-o io_uring`).
    pub io_uring: bool,
}

impl FuseFs {
    /// The adapter of `fs`, counting into `figures` and serving `report` (see [`figures`]).
    pub fn new(
        fs: Arc<Fs>,
        offers: Offers,
        figures: Arc<AdapterFigures>,
        report: StatsSource,
    ) -> FuseFs {
        let ttl = if fs.is_shared() {
            crate::config::SHARED_CACHE_TTL
        } else {
            crate::config::ATTR_TTL
        };
        FuseFs {
            fs,
            ttl,
            offers,
            figures,
            report,
            abort_file: Arc::default(),
            generations: None,
            interrupts: Arc::default(),
        }
    }

    /// Answers each inode's FUSE generation with `generations` (of its number).
    pub fn with_generations(mut self, generations: Generations) -> FuseFs {
        self.generations = Some(generations);
        self
    }

    /// Counts this adapter as served through /dev/fuse: a connection taken over sends no
    /// INIT, and a kept connection never uses io_uring.
    pub fn resumed_on_dev_fuse(&self) {
        let _ = self.figures.transport.set("/dev/fuse");
    }

    /// The FUSE generation of inode `ino`.
    fn generation(&self, ino: u64) -> u64 {
        self.generations.as_ref().map_or(0, |g| g(ino))
    }

    /// [`FuseFs::generation`], to hand to a reply.
    fn gen(&self) -> impl Fn(u64) -> u64 + '_ {
        move |ino| self.generation(ino)
    }
}
