//! The POSIX core: file system semantics over the namespace (`meta`) and remote data (`data`).
//!
//! Testable without FUSE: every operation takes plain arguments and returns plain structs or an
//! errno-carrying [`Error`]; `fuse.rs` is a thin adapter. Locking: one mutex guards the
//! namespace and is only held for in-memory work; a file's extent map has its own lock, held
//! across the remote I/O that uses it, so no network round trip ever happens under the metadata
//! lock and I/O on different files runs in parallel. Every change to the namespace goes
//! through one [`crate::meta::Batch`] per operation.
//!
//! The rooms, by POSIX concern (as the kernel's `fs/fuse`): [`rules`] (callers, set-ID bits,
//! inode flags, access times), [`names`] (lookup, make, link, unlink, rename), [`attr`]
//! (attributes, symlinks, `access`), [`file`] (handles, read, write, seek), [`fallocate`],
//! [`dir`] (directory streams), [`xattr`] (extended attributes by handler), [`capacity`]
//! (`statfs`, write-through decisions).
//!
//! Permission checks are the kernel's (the mount uses `default_permissions`); [`Fs::access`]
//! answers explicit `access(2)` calls from the same rules.

pub mod acl;
mod attr;
mod capacity;
mod dir;
pub mod dirty_limit;
mod fallocate;
mod file;
mod follow;
mod freeze;
mod handles;
mod hooks;
mod locks;
mod names;
mod overwrite;
mod redundancy;
mod rules;
mod turns;
mod types;
mod whole;
mod xattr;

pub use capacity::placeable_chunks;
pub use follow::{Invalidate, Invalidation};
pub use freeze::{ChangeAdmitted, Frozen};
pub use hooks::{Barrier, JournalStats, JournalView, VolumeHooks};
pub use locks::{FileLock, HeldLock, LockKeeper, LockKind, LockType};
pub use redundancy::REDUNDANCY_XATTR;
pub use rules::{
    access_flags_name, Atime, Caller, FS_APPEND_FL, FS_IMMUTABLE_FL, FS_NOATIME_FL, FS_NODUMP_FL,
    INODE_FLAGS,
};
pub use turns::{turns_in_order, HeldTurn, KernelTold, Turns, CHANGE_WAIT};
pub use types::{Attr, DirEntry, OpenMode, SetAttr, SetTime, StatFs};
#[cfg(feature = "testing")]
pub use xattr::INJECT_PANIC_XATTR;
pub use xattr::PLACEMENT_XATTR;

use crate::data::{DataStore, FileIo};
use crate::error::{Error, Result};
use crate::meta::{Batch, Body, Dir, FileData, Ino, Inode, Kind, Meta, NAME_MAX};
use crate::sync::atomic::AtomicU64;
use crate::sync::{Arc, Mutex, MutexGuard};
use std::collections::HashMap;

/// `rename` flags.
pub const RENAME_NOREPLACE: u32 = 1;
pub const RENAME_EXCHANGE: u32 = 2;
/// Leave a whiteout (a 0/0 character device) where the source was: overlayfs's upper layer
/// needs it to delete and rename.
pub const RENAME_WHITEOUT: u32 = 4;

/// The block size the file system reports (`st_blksize`, `statfs`): the unit of its
/// allocation-shaped interfaces (collapse and insert ranges, SEEK_HOLE) where chunks are too
/// coarse for programs.
pub const BLOCK: u64 = 4096;

struct Handle {
    ino: Ino,
    mode: OpenMode,
}

/// Settings of a file system instance.
#[derive(Debug, Clone, Default)]
pub struct FsConfig {
    pub root_uid: u32,
    pub root_gid: u32,
    pub read_only: bool,
    pub atime: Atime,
    /// Directory reads update the directory's access time (`-o nodiratime`: no).
    pub dir_atime: bool,
    /// `atime` and `dir_atime` hold whatever the mount's flags become (a shared volume's
    /// namespace keeps no access times: its reads take no turn).
    pub fixed_access_times: bool,
    /// POSIX ACLs kept and kept in step with modes (`-o noacl`: off).
    pub acl: bool,
    /// The kernel's writeback cache is on: it owns file sizes and append positions, writes
    /// whole pages back later (a write-only handle then also serves the reads that fill a
    /// partly written page), and flushes before `fsync` and `close` return.
    pub writeback: bool,
    /// Under the writeback cache, free pool bytes below which new handles write through
    /// (see [`Fs::direct_writes`]).
    pub writeback_low_water: u64,
}

/// A callback for attribute changes the caller did not make itself.
pub type AttrChanged = Box<dyn Fn(Ino) + Send + Sync>;

/// The file system.
pub struct Fs {
    /// Shared only with a volume's journal, weakly (see [`hooks::JournalView`]).
    meta: Arc<Mutex<Meta>>,
    data: Arc<DataStore>,
    handles: Mutex<HashMap<u64, Handle>>,
    /// Told of attribute changes the kernel did not ask for (set-ID bits a write drops, the
    /// ctime an inode-flag ioctl moves), so it can forget its cached copy (the FUSE adapter
    /// sends an invalidation). Set once the FUSE session exists, which needs the file system.
    attr_changed: std::sync::OnceLock<AttrChanged>,
    /// Where a follower's invalidations go (see [`follow`]): the FUSE session, made after
    /// the file system.
    invalidate: std::sync::OnceLock<Invalidate>,
    /// Where a shared volume's changes wait their turn (see [`freeze`]).
    turns: Option<Box<dyn Turns>>,
    /// Where a shared volume's file locks are kept (see [`locks`]; none: by the kernel).
    locks: Option<Box<dyn LockKeeper>>,
    /// The mount's dirty limit: known only once the mount has its device (see
    /// [`Fs::direct_writes`]).
    dirty_limit: std::sync::OnceLock<crate::fs::dirty_limit::DirtyLimit>,
    /// The volume's barrier for `fsync` (none: no volume; see [`hooks`]).
    barrier: Option<Arc<dyn Barrier>>,
    /// Open directory streams: the listing each one reads (see [`Fs::readdir`]).
    dir_streams: Mutex<HashMap<u64, dir::Listing>>,
    /// Files whose overwrite mark is set but not yet known committed (see [`overwrite`]).
    marks_in_flight: Mutex<std::collections::HashSet<Ino>>,
    /// The next handle number to issue (see [`handles`]).
    next_fh: AtomicU64,
    /// Handle numbers below this were issued by an earlier daemon of this FUSE connection.
    handle_base: AtomicU64,
    /// Held shared by each change, exclusively by a freeze (see [`freeze`]).
    change_gate: crate::sync::RwLock<()>,
    config: FsConfig,
    /// When reads move access times now (see [`rules::AccessTimes`]).
    access_times: rules::AccessTimes,
    /// The operation whose next call panics on purpose (tests of fault containment).
    #[cfg(feature = "testing")]
    armed_panic: Mutex<Option<String>>,
}

/// How many times a shared volume's drop of an inode is decided again after losing to other
/// clients' changes of it (each loss is another client's change landing first).
const SETTLE_TRIES: usize = 8;

fn err(errno: i32) -> Error {
    Error::new(errno, std::io::Error::from_raw_os_error(errno).to_string())
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
        return Err(err(libc::EINVAL));
    }
    if name.len() > NAME_MAX {
        return Err(err(libc::ENAMETOOLONG));
    }
    Ok(())
}

fn attr_of(ino: Ino, i: &Inode) -> Attr {
    // The remote memory a file's chunks hold (holes hold none), from the count kept beside
    // the map: the map's lock is taken before the metadata lock elsewhere, so it must not be
    // taken under it. Other inodes hold no remote memory.
    let blocks = i.file().map_or(0, |f| f.held().div_ceil(512));
    Attr {
        ino,
        kind: i.kind,
        perm: i.perm,
        nlink: i.nlink,
        uid: i.uid,
        gid: i.gid,
        rdev: i.rdev,
        size: i.size,
        blocks,
        atime: i.atime,
        mtime: i.mtime,
        ctime: i.ctime,
        btime: i.btime,
    }
}

fn new_inode(kind: Kind, perm: u16, caller: Caller, body: Body) -> Inode {
    Inode::new(kind, perm, caller.uid, caller.gid, body)
}

/// The data of file `ino` in `meta` (EISDIR for a directory, EINVAL for another kind).
fn file_in(meta: &Meta, ino: Ino) -> Result<Arc<FileData>> {
    let i = inode(meta, ino)?;
    match (&i.body, i.kind) {
        (Body::File(f), _) => Ok(f.clone()),
        (_, Kind::Dir) => Err(err(libc::EISDIR)),
        _ => Err(err(libc::EINVAL)),
    }
}

/// Inode `ino`: ENOENT if the table lacks it, or, in a partial table (which may not hold it
/// yet), [`Error::unloaded`].
fn inode(meta: &Meta, ino: Ino) -> Result<&Inode> {
    meta.get(ino).ok_or_else(|| match meta.is_partial() {
        true => Error::unloaded(ino),
        false => err(libc::ENOENT),
    })
}

/// Directory `ino` with its names ([`Error::unloaded`] where a partial table does not hold
/// them).
fn dir_of(meta: &Meta, ino: Ino) -> Result<&Dir> {
    let d = inode(meta, ino)?.dir().ok_or_else(|| err(libc::ENOTDIR))?;
    match meta.names_unloaded(ino) {
        true => Err(Error::unloaded(ino)),
        false => Ok(d),
    }
}

impl Fs {
    pub fn new(data: DataStore, config: FsConfig) -> Fs {
        let meta = Meta::new(0o755, config.root_uid, config.root_gid);
        Fs::with_meta(data, config, meta)
    }

    /// A file system over a namespace built already (a volume's, replayed).
    pub fn with_meta(data: DataStore, config: FsConfig, meta: Meta) -> Fs {
        Fs {
            barrier: None,
            meta: Arc::new(Mutex::new(meta)),
            data: Arc::new(data),
            handles: Mutex::new(HashMap::new()),
            dir_streams: Mutex::new(HashMap::new()),
            marks_in_flight: Mutex::new(Default::default()),
            dirty_limit: std::sync::OnceLock::new(),
            attr_changed: std::sync::OnceLock::new(),
            invalidate: std::sync::OnceLock::new(),
            turns: None,
            locks: None,
            next_fh: AtomicU64::new(1 << 4),
            handle_base: AtomicU64::new(0),
            change_gate: crate::sync::RwLock::new(()),
            access_times: rules::AccessTimes::new(config.atime, config.dir_atime),
            config,
            #[cfg(feature = "testing")]
            armed_panic: Mutex::new(None),
        }
    }

    /// Panics here if a test armed a panic for `op` (see [`INJECT_PANIC_XATTR`]).
    #[cfg(feature = "testing")]
    pub(crate) fn fault_point(&self, op: &str) {
        let mut armed = self.armed_panic.lock();
        if armed.as_deref() == Some(op) {
            *armed = None;
            drop(armed);
            panic!("fault injected into {op}");
        }
    }

    #[cfg(not(feature = "testing"))]
    pub(crate) fn fault_point(&self, _op: &str) {}

    pub fn data(&self) -> &DataStore {
        &self.data
    }

    pub fn config(&self) -> &FsConfig {
        &self.config
    }

    fn writable(&self) -> Result<()> {
        if self.config.read_only {
            Err(err(libc::EROFS))
        } else {
            Ok(())
        }
    }

    /// Number of inodes (files, directories...) in the table.
    pub fn inode_count(&self) -> usize {
        self.meta.lock().len()
    }

    /// Batches of changes the namespace committed, and the changes in them.
    pub fn commits(&self) -> (u64, u64) {
        let meta = self.meta.lock();
        (meta.commits(), meta.changes())
    }

    /// The namespace described for comparison (see [`Meta::digest`]); each file's chunk map
    /// is read after the table's lock is released (chunk locks come first).
    pub fn namespace_digest(&self) -> crate::meta::Digest {
        let (mut digest, files) = self.meta.lock().digest_without_chunks();
        crate::meta::add_chunks(&mut digest, &files);
        digest
    }

    /// Sends the namespace's committed batches to `journal` from now on.
    pub fn set_journal(&self, journal: Box<dyn crate::meta::Journal>) {
        self.meta.lock().set_journal(journal);
    }

    /// Commits `b`, with the chunk changes `io` logged for file `ino` (if any).
    /// If the namespace refuses the batch, the chunk changes are undone with the rest of it.
    fn commit_with(mut b: Batch<'_>, ino: Ino, io: &mut FileIo<'_>) -> Result<()> {
        let log = io.take_log();
        if !log.is_empty() {
            b.extents(ino, log.clone());
        }
        b.commit().inspect_err(|_| io.undo(&log))
    }

    /// [`Self::commit_with`] of a write that succeeded: when its chunk changes keep every
    /// chunk (made, grown or with a copy fewer, none dropped or encoded), the journal may hold
    /// the batch back ([`crate::meta::Journal::record_write`]), and the memory the write let
    /// go of goes back only once the batch is recorded.
    ///
    /// On a shared volume a write answered before its bytes were sent (`data::behind`) is sent
    /// before any append names its chunks: now, by this writer, when the change is appended at
    /// once, or by whoever appends it when it is held back
    /// ([`crate::meta::Journal::record_write`]).
    fn commit_write_with(
        &self,
        mut b: Batch<'_>,
        ino: Ino,
        file: &Arc<FileData>,
        io: &mut FileIo<'_>,
    ) -> Result<()> {
        let log = io.take_log();
        let keeps_chunks = log
            .iter()
            .all(|e| e.chunk.as_ref().is_some_and(|c| c.stripe().is_none()));
        if !log.is_empty() {
            b.extents(ino, log.clone());
        }
        // Only a shared volume holds writes back: elsewhere the write's frees stay where they
        // were (when its `FileIo` goes, after the table's lock).
        let committed = match (keeps_chunks, self.is_shared()) {
            (true, true) => {
                let then = io.free_once_recorded();
                let mut send_now = || io.send_waiting();
                let unsent = self
                    .data
                    .send_later(file)
                    .map(|later| crate::meta::UnsentWrite {
                        now: &mut send_now,
                        later,
                    });
                b.commit_write(ino, then, unsent)
            }
            (true, false) => b.commit_write(ino, Box::new(|| {}), None),
            (false, shared) => {
                if shared {
                    io.send_waiting();
                }
                b.commit()
            }
        };
        committed.inspect_err(|_| io.undo(&log))
    }

    /// Hands the chunk changes of file `ino` to the namespace in a batch of their own (for
    /// changes made outside an operation on the file: rebuild, forgetting a server).
    pub fn commit_extents(&self, ino: Ino, io: &mut FileIo<'_>) {
        let log = io.take_log();
        if log.is_empty() {
            return;
        }
        let mut meta = self.meta.lock();
        let mut b = meta.batch();
        b.extents(ino, log.clone());
        if let Err(e) = b.commit() {
            log::error!("the namespace refused chunk changes of inode {ino}: {e}");
            io.undo(&log);
        }
    }

    /// Releases an inode's data if it became an orphan, and drops it from the table once the
    /// kernel has forgotten it too. Data is freed outside the metadata lock.
    fn settle(&self, meta: MutexGuard<'_, Meta>, ino: Ino) {
        if !self.settle_once(meta, ino) {
            return;
        }
        // A shared volume's drop lost to another client's change of the inode: decided
        // again on a table caught up (a few times: each loss means another client moved on).
        for _ in 0..SETTLE_TRIES {
            self.refresh_shared();
            if !self.settle_once(self.meta.lock(), ino) {
                return;
            }
        }
        log::error!("inode {ino}: its drop kept losing to other clients' changes");
    }

    /// [`Fs::settle`] once; true if a shared volume's engine refused the drop as decided on
    /// a stale view (nothing done: decide again).
    fn settle_once(&self, mut meta: MutexGuard<'_, Meta>, ino: Ino) -> bool {
        let orphan_file = match meta.get(ino) {
            Some(i) if i.is_orphan() => i.file().cloned(),
            _ => None,
        };
        let (dropped, refused) = {
            let mut b = meta.batch();
            let dropped = b.drop_if_unused(ino);
            let refused = match dropped.then(|| b.commit()) {
                Some(Err(e)) if e.conflict.is_some() => return true,
                // Open on another client of a shared volume: it drops it once it lets go.
                Some(Err(e)) if e.held_elsewhere.is_some() => true,
                Some(Err(e)) => {
                    log::error!("the namespace refused to drop inode {ino}: {e}");
                    true
                }
                _ => false,
            };
            (dropped, refused)
        };
        drop(meta);
        if refused {
            // Nothing committed says its chunks are gone: their memory stays (collected at
            // the next attach if nothing names it then).
            return false;
        }
        match orphan_file {
            // Its drop, committed, names its chunks gone.
            Some(f) if dropped => self.data.release_all(&f),
            // Kept for the kernel: the chunks leave in a committed batch of their own before
            // their memory is given back (dropping the lock frees it, held by a volume's
            // journal until that batch commits). On a shared volume, in the file's turn.
            // On a shared volume, a file with no chunks has nothing to let go (a create's
            // empty file): no turn taken for it.
            Some(f) if self.is_shared() && f.chunks.read().is_empty() => {}
            // Open on another client: its data stays for it (that client settles it).
            Some(_) if self.open_elsewhere(ino) => {}
            Some(f) => {
                let _turn = match self.file_turn(ino) {
                    Ok(turn) => turn,
                    Err(e) => {
                        log::error!("inode {ino}'s chunks stay: {e}");
                        return false;
                    }
                };
                let mut io = self.data.lock_discarding(&f);
                io.release_all();
                self.commit_extents(ino, &mut io);
            }
            None => {}
        }
        false
    }

    /// Whether another client of a shared volume has file `ino` open (unknown: yes, so that
    /// its data stays).
    fn open_elsewhere(&self, ino: Ino) -> bool {
        match self.turns.as_deref().map(|t| t.open_elsewhere(ino)) {
            None | Some(Ok(false)) => false,
            Some(Ok(true)) => true,
            Some(Err(e)) => {
                log::warn!("inode {ino}'s data stays: {e}");
                true
            }
        }
    }

    fn file_data(&self, ino: Ino) -> Result<Arc<FileData>> {
        file_in(&self.meta.lock(), ino)
    }

    /// Reads the namespace under its lock (a volume's checkpoint takes its image so).
    pub fn inspect_meta<R>(&self, f: impl FnOnce(&Meta) -> R) -> R {
        f(&self.meta.lock())
    }

    /// Whether inode `ino` has a handle open here.
    pub fn is_open_here(&self, ino: Ino) -> bool {
        self.meta.lock().get(ino).is_some_and(|i| i.opens > 0)
    }

    /// Settles inode `ino`: its data goes if it has no name and no handle, and it leaves the
    /// table once the kernel has forgotten it too (a shared volume's file another client had
    /// open, let go).
    pub fn settle_unused(&self, ino: Ino) {
        self.settle(self.meta.lock(), ino);
    }

    /// Drops the inodes that have no name and no handle (a replayed volume's files unlinked
    /// while open when its daemon died), releasing their data; how many.
    pub fn reap_orphans(&self) -> usize {
        let orphans = self.meta.lock().orphans();
        for &ino in &orphans {
            self.settle(self.meta.lock(), ino);
        }
        orphans.len()
    }

    /// Applies `changes` to the namespace outside any journal (an import, before the
    /// volume's first checkpoint, which then holds them). Chunk changes are not applied: the
    /// data comes through [`Fs::load_data`].
    pub fn load_image(&self, changes: &[crate::meta::Change]) -> Result<()> {
        let mut meta = self.meta.lock();
        for c in changes {
            // An overwrite mark is the exporting holder's bookkeeping, not the namespace's.
            let c = match c {
                crate::meta::Change::Extent { .. } => continue,
                crate::meta::Change::Make {
                    ino,
                    kind,
                    attrs,
                    seed,
                    xattrs,
                } => &crate::meta::Change::Make {
                    ino: *ino,
                    kind: *kind,
                    attrs: crate::meta::Attrs {
                        overwriting: false,
                        ..*attrs
                    },
                    seed: seed.clone(),
                    xattrs: xattrs.clone(),
                },
                other => other,
            };
            meta.apply(c)?;
        }
        Ok(())
    }

    /// Writes `bytes` at `offset` of file `ino` without changing its attributes (an import:
    /// the size came with the namespace).
    pub fn load_data(&self, ino: Ino, offset: u64, bytes: &[u8]) -> Result<()> {
        let file = self.file_data(ino)?;
        let mut io = self.data.lock(&file);
        let res = io.write(offset, crate::data::Payload::Copy(bytes));
        self.commit_extents(ino, &mut io);
        res
    }

    /// `fsync` of `ino`: its writes answered before they were sent are sent (and the failure
    /// of one reported), then [`Self::sync`]. `None` when there is nothing to wait for (no
    /// write-behind and no volume).
    pub fn fsync(&self, ino: Ino) -> Option<Result<()>> {
        if self.data.writes_behind() {
            if let Ok(f) = self.file_data(ino) {
                if let Err(e) = self.data.sync_file(&f) {
                    return Some(Err(e));
                }
            }
            return Some(self.sync().unwrap_or(Ok(())));
        }
        self.sync()
    }

    pub fn acl_enabled(&self) -> bool {
        self.config.acl
    }

    pub fn writeback_enabled(&self) -> bool {
        self.config.writeback
    }

    /// Sets the callback for attribute changes the kernel did not make (once; later calls
    /// are ignored).
    pub fn on_attr_changed(&self, tell: AttrChanged) {
        let _ = self.attr_changed.set(tell);
    }

    fn tell_attr_changed(&self, ino: Ino) {
        if let Some(tell) = self.attr_changed.get() {
            tell(ino);
        }
    }
}
