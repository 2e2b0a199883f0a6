//! The POSIX core: file system semantics over local metadata (`meta`) and remote data (`data`).
//!
//! Testable without FUSE: every operation takes plain arguments and returns plain structs or an
//! errno-carrying [`Error`]; `fuse.rs` is a thin adapter. Locking: one mutex guards the
//! metadata and is only held for in-memory work; a file's extent map has its own lock, held
//! across the remote I/O that uses it, so no network round trip ever happens under the metadata
//! lock and I/O on different files runs in parallel.
//!
//! Permission checks are the kernel's (the mount uses `default_permissions`); [`Fs::access`]
//! answers explicit `access(2)` calls from the same rules.

use crate::data::{DataStore, Payload, ReadBuf};
use crate::error::{Error, Result};
use crate::fuse::RequestBuffer;
use crate::meta::{Body, Dir, FileData, Ino, Inode, Kind, Meta, NAME_MAX, ROOT_INO};
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::{Arc, Mutex};
use std::collections::HashMap;
use std::time::SystemTime;

/// Attributes of an inode, as `stat` shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: Kind,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub size: u64,
    /// 512-byte blocks (from the size: holes are not told apart).
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    /// Birth time: when the inode was made.
    pub btime: SystemTime,
}

/// The caller of an operation (owner of what it creates).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// The calling process (0: none known), whose supplementary groups count as its groups.
    pub pid: u32,
    /// The creating process's umask (creations only), applied unless the directory's
    /// default ACL decides the new inode's permissions.
    pub umask: u32,
    /// The caller keeps set-ID bits across a write or truncate (CAP_FSETID). The kernel
    /// says so for writes (FUSE_WRITE_KILL_SUIDGID absent); FUSE passes no capabilities
    /// otherwise, and root stands in for it.
    pub cap_fsetid: bool,
}

impl Caller {
    pub fn privileged(&self) -> bool {
        self.cap_fsetid
    }

    /// Whether the caller is in group `gid`: its own, or one of its process's supplementary
    /// groups (read from /proc; only asked in the rare case that needs it).
    pub fn in_group(&self, gid: u32) -> bool {
        if self.gid == gid {
            return true;
        }
        if self.pid == 0 {
            return false;
        }
        let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", self.pid)) else {
            return false;
        };
        status
            .lines()
            .find_map(|l| l.strip_prefix("Groups:"))
            .is_some_and(|g| g.split_whitespace().any(|x| x.parse() == Ok(gid)))
    }
}

const S_ISUID: u16 = 0o4000;
const S_ISGID: u16 = 0o2000;
const S_IXGRP: u16 = 0o0010;

/// A set-group-ID directory `parent` hands its group to what is made in it, and its
/// set-group-ID bit to subdirectories (the kernel already stripped the bit from a requested
/// mode the caller may not have).
fn inherit_group(parent: &Inode, inode: &mut Inode) {
    if parent.perm & S_ISGID != 0 {
        inode.gid = parent.gid;
        if inode.kind == Kind::Dir {
            inode.perm |= S_ISGID;
        }
    }
}

/// The set-ID bits a write (or fallocate) by an unprivileged caller clears, as the kernel's
/// `setattr_should_drop_suidgid`: set-user-ID always; set-group-ID when the file is
/// group-executable, or when the caller is not in the file's group (`in_group`, asked only
/// then).
fn set_id_bits_to_drop(perm: u16, caller: &Caller, in_group: impl FnOnce() -> bool) -> u16 {
    if caller.privileged() {
        return 0;
    }
    let mut drop = perm & S_ISUID;
    if perm & S_ISGID != 0 && (perm & S_IXGRP != 0 || !in_group()) {
        drop |= S_ISGID;
    }
    drop
}

/// A time to set with `setattr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTime {
    Now,
    At(SystemTime),
}

/// The changes of a `setattr` call.
#[derive(Debug, Clone, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    /// The change time the kernel gives (it keeps a regular file's mtime and ctime itself
    /// under the writeback cache, and sends both when it sets or writes back times); none:
    /// the time of this call.
    pub ctime: Option<SystemTime>,
}

/// One `readdir` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: Ino,
    /// The offset to resume after this entry.
    pub offset: u64,
    pub kind: Kind,
    pub name: Vec<u8>,
}

/// File system capacity for `statfs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatFs {
    pub block_size: u32,
    pub blocks: u64,
    pub blocks_free: u64,
    pub files: u64,
    pub files_free: u64,
    pub name_max: u32,
}

/// Open flags that matter here.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenMode {
    pub read: bool,
    pub write: bool,
    pub append: bool,
    pub truncate: bool,
}

impl OpenMode {
    /// From `open(2)` flags.
    pub fn from_flags(flags: i32) -> OpenMode {
        let acc = flags & libc::O_ACCMODE;
        OpenMode {
            read: acc == libc::O_RDONLY || acc == libc::O_RDWR,
            write: acc == libc::O_WRONLY || acc == libc::O_RDWR,
            append: flags & libc::O_APPEND != 0,
            truncate: flags & libc::O_TRUNC != 0,
        }
    }
}

/// `rename` flags.
pub const RENAME_NOREPLACE: u32 = 1;
pub const RENAME_EXCHANGE: u32 = 2;
/// Leave a whiteout (a 0/0 character device) where the source was: overlayfs's upper layer
/// needs it to delete and rename.
pub const RENAME_WHITEOUT: u32 = 4;

/// A virtual attribute of the root directory: reading it returns the live counters
/// (`rmemfs stats MOUNTPOINT` does). Not listed by `listxattr`.
pub const STATS_XATTR: &[u8] = b"user.rmemfs.stats";
/// The same counters as one JSON object (`rmemfs stats --json`), for scripts.
pub const STATS_JSON_XATTR: &[u8] = b"user.rmemfs.stats.json";
/// A virtual attribute of a regular file: where each chunk's copies are, as JSON
/// (`[[chunk index, [server address, ...]], ...]`). A fault test reads it before it kills a
/// server, to name the chunks that server alone holds. Not listed by `listxattr`.
pub const PLACEMENT_XATTR: &[u8] = b"user.rmemfs.placement";

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

/// When reading updates an access time. The kernel leaves atime to a FUSE file system
/// (its inodes are S_NOATIME), so it is kept here, by the mount's `-o` choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Atime {
    /// `relatime` (Linux's default): when the access time is not after the last
    /// modification or change, or is a day old; `atime` (without `strictatime`) means this.
    #[default]
    Relative,
    /// `strictatime`: on every read.
    Strict,
    /// `noatime`.
    Never,
}

impl Atime {
    /// Whether a read at `now` updates the access time of `i`.
    fn due(self, i: &Inode, now: SystemTime) -> bool {
        /// relatime's limit: an access time older than this is updated anyway.
        const DAY: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
        match self {
            Atime::Never => false,
            Atime::Strict => true,
            Atime::Relative => {
                // The kernel's relatime_need_update, which counts a day in whole seconds.
                let secs = |t: SystemTime| match t.duration_since(SystemTime::UNIX_EPOCH) {
                    Ok(d) => d.as_secs() as i128,
                    Err(e) => {
                        let d = e.duration();
                        -(d.as_secs() as i128) - i128::from(d.subsec_nanos() > 0)
                    }
                };
                i.atime <= i.mtime
                    || i.atime <= i.ctime
                    || secs(now) - secs(i.atime) >= DAY.as_secs() as i128
            }
        }
    }
}

/// What one directory stream lists: the entries (cookie, name) the directory had when the
/// stream was opened or rewound, shared by its reads.
type Listing = Option<std::sync::Arc<Vec<(u64, crate::meta::Name)>>>;

/// The most chunks that fit, each with `copies` copies on distinct servers, when server `i`
/// has room for `per_server[i]` chunks: the largest `n` with `sum(min(room, n)) >= copies * n`
/// (a server can hold at most one copy of each chunk).
pub fn placeable_chunks(per_server: &[u64], copies: u64) -> u64 {
    let fits = |n: u64| {
        per_server
            .iter()
            .map(|&r| r.min(n))
            .fold(0u64, u64::saturating_add)
            >= copies.saturating_mul(n)
    };
    let (mut lo, mut hi) = (0u64, per_server.iter().sum::<u64>() / copies.max(1));
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// A callback for attribute changes the caller did not make itself.
pub type AttrChanged = Box<dyn Fn(Ino) + Send + Sync>;

/// The file system.
pub struct Fs {
    meta: Mutex<Meta>,
    data: DataStore,
    handles: Mutex<HashMap<u64, Handle>>,
    /// Told of attribute changes the kernel did not ask for (set-ID bits a write drops, the
    /// ctime an inode-flag ioctl moves), so it can forget its cached copy (the FUSE adapter
    /// sends an invalidation).
    attr_changed: std::sync::OnceLock<AttrChanged>,
    /// Requests the FUSE adapter answered, per operation (`stats`).
    requests: crate::requests::RequestStats,
    /// How the kernel's requests reach the adapter, as INIT settled it (`stats`).
    fuse_transport: std::sync::OnceLock<&'static str>,
    /// The mount's dirty limit, once it is mounted (see [`Fs::direct_writes`]).
    dirty_limit: std::sync::OnceLock<crate::dirty_limit::DirtyLimit>,
    /// Open directory streams: the listing each one reads (see [`Fs::readdir`]).
    dir_streams: Mutex<HashMap<u64, Listing>>,
    next_fh: AtomicU64,
    config: FsConfig,
    /// Requests whose handler panicked (answered EIO by the FUSE adapter).
    contained_panics: AtomicU64,
    /// What the background rebuild has done.
    rebuild: crate::rebuild::RebuildStats,
    /// Panics of the upkeep threads (heartbeat, reconnect, rebuild), each contained.
    upkeep_panics: crate::rebuild::UpkeepPanics,
    /// The operation whose next call panics on purpose (tests of fault containment).
    #[cfg(feature = "testing")]
    armed_panic: Mutex<Option<String>>,
}

/// Setting this extended attribute (any file, value = an operation: `read` or `write`) makes
/// the next such call panic inside the file system, holding the file's lock; value = an
/// upkeep thread (`heartbeat`, `reconnect`, `rebuild`): its next round panics. Compiled only
/// with the `testing` feature.
#[cfg(feature = "testing")]
pub const INJECT_PANIC_XATTR: &[u8] = b"user.rmemfs.inject-panic";

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
    let now = crate::meta::now();
    Inode {
        kind,
        perm,
        uid: caller.uid,
        gid: caller.gid,
        nlink: if kind == Kind::Dir { 2 } else { 1 },
        rdev: 0,
        size: 0,
        atime: now,
        mtime: now,
        ctime: now,
        btime: now,
        lookups: 0,
        opens: 0,
        body,
        xattrs: None,
        flags: 0,
        tmpfile: false,
    }
}

/// `chattr +i`: no change to the inode, its data or (for a directory) its entries.
pub const FS_IMMUTABLE_FL: u32 = 0x10;
/// `chattr +a`: data only appended; the inode stays (no unlink, rename, truncate).
pub const FS_APPEND_FL: u32 = 0x20;
/// `chattr +d`: skipped by dump(8); kept, meaning nothing here.
pub const FS_NODUMP_FL: u32 = 0x40;
/// `chattr +A`: reads leave the access time alone.
pub const FS_NOATIME_FL: u32 = 0x80;
/// The inode flags kept and honoured; setting any other is EOPNOTSUPP, as on tmpfs.
pub const INODE_FLAGS: u32 = FS_IMMUTABLE_FL | FS_APPEND_FL | FS_NODUMP_FL | FS_NOATIME_FL;

/// EPERM for an immutable or append-only inode: what neither may undergo (unlink, rename,
/// link, truncation, attribute and extended attribute changes), as the kernel's VFS
/// refuses for file systems that keep these flags in the inode.
fn check_mutable(i: &Inode) -> Result<()> {
    if i.flags & (FS_IMMUTABLE_FL | FS_APPEND_FL) != 0 {
        return Err(Error::new(
            libc::EPERM,
            "the inode is immutable or append-only (chattr)",
        ));
    }
    Ok(())
}

/// EPERM for an immutable inode (no data or entry changes at all).
fn check_not_immutable(i: &Inode) -> Result<()> {
    if i.flags & FS_IMMUTABLE_FL != 0 {
        return Err(Error::new(
            libc::EPERM,
            "the inode is immutable (chattr +i)",
        ));
    }
    Ok(())
}

impl Fs {
    pub fn new(data: DataStore, config: FsConfig) -> Fs {
        Fs {
            meta: Mutex::new(Meta::new(0o755, config.root_uid, config.root_gid)),
            data,
            handles: Mutex::new(HashMap::new()),
            dir_streams: Mutex::new(HashMap::new()),
            requests: Default::default(),
            fuse_transport: std::sync::OnceLock::new(),
            dirty_limit: std::sync::OnceLock::new(),
            attr_changed: std::sync::OnceLock::new(),
            next_fh: AtomicU64::new(1),
            config,
            contained_panics: AtomicU64::new(0),
            rebuild: Default::default(),
            upkeep_panics: Default::default(),
            #[cfg(feature = "testing")]
            armed_panic: Mutex::new(None),
        }
    }

    /// Counts a request whose handler panicked and was answered with EIO.
    pub fn count_contained_panic(&self) {
        self.contained_panics.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests whose handler panicked so far.
    pub fn contained_panics(&self) -> u64 {
        self.contained_panics.load(Ordering::Relaxed)
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

    fn inode(meta: &Meta, ino: Ino) -> Result<&Inode> {
        meta.get(ino).ok_or_else(|| err(libc::ENOENT))
    }
    fn inode_mut(meta: &mut Meta, ino: Ino) -> Result<&mut Inode> {
        meta.get_mut(ino).ok_or_else(|| err(libc::ENOENT))
    }
    fn dir(meta: &Meta, ino: Ino) -> Result<&Dir> {
        Self::inode(meta, ino)?
            .dir()
            .ok_or_else(|| err(libc::ENOTDIR))
    }
    fn dir_mut(meta: &mut Meta, ino: Ino) -> Result<&mut Dir> {
        Self::inode_mut(meta, ino)?
            .dir_mut()
            .ok_or_else(|| err(libc::ENOTDIR))
    }

    fn touch_dir(meta: &mut Meta, ino: Ino) {
        if let Some(i) = meta.get_mut(ino) {
            let now = crate::meta::now();
            i.mtime = now;
            i.ctime = now;
        }
    }

    /// Releases an inode's data if it became an orphan, and drops it from the table once the
    /// kernel has forgotten it too. Data is freed outside the metadata lock.
    fn settle(&self, mut meta: crate::sync::MutexGuard<'_, Meta>, ino: Ino) {
        let orphan_file = match meta.get(ino) {
            Some(i) if i.is_orphan() => i.file().cloned(),
            _ => None,
        };
        meta.reap(ino);
        drop(meta);
        if let Some(f) = orphan_file {
            let chunks = std::mem::take(&mut *f.chunks.write());
            self.data.release(chunks);
        }
    }

    // ---- lookups -------------------------------------------------------------------------

    /// Looks `name` up in `parent`; counts a kernel reference on success.
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr> {
        let mut meta = self.meta.lock();
        if name.len() > NAME_MAX {
            return Err(err(libc::ENAMETOOLONG));
        }
        // "." of any inode is the kernel decoding a file handle (NFS export,
        // open_by_handle_at) whose inode it no longer caches; ".." finds a directory's parent
        // for it. Inode numbers are never reused, so a handle names one inode for good
        // (generation 0).
        let ino = match name {
            // A handle to an unlinked inode is stale, as on ext4 (it may still be open).
            b"." if Self::inode(&meta, parent)?.nlink == 0 => return Err(err(libc::ESTALE)),
            b"." => parent,
            b".." => Self::dir(&meta, parent)?.parent,
            _ => Self::dir(&meta, parent)?
                .get(name)
                .ok_or_else(|| err(libc::ENOENT))?,
        };
        let inode = Self::inode_mut(&mut meta, ino)?;
        inode.lookups += 1;
        Ok(attr_of(ino, inode))
    }

    /// The kernel dropped `n` references.
    pub fn forget(&self, ino: Ino, n: u64) {
        let mut meta = self.meta.lock();
        if let Some(i) = meta.get_mut(ino) {
            i.lookups = i.lookups.saturating_sub(n);
        }
        self.settle(meta, ino);
    }

    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        let meta = self.meta.lock();
        Ok(attr_of(ino, Self::inode(&meta, ino)?))
    }

    /// `setattr` by `caller`. As the kernel leaves it to the file system (it negotiates
    /// FUSE_HANDLE_KILLPRIV_V2): a truncation by a caller without CAP_FSETID drops set-ID
    /// bits as a write does, and a change of owner or group drops set-user-ID, and
    /// set-group-ID from a group-executable file.
    pub fn setattr(&self, ino: Ino, set: &SetAttr, caller: Caller) -> Result<Attr> {
        if set.mode.is_some() || set.uid.is_some() || set.gid.is_some() || set.size.is_some() {
            self.writable()?;
        }
        {
            let meta = self.meta.lock();
            let i = Self::inode(&meta, ino)?;
            // The kernel's notify_change rules: an immutable or append-only inode keeps its
            // mode, owner, size and explicit times; only "touch to now" passes for times.
            // Under the writeback cache the kernel sends its own "now" as the mtime, with
            // the same time as the ctime (an explicit mtime comes with a ctime of now).
            let explicit = |t: Option<SetTime>| match t {
                Some(SetTime::At(t)) => set.ctime != Some(t),
                _ => false,
            };
            if set.mode.is_some()
                || set.uid.is_some()
                || set.gid.is_some()
                || set.size.is_some()
                || matches!(set.atime, Some(SetTime::At(_)))
                || explicit(set.mtime)
            {
                check_mutable(i)?;
            }
            if set.atime.is_some() || set.mtime.is_some() || set.ctime.is_some() {
                check_not_immutable(i)?;
            }
        }
        if let Some(size) = set.size {
            self.resize(ino, size)?;
        }
        let mut meta = self.meta.lock();
        let i = Self::inode_mut(&mut meta, ino)?;
        let now = crate::meta::now();
        let mut acl_changed = false;
        let mut killed = false;
        if (set.uid.is_some() || set.gid.is_some()) && i.kind != Kind::Dir && set.mode.is_none() {
            // chown drops as an unprivileged write would, whoever changes the owner, with
            // the group test left out (the kernel's chown_common).
            let anyone = Caller {
                cap_fsetid: false,
                ..caller
            };
            let bits = set_id_bits_to_drop(i.perm, &anyone, || true);
            i.perm &= !bits;
            killed = bits != 0;
        }
        if let Some(mode) = set.mode {
            i.perm = (mode & 0o7777) as u16;
            // The kernel's setattr_prepare: set-group-ID is kept only by a member of the
            // (new) group or a caller with CAP_FSETID, on files and directories alike.
            let group = set.gid.unwrap_or(i.gid);
            if i.perm & S_ISGID != 0 && !caller.privileged() && !caller.in_group(group) {
                i.perm &= !S_ISGID;
            }
            // chmod moves the access ACL's owner, mask and other entries with it.
            if let Some(x) = i.xattrs.as_mut() {
                if let Some(v) = x.get_mut(crate::acl::ACCESS_XATTR) {
                    if let Ok(mut acl) = crate::acl::Acl::parse(v) {
                        acl.chmod(i.perm);
                        *v = acl.to_xattr().into();
                        acl_changed = true;
                    }
                }
            }
        }
        if let Some(uid) = set.uid {
            i.uid = uid;
        }
        if let Some(gid) = set.gid {
            i.gid = gid;
        }
        let pick = |t: SetTime| match t {
            SetTime::Now => now,
            SetTime::At(t) => t,
        };
        if let Some(t) = set.atime {
            i.atime = pick(t);
        }
        if let Some(t) = set.mtime {
            i.mtime = pick(t);
        }
        i.ctime = set.ctime.unwrap_or(now);
        let attr = attr_of(ino, i);
        drop(meta);
        if set.size.is_some() && set.mode.is_none() && attr.kind == Kind::File {
            self.drop_set_id_bits(ino, &caller)?;
        }
        if acl_changed || killed {
            // The kernel caches ACLs: have it forget this inode's.
            if let Some(tell) = self.attr_changed.get() {
                tell(ino);
            }
        }
        Ok(attr)
    }

    /// Sets a regular file's size (truncate or extend with a hole).
    fn resize(&self, ino: Ino, size: u64) -> Result<()> {
        self.data.check_end(size, 0)?;
        let file = {
            let meta = self.meta.lock();
            let i = Self::inode(&meta, ino)?;
            match i.kind {
                Kind::File => i.file().cloned().expect("files have data"),
                Kind::Dir => return Err(err(libc::EISDIR)),
                _ => return Err(err(libc::EINVAL)),
            }
        };
        let mut chunks = file.chunks.write();
        let old = Self::inode(&self.meta.lock(), ino)?.size;
        if size < old {
            let from = size / self.data.chunk_size();
            file.tracking(&mut chunks, from..=u64::MAX, |c| {
                self.data.truncate(c, size)
            })?;
        }
        let mut meta = self.meta.lock();
        let i = Self::inode_mut(&mut meta, ino)?;
        i.size = size;
        let now = crate::meta::now();
        i.mtime = now;
        i.ctime = now;
        Ok(())
    }

    /// Reads a symlink, an access of it (the kernel asks again each time it follows the link
    /// and leaves the access time to the file system).
    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        let mut meta = self.meta.lock();
        let i = Self::inode_mut(&mut meta, ino)?;
        let target = match &i.body {
            Body::Symlink(t) => t.to_vec(),
            _ => return Err(err(libc::EINVAL)),
        };
        self.accessed(i);
        Ok(target)
    }

    /// An access of `i` (a read, a directory read, a symlink read): its access time moves
    /// as the mount says, unless the mount is read-only or the inode is `chattr +A`.
    fn accessed(&self, i: &mut Inode) {
        if self.config.read_only || i.flags & FS_NOATIME_FL != 0 {
            return;
        }
        let now = crate::meta::now();
        if self.config.atime.due(i, now) {
            i.atime = now;
        }
    }

    // ---- creating and removing names -----------------------------------------------------

    /// What a new inode takes from its directory `p`: the group of a set-group-ID directory,
    /// and the directory's default ACL, which when present decides the permissions (and the
    /// new inode's ACLs) instead of the caller's umask.
    fn inherit_from_parent(&self, p: &Inode, inode: &mut Inode, caller: Caller) {
        inherit_group(p, inode);
        // Symlinks have neither ACLs nor a umask.
        let default_acl = self
            .config
            .acl
            .then(|| p.xattrs.as_ref()?.get(crate::acl::DEFAULT_XATTR))
            .flatten()
            .and_then(|v| crate::acl::Acl::parse(v).ok().map(|a| (a, v.clone())));
        if inode.kind != Kind::Symlink {
            match default_acl {
                Some((acl, raw)) => {
                    let (access, bits) = acl.inherit(inode.perm);
                    inode.perm = bits;
                    let x = inode.xattrs.get_or_insert_with(Default::default);
                    if let Some(a) = access {
                        x.insert(crate::acl::ACCESS_XATTR.into(), a.to_xattr().into());
                    }
                    if inode.kind == Kind::Dir {
                        x.insert(crate::acl::DEFAULT_XATTR.into(), raw);
                    }
                }
                None => inode.perm &= !(caller.umask as u16 & 0o777),
            }
        }
    }

    /// Adds a fresh inode under `parent/name` and counts a kernel reference to it.
    fn make(&self, parent: Ino, name: &[u8], inode: Inode, caller: Caller) -> Result<Attr> {
        self.writable()?;
        check_name(name)?;
        let mut meta = self.meta.lock();
        let dir = Self::dir(&meta, parent)?;
        if dir.get(name).is_some() {
            return Err(err(libc::EEXIST));
        }
        check_not_immutable(Self::inode(&meta, parent)?)?;
        let is_dir = inode.kind == Kind::Dir;
        let mut inode = inode;
        self.inherit_from_parent(Self::inode(&meta, parent)?, &mut inode, caller);
        let ino = meta.insert(inode);
        if is_dir {
            if let Some(d) = meta.get_mut(ino).and_then(Inode::dir_mut) {
                d.parent = parent;
            }
            Self::inode_mut(&mut meta, parent)?.nlink += 1;
        }
        Self::dir_mut(&mut meta, parent)?.insert(name, ino);
        Self::touch_dir(&mut meta, parent);
        let i = Self::inode_mut(&mut meta, ino)?;
        i.lookups += 1;
        Ok(attr_of(ino, i))
    }

    pub fn mknod(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        rdev: u32,
        caller: Caller,
    ) -> Result<Attr> {
        let kind = Kind::from_mode(mode).ok_or_else(|| err(libc::EINVAL))?;
        let body = match kind {
            Kind::File => Body::File(Arc::default()),
            Kind::Dir | Kind::Symlink => return Err(err(libc::EINVAL)),
            _ => Body::Special,
        };
        let mut inode = new_inode(kind, (mode & 0o7777) as u16, caller, body);
        inode.rdev = rdev;
        self.make(parent, name, inode, caller)
    }

    pub fn mkdir(&self, parent: Ino, name: &[u8], mode: u32, caller: Caller) -> Result<Attr> {
        let body = Body::Dir(Box::new(Dir::new(parent)));
        self.make(
            parent,
            name,
            new_inode(Kind::Dir, (mode & 0o7777) as u16, caller, body),
            caller,
        )
    }

    pub fn symlink(&self, parent: Ino, name: &[u8], target: &[u8], caller: Caller) -> Result<Attr> {
        if target.is_empty() {
            return Err(err(libc::ENOENT));
        }
        if target.len() > libc::PATH_MAX as usize {
            return Err(err(libc::ENAMETOOLONG));
        }
        let mut inode = new_inode(Kind::Symlink, 0o777, caller, Body::Symlink(target.into()));
        inode.size = target.len() as u64;
        self.make(parent, name, inode, caller)
    }

    pub fn link(&self, ino: Ino, newparent: Ino, newname: &[u8]) -> Result<Attr> {
        self.writable()?;
        check_name(newname)?;
        let mut meta = self.meta.lock();
        if Self::inode(&meta, ino)?.kind == Kind::Dir {
            return Err(err(libc::EPERM));
        }
        if Self::dir(&meta, newparent)?.get(newname).is_some() {
            return Err(err(libc::EEXIST));
        }
        check_mutable(Self::inode(&meta, ino)?)?;
        check_not_immutable(Self::inode(&meta, newparent)?)?;
        let source = Self::inode(&meta, ino)?;
        if source.nlink == 0 && !source.tmpfile {
            return Err(Error::new(libc::ENOENT, "the file was unlinked"));
        }
        Self::dir_mut(&mut meta, newparent)?.insert(newname, ino);
        Self::touch_dir(&mut meta, newparent);
        let i = Self::inode_mut(&mut meta, ino)?;
        i.tmpfile = false;
        i.nlink += 1;
        i.lookups += 1;
        i.ctime = crate::meta::now();
        Ok(attr_of(ino, i))
    }

    pub fn unlink(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.remove(parent, name, false)
    }

    pub fn rmdir(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.remove(parent, name, true)
    }

    fn remove(&self, parent: Ino, name: &[u8], want_dir: bool) -> Result<()> {
        self.writable()?;
        if name == b"." {
            return Err(err(libc::EINVAL));
        }
        if name == b".." {
            return Err(err(libc::ENOTEMPTY));
        }
        let mut meta = self.meta.lock();
        let ino = Self::dir(&meta, parent)?
            .get(name)
            .ok_or_else(|| err(libc::ENOENT))?;
        // The kernel's may_delete order: chattr flags refuse before the entry's kind or a
        // directory's emptiness is looked at.
        check_mutable(Self::inode(&meta, parent)?)?;
        check_mutable(Self::inode(&meta, ino)?)?;
        Self::check_removable(Self::inode(&meta, ino)?, want_dir)?;
        Self::dir_mut(&mut meta, parent)?.remove(name);
        Self::touch_dir(&mut meta, parent);
        if want_dir {
            Self::inode_mut(&mut meta, parent)?.nlink -= 1;
        }
        let i = Self::inode_mut(&mut meta, ino)?;
        i.nlink = if want_dir { 0 } else { i.nlink - 1 };
        i.ctime = crate::meta::now();
        self.settle(meta, ino);
        Ok(())
    }

    /// Whether `victim` may go away in favour of (or as) a directory (`as_dir`) or not: the
    /// one rule `unlink`, `rmdir` and a replacing `rename` share.
    fn check_removable(victim: &Inode, as_dir: bool) -> Result<()> {
        match (as_dir, victim.dir()) {
            (true, None) => Err(err(libc::ENOTDIR)),
            (false, Some(_)) => Err(err(libc::EISDIR)),
            (true, Some(d)) if !d.is_empty() => Err(err(libc::ENOTEMPTY)),
            _ => Ok(()),
        }
    }

    /// True if `ino` is `ancestor` or lies below it.
    fn is_within(meta: &Meta, mut ino: Ino, ancestor: Ino) -> bool {
        loop {
            if ino == ancestor {
                return true;
            }
            match meta.get(ino).and_then(Inode::dir) {
                Some(d) if d.parent != ino => ino = d.parent,
                _ => return false,
            }
        }
    }

    pub fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        flags: u32,
        caller: Caller,
    ) -> Result<()> {
        self.writable()?;
        check_name(name)?;
        check_name(newname)?;
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT) != 0
            || flags & RENAME_EXCHANGE != 0 && flags != RENAME_EXCHANGE
        {
            return Err(err(libc::EINVAL));
        }
        let mut meta = self.meta.lock();
        let src = Self::dir(&meta, parent)?
            .get(name)
            .ok_or_else(|| err(libc::ENOENT))?;
        let dst = Self::dir(&meta, newparent)?.get(newname);
        // The kernel refuses a taken name under RENAME_NOREPLACE at its lookup, before
        // anything else.
        if dst.is_some() && flags & RENAME_NOREPLACE != 0 {
            return Err(err(libc::EEXIST));
        }
        // Moving an entry deletes it from one directory and adds it to another: the
        // kernel's may_delete and may_create rules for chattr flags.
        check_mutable(Self::inode(&meta, parent)?)?;
        check_mutable(Self::inode(&meta, src)?)?;
        check_not_immutable(Self::inode(&meta, newparent)?)?;
        if let Some(d) = dst {
            check_mutable(Self::inode(&meta, newparent)?)?;
            check_mutable(Self::inode(&meta, d)?)?;
        }
        let src_is_dir = Self::inode(&meta, src)?.kind == Kind::Dir;
        // A directory cannot move below itself.
        if src_is_dir && Self::is_within(&meta, newparent, src) {
            return Err(err(libc::EINVAL));
        }
        if flags & RENAME_EXCHANGE != 0 {
            let dst = dst.ok_or_else(|| err(libc::ENOENT))?;
            let dst_is_dir = Self::inode(&meta, dst)?.kind == Kind::Dir;
            if dst_is_dir && Self::is_within(&meta, parent, dst) {
                return Err(err(libc::EINVAL));
            }
            Self::dir_mut(&mut meta, parent)?.replace(name, dst);
            Self::dir_mut(&mut meta, newparent)?.replace(newname, src);
            if parent != newparent {
                for (moved, is_dir, to, from) in [
                    (src, src_is_dir, newparent, parent),
                    (dst, dst_is_dir, parent, newparent),
                ] {
                    if is_dir {
                        Self::dir_mut(&mut meta, moved)?.parent = to;
                        Self::inode_mut(&mut meta, to)?.nlink += 1;
                        Self::inode_mut(&mut meta, from)?.nlink -= 1;
                    }
                }
            }
            let now = crate::meta::now();
            for ino in [src, dst] {
                Self::inode_mut(&mut meta, ino)?.ctime = now;
            }
            Self::touch_dir(&mut meta, parent);
            Self::touch_dir(&mut meta, newparent);
            return Ok(());
        }
        if let Some(dst) = dst {
            if dst == src {
                return Ok(()); // two names of one file: nothing to do
            }
            Self::check_removable(Self::inode(&meta, dst)?, src_is_dir)?;
        }
        // Detach the source, then put it in place of (or beside) the target.
        Self::dir_mut(&mut meta, parent)?.remove(name);
        if flags & RENAME_WHITEOUT != 0 {
            let mut whiteout = new_inode(Kind::CharDevice, 0, caller, Body::Special);
            whiteout.rdev = 0;
            let w = meta.insert(whiteout);
            Self::dir_mut(&mut meta, parent)?.insert(name, w);
        }
        let replaced = Self::dir_mut(&mut meta, newparent)?.remove(newname);
        Self::dir_mut(&mut meta, newparent)?.insert(newname, src);
        if src_is_dir && parent != newparent {
            Self::dir_mut(&mut meta, src)?.parent = newparent;
            Self::inode_mut(&mut meta, parent)?.nlink -= 1;
            Self::inode_mut(&mut meta, newparent)?.nlink += 1;
        }
        let now = crate::meta::now();
        Self::inode_mut(&mut meta, src)?.ctime = now;
        Self::touch_dir(&mut meta, parent);
        Self::touch_dir(&mut meta, newparent);
        if let Some(old) = replaced {
            let o = Self::inode_mut(&mut meta, old)?;
            let was_dir = o.kind == Kind::Dir;
            o.nlink = if was_dir { 0 } else { o.nlink - 1 };
            o.ctime = now;
            if was_dir {
                Self::inode_mut(&mut meta, newparent)?.nlink -= 1;
            }
            self.settle(meta, old);
        }
        Ok(())
    }

    // ---- files ---------------------------------------------------------------------------

    fn new_handle(&self, ino: Ino, mode: OpenMode) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(fh, Handle { ino, mode });
        fh
    }

    /// Opens `ino`; returns a file handle.
    pub fn open(&self, ino: Ino, flags: i32) -> Result<u64> {
        let mode = OpenMode::from_flags(flags);
        if mode.write || mode.truncate {
            self.writable()?;
        }
        {
            let mut meta = self.meta.lock();
            let i = Self::inode_mut(&mut meta, ino)?;
            if i.kind == Kind::Dir && mode.write {
                return Err(err(libc::EISDIR));
            }
            if mode.write || mode.truncate {
                check_not_immutable(i)?;
                if i.flags & FS_APPEND_FL != 0 && (!mode.append || mode.truncate) {
                    return Err(Error::new(
                        libc::EPERM,
                        "an append-only file opens for writing only with O_APPEND",
                    ));
                }
            }
            // Unlinked and closed: its data is gone (the kernel may still know the inode
            // from a lookup that raced with the unlink).
            if i.is_orphan() {
                return Err(err(libc::ENOENT));
            }
            i.opens += 1;
        }
        let fh = self.new_handle(ino, mode);
        if mode.truncate && mode.write {
            if let Err(e) = self.resize(ino, 0) {
                self.release(fh);
                return Err(e);
            }
        }
        Ok(fh)
    }

    /// Creates and opens a regular file (`O_CREAT`); with `O_EXCL` an existing name fails.
    pub fn create(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        flags: i32,
        caller: Caller,
    ) -> Result<(Attr, u64)> {
        let made = self.mknod(parent, name, libc::S_IFREG | (mode & 0o7777), 0, caller);
        let attr = match made {
            Ok(a) => a,
            Err(e) if e.errno == libc::EEXIST && flags & libc::O_EXCL == 0 => {
                self.lookup(parent, name)?
            }
            Err(e) => return Err(e),
        };
        match self.open(attr.ino, flags) {
            Ok(fh) => Ok((self.getattr(attr.ino)?, fh)),
            Err(e) => {
                self.forget(attr.ino, 1);
                Err(e)
            }
        }
    }

    /// `open(O_TMPFILE)` in directory `parent`: a regular file with no name, open for
    /// writing, gone at its last close unless `link` names it first (which `O_EXCL` forbids).
    /// It takes from `parent` what a created file would (group, default ACL, else umask).
    pub fn tmpfile(
        &self,
        parent: Ino,
        mode: u32,
        flags: i32,
        caller: Caller,
    ) -> Result<(Attr, u64)> {
        self.writable()?;
        let open = OpenMode::from_flags(flags);
        if !open.write {
            return Err(Error::new(
                libc::EINVAL,
                "O_TMPFILE needs O_WRONLY or O_RDWR",
            ));
        }
        let ino = {
            let mut meta = self.meta.lock();
            let p = Self::inode(&meta, parent)?;
            p.dir().ok_or_else(|| err(libc::ENOTDIR))?;
            check_not_immutable(p)?;
            let mut inode = new_inode(
                Kind::File,
                (mode & 0o7777) as u16,
                caller,
                Body::File(Arc::default()),
            );
            self.inherit_from_parent(p, &mut inode, caller);
            inode.nlink = 0;
            inode.lookups = 1; // the kernel's reference, as for a created file
            inode.opens = 1; // the handle below: it never exists unopened
            inode.tmpfile = flags & libc::O_EXCL == 0;
            meta.insert(inode)
        };
        let fh = self.new_handle(ino, open);
        Ok((self.getattr(ino)?, fh))
    }

    fn handle(&self, fh: u64, ino: Ino) -> Result<OpenMode> {
        match self.handles.lock().get(&fh) {
            Some(h) if h.ino == ino => Ok(h.mode),
            _ => Err(err(libc::EBADF)),
        }
    }

    fn file_data(&self, ino: Ino) -> Result<Arc<FileData>> {
        let meta = self.meta.lock();
        let i = Self::inode(&meta, ino)?;
        match (&i.body, i.kind) {
            (Body::File(f), _) => Ok(f.clone()),
            (_, Kind::Dir) => Err(err(libc::EISDIR)),
            _ => Err(err(libc::EINVAL)),
        }
    }

    /// Reads up to `size` bytes at `offset` (short at end of file), left where the fabric put
    /// them for the reply to send.
    pub fn read_buf(&self, ino: Ino, fh: u64, offset: u64, size: u32) -> Result<ReadBuf<'_>> {
        if !self.handle(fh, ino)?.read && !self.config.writeback {
            return Err(err(libc::EBADF));
        }
        let file = self.file_data(ino)?;
        let chunks = file.chunks.read();
        let file_size = {
            let mut meta = self.meta.lock();
            let i = Self::inode_mut(&mut meta, ino)?;
            self.accessed(i);
            i.size
        };
        if offset >= file_size {
            return Ok(ReadBuf::empty());
        }
        let len = (size as u64).min(file_size - offset) as usize;
        self.fault_point("read");
        self.data.read_buf(&chunks, offset, len)
    }

    /// As [`Fs::read_buf`], copied out.
    pub fn read(&self, ino: Ino, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        Ok(self.read_buf(ino, fh, offset, size)?.into_vec())
    }

    /// Writes `data` at `offset` (at the end with `O_APPEND`); returns once the bytes are in
    /// remote memory.
    pub fn write(
        &self,
        ino: Ino,
        fh: u64,
        offset: u64,
        data: &[u8],
        caller: Caller,
    ) -> Result<u32> {
        self.write_impl(ino, fh, offset, Payload::Copy(data), caller)
    }

    /// As [`Fs::write`], for data inside a FUSE request buffer: such buffers live as long as
    /// the session, so the payload is registered (through the cache) and sent without a copy.
    pub fn write_in_place(
        &self,
        ino: Ino,
        fh: u64,
        offset: u64,
        data: RequestBuffer<'_>,
        caller: Caller,
    ) -> Result<u32> {
        self.write_impl(ino, fh, offset, Payload::InPlace(data), caller)
    }

    fn write_impl(
        &self,
        ino: Ino,
        fh: u64,
        offset: u64,
        payload: Payload<'_>,
        caller: Caller,
    ) -> Result<u32> {
        let data = payload.bytes();
        let mode = self.handle(fh, ino)?;
        if !mode.write {
            return Err(err(libc::EBADF));
        }
        let file = self.file_data(ino)?;
        let mut chunks = file.chunks.write();
        // Under the file's lock, so appends from several handles do not interleave. A file
        // made append-only after it was opened takes appends only.
        let offset = {
            let meta = self.meta.lock();
            let i = Self::inode(&meta, ino)?;
            check_not_immutable(i)?;
            // Under the writeback cache the kernel placed appends itself (its size may be
            // ahead of this one while pages wait).
            if (mode.append || i.flags & FS_APPEND_FL != 0) && !self.config.writeback {
                i.size
            } else {
                offset
            }
        };
        let end = self.data.check_end(offset, data.len() as u64)?;
        self.fault_point("write");
        file.tracking(
            &mut chunks,
            self.chunk_range(offset, data.len() as u64),
            |c| self.data.write(c, offset, payload),
        )?;
        let mut meta = self.meta.lock();
        let i = Self::inode_mut(&mut meta, ino)?;
        i.size = i.size.max(end);
        let now = crate::meta::now();
        i.mtime = now;
        i.ctime = now;
        let set_id = i.perm & (S_ISUID | S_ISGID) != 0;
        drop(meta);
        if set_id {
            self.drop_set_id_bits(ino, &caller)?;
        }
        Ok(data.len() as u32)
    }

    /// The indexes of the chunks bytes `[offset, offset+len)` fall in (the one at `offset`
    /// when `len` is 0).
    fn chunk_range(&self, offset: u64, len: u64) -> std::ops::RangeInclusive<u64> {
        let cs = self.data.chunk_size();
        let first = offset / cs;
        first..=(offset.saturating_add(len.max(1)) - 1) / cs
    }

    /// Clears the set-ID bits a modification by `caller` removes (see
    /// [`set_id_bits_to_drop`]); the group lookup happens outside the metadata lock.
    fn drop_set_id_bits(&self, ino: Ino, caller: &Caller) -> Result<()> {
        let (perm, gid) = {
            let meta = self.meta.lock();
            let i = Self::inode(&meta, ino)?;
            (i.perm, i.gid)
        };
        let bits = set_id_bits_to_drop(perm, caller, || caller.in_group(gid));
        if bits != 0 {
            {
                let mut meta = self.meta.lock();
                let i = Self::inode_mut(&mut meta, ino)?;
                i.perm &= !bits;
                i.ctime = crate::meta::now();
            }
            if let Some(tell) = self.attr_changed.get() {
                tell(ino);
            }
        }
        Ok(())
    }

    /// `lseek` with `SEEK_DATA` (`data` true) or `SEEK_HOLE`: the first offset at or after
    /// `offset` in data (bytes a chunk holds) or in a hole (the end of the file counts as
    /// one). ENXIO at or past the end, or when no data follows. Chunks are the unit: a
    /// written chunk's unwritten bytes count as data, as a file system's blocks do.
    pub fn seek_data_hole(&self, ino: Ino, fh: u64, offset: u64, data: bool) -> Result<u64> {
        self.handle(fh, ino)?;
        let file = self.file_data(ino)?;
        let chunks = file.chunks.read();
        let size = Self::inode(&self.meta.lock(), ino)?.size;
        if offset >= size {
            return Err(err(libc::ENXIO));
        }
        let cs = self.data.chunk_size();
        // The data extents from the chunk holding `offset` on, in order.
        let extents = chunks
            .range(offset / cs..)
            .map(|(idx, c)| (idx * cs, idx * cs + c.len))
            .filter(|&(_, end)| end > offset);
        if data {
            return extents
                .map(|(start, _)| start.max(offset))
                .find(|&at| at < size)
                .ok_or_else(|| err(libc::ENXIO));
        }
        let mut at = offset;
        for (start, end) in extents {
            if start > at {
                break; // a hole before this extent
            }
            at = end;
        }
        Ok(at.min(size))
    }

    /// `copy_file_range`: copies up to `len` bytes from `ino_in` at `off_in` to `ino_out` at
    /// `off_out` (stopping at the source's end), through the daemon in windows of
    /// [`crate::config::IO_SIZE`] (one request from the kernel instead of a read and a write
    /// per page); returns the bytes copied. The destination is written as by `write`.
    #[allow(clippy::too_many_arguments)]
    pub fn copy_file_range(
        &self,
        ino_in: Ino,
        fh_in: u64,
        off_in: u64,
        ino_out: Ino,
        fh_out: u64,
        off_out: u64,
        len: u64,
        caller: Caller,
    ) -> Result<u64> {
        if ino_in == ino_out
            && off_in < off_out.saturating_add(len)
            && off_out < off_in.saturating_add(len)
        {
            return Err(Error::new(libc::EINVAL, "overlapping ranges of one file"));
        }
        if self.handle(fh_out, ino_out)?.append {
            return Err(Error::new(
                libc::EBADF,
                "the destination is open for appending",
            ));
        }
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(crate::config::IO_SIZE as u64) as u32;
            // Copied out of the pooled read buffer: the write below takes a pooled buffer of
            // its own, and no handler holds two (the pool is sized on that).
            let bytes = self.read(ino_in, fh_in, off_in + done, n)?;
            if bytes.is_empty() {
                break;
            }
            let written = self.write(ino_out, fh_out, off_out + done, &bytes, caller)?;
            done += written as u64;
            if (written as usize) < bytes.len() {
                break;
            }
        }
        Ok(done)
    }

    /// The inode flags (`FS_IOC_GETFLAGS`, `lsattr`).
    pub fn get_flags(&self, ino: Ino) -> Result<u32> {
        Ok(Self::inode(&self.meta.lock(), ino)?.flags)
    }

    /// Sets the inode flags (`FS_IOC_SETFLAGS`, `chattr`). Who may is the kernel's check
    /// (the owner; CAP_LINUX_IMMUTABLE for immutable and append-only); flags outside
    /// [`INODE_FLAGS`] are EOPNOTSUPP.
    pub fn set_flags(&self, ino: Ino, flags: u32) -> Result<()> {
        self.writable()?;
        if flags & !INODE_FLAGS != 0 {
            return Err(Error::new(
                libc::EOPNOTSUPP,
                format!("inode flags {:#x} are not supported", flags & !INODE_FLAGS),
            ));
        }
        let mut meta = self.meta.lock();
        let i = Self::inode_mut(&mut meta, ino)?;
        // A change of inode, even to the same flags (as on tmpfs and ext4).
        i.flags = flags;
        i.ctime = crate::meta::now();
        drop(meta);
        // The kernel keeps no flags of a FUSE inode and does not refresh its cached
        // attributes after the ioctl: have it forget them, or stat shows the old ctime.
        if let Some(tell) = self.attr_changed.get() {
            tell(ino);
        }
        Ok(())
    }

    /// Sets the callback for attribute changes the kernel did not make (once; later calls
    /// are ignored).
    pub fn on_attr_changed(&self, tell: AttrChanged) {
        let _ = self.attr_changed.set(tell);
    }

    pub fn release(&self, fh: u64) {
        let Some(h) = self.handles.lock().remove(&fh) else {
            return;
        };
        let mut meta = self.meta.lock();
        if let Some(i) = meta.get_mut(h.ino) {
            i.opens = i.opens.saturating_sub(1);
        }
        self.settle(meta, h.ino);
    }

    /// `fallocate(2)`, as Linux file systems do it:
    /// - mode 0 reserves remote memory and extends the size; `FALLOC_FL_KEEP_SIZE` only
    ///   reserves;
    /// - `PUNCH_HOLE` (with `KEEP_SIZE`) gives back the chunks inside the range and zeroes
    ///   the rest of it;
    /// - `ZERO_RANGE` punches, then reserves the range (extending the size unless
    ///   `KEEP_SIZE`);
    /// - `COLLAPSE_RANGE` removes the range, `INSERT_RANGE` opens a hole there, moving what
    ///   follows; both want [`BLOCK`]-aligned ranges inside the file (EINVAL otherwise, as on
    ///   ext4), and renumber whole chunks when the range is whole chunks, else copy.
    ///
    /// Any other mode is EOPNOTSUPP. An unprivileged caller drops the file's set-ID bits.
    pub fn fallocate(
        &self,
        ino: Ino,
        fh: u64,
        offset: u64,
        len: u64,
        mode: i32,
        caller: Caller,
    ) -> Result<()> {
        let op = mode & !libc::FALLOC_FL_KEEP_SIZE;
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let shifts = op == libc::FALLOC_FL_COLLAPSE_RANGE || op == libc::FALLOC_FL_INSERT_RANGE;
        let known = [
            0,
            libc::FALLOC_FL_PUNCH_HOLE,
            libc::FALLOC_FL_ZERO_RANGE,
            libc::FALLOC_FL_COLLAPSE_RANGE,
            libc::FALLOC_FL_INSERT_RANGE,
        ];
        if !known.contains(&op)
            || (op == libc::FALLOC_FL_PUNCH_HOLE && !keep_size)
            || (shifts && keep_size)
        {
            return Err(err(libc::EOPNOTSUPP));
        }
        if len == 0 {
            return Err(err(libc::EINVAL));
        }
        if !self.handle(fh, ino)?.write {
            return Err(err(libc::EBADF));
        }
        let end = self.data.check_end(offset, len)?;
        let file = self.file_data(ino)?;
        let mut chunks = file.chunks.write();
        let size = {
            let meta = self.meta.lock();
            let i = Self::inode(&meta, ino)?;
            check_not_immutable(i)?;
            // An append-only file may only have room reserved past its end.
            if i.flags & FS_APPEND_FL != 0 && !(op == 0 && keep_size) {
                return Err(Error::new(
                    libc::EPERM,
                    "the file is append-only (chattr +a)",
                ));
            }
            i.size
        };
        let new_size = match op {
            libc::FALLOC_FL_COLLAPSE_RANGE | libc::FALLOC_FL_INSERT_RANGE => {
                if offset % BLOCK != 0 || len % BLOCK != 0 {
                    return Err(err(libc::EINVAL));
                }
                // Every chunk from the range on may move.
                let everything = offset / self.data.chunk_size()..=u64::MAX;
                if op == libc::FALLOC_FL_COLLAPSE_RANGE {
                    if end >= size {
                        return Err(err(libc::EINVAL));
                    }
                    file.tracking(&mut chunks, everything, |c| {
                        self.data.collapse(c, offset, len, size)
                    })?;
                    size - len
                } else {
                    if offset >= size {
                        return Err(err(libc::EINVAL));
                    }
                    let grown = self
                        .data
                        .check_end(size, len)
                        .map_err(|_| err(libc::EFBIG))?;
                    file.tracking(&mut chunks, everything, |c| {
                        self.data.insert(c, offset, len, size)
                    })?;
                    grown
                }
            }
            _ => {
                let range = self.chunk_range(offset, len);
                file.tracking(&mut chunks, range, |c| {
                    if op != 0 {
                        self.data.punch(c, offset, len)?;
                    }
                    if op != libc::FALLOC_FL_PUNCH_HOLE {
                        self.data.allocate(c, offset, len)?;
                    }
                    Ok::<_, Error>(())
                })?;
                if keep_size {
                    size
                } else {
                    size.max(end)
                }
            }
        };
        {
            let mut meta = self.meta.lock();
            let i = Self::inode_mut(&mut meta, ino)?;
            let now = crate::meta::now();
            if new_size != i.size {
                i.size = new_size;
                i.ctime = now;
            }
            if op != 0 {
                // The contents changed.
                i.mtime = now;
                i.ctime = now;
            }
        }
        drop(chunks);
        self.drop_set_id_bits(ino, &caller)
    }

    // ---- directories ---------------------------------------------------------------------

    /// Opens a directory stream; [`Fs::releasedir`] ends it.
    pub fn opendir(&self, ino: Ino) -> Result<u64> {
        Self::dir(&self.meta.lock(), ino)?;
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.dir_streams.lock().insert(fh, None);
        Ok(fh)
    }

    pub fn releasedir(&self, fh: u64) {
        self.dir_streams.lock().remove(&fh);
    }

    /// Lists the entries of stream `fh` after `offset`, calling `add` until it returns `false`
    /// (reply full).
    ///
    /// Offsets are the entries' cookies, stable while entries come and go. Which entries a
    /// stream lists is fixed when it starts (offset 0: opened or rewound), so a reader that
    /// renames every entry it reads (away and back, which gives the entry a new cookie)
    /// still ends, seeing each entry once; an entry removed meanwhile is skipped, and one
    /// renamed back is listed at its first place. POSIX leaves entries added after the start
    /// unspecified: they wait for the next rewind.
    pub fn readdir(
        &self,
        ino: Ino,
        fh: u64,
        offset: u64,
        add: &mut dyn FnMut(DirEntry) -> bool,
    ) -> Result<()> {
        self.list(ino, fh, offset, &mut |e, _| add(e), false)
    }

    /// [`Fs::readdir`] with each entry's attributes (FUSE's READDIRPLUS), so `ls -l` needs no
    /// LOOKUP per entry. The kernel takes a reference to every entry but "." and ".." it
    /// is given, as a lookup does: `add` returns `false` for an entry that did not fit (the
    /// reply is full; the listing stops there), and only the entries it took are counted.
    pub fn readdirplus(
        &self,
        ino: Ino,
        fh: u64,
        offset: u64,
        add: &mut dyn FnMut(DirEntry, &Attr) -> bool,
    ) -> Result<()> {
        self.list(ino, fh, offset, &mut |e, a| add(e, a.expect("plus")), true)
    }

    /// The listing behind both: attributes are made (and taken entries counted) with `plus`.
    fn list(
        &self,
        ino: Ino,
        fh: u64,
        offset: u64,
        add: &mut dyn FnMut(DirEntry, Option<&Attr>) -> bool,
        plus: bool,
    ) -> Result<()> {
        let listing = match self.dir_streams.lock().get(&fh) {
            None => return Err(err(libc::EBADF)),
            Some(l) if offset > 0 => l.clone(),
            Some(_) => None,
        };
        let mut meta = self.meta.lock();
        if offset == 0 && self.config.dir_atime {
            self.accessed(Self::inode_mut(&mut meta, ino)?);
        }
        let dir = Self::dir(&meta, ino)?;
        let listing = match listing {
            Some(l) => l,
            None => {
                let fresh = std::sync::Arc::new(dir.listing());
                if let Some(l) = self.dir_streams.lock().get_mut(&fh) {
                    *l = Some(fresh.clone());
                }
                fresh
            }
        };
        let dots = [(1u64, &b"."[..], ino), (2, &b".."[..], dir.parent)];
        let dot_entries = dots.into_iter().filter(|(c, _, _)| *c > offset);
        let start = listing.partition_point(|(c, _)| *c <= offset);
        let entries = listing[start..]
            .iter()
            .filter_map(|(c, name)| Some((*c, &name[..], dir.get(name)?)));
        let mut taken = Vec::new();
        for (cookie, name, child) in dot_entries.chain(entries) {
            let inode = meta.get(child);
            let kind = inode.map_or(Kind::File, |i| i.kind);
            let attr = match inode {
                Some(i) if plus => Some(attr_of(child, i)),
                // Every listed name has its inode; without one it is not listed with
                // attributes.
                None if plus => continue,
                _ => None,
            };
            let entry = DirEntry {
                ino: child,
                offset: cookie,
                kind,
                name: name.to_vec(),
            };
            if !add(entry, attr.as_ref()) {
                break;
            }
            // "." and ".." (the cookies below the first entry's) are not references.
            if plus && cookie >= crate::meta::FIRST_ENTRY_COOKIE {
                taken.push(child);
            }
        }
        for child in taken {
            if let Some(i) = meta.get_mut(child) {
                i.lookups += 1;
            }
        }
        Ok(())
    }

    // ---- the rest ------------------------------------------------------------------------

    /// Capacity as a program can use it: the whole chunks the servers that are up can still
    /// take, with every chunk's copies on distinct servers, so that what `statfs` calls free
    /// can be allocated (a partly used chunk's room counts for nothing; fragmentation inside
    /// a server's arena is not seen, its free bytes are taken as whole chunks).
    pub fn statfs(&self) -> StatFs {
        // Frees go out without waiting (an unlink makes no round trip): their answers carry
        // the capacity this counts.
        self.data
            .pool()
            .settle_frees(crate::config::STATFS_FREES_WAIT);
        self.statfs_as_heard()
    }

    /// [`Fs::statfs`] from the capacity last heard, frees still in flight not counted (for
    /// decisions that must not wait, such as [`Fs::direct_writes`] on every open).
    fn statfs_as_heard(&self) -> StatFs {
        let cs = self.data.chunk_size();
        let up: Vec<_> = self
            .data
            .pool()
            .status()
            .into_iter()
            .filter(|s| !s.failed)
            .map(|s| s.capacity)
            .collect();
        let copies = self.data.replicas().min(up.len()).max(1) as u64;
        let chunks = |bytes: fn(&crate::proto::Capacity) -> u64| {
            let per_server: Vec<u64> = up.iter().map(|c| bytes(c) / cs).collect();
            placeable_chunks(&per_server, copies)
        };
        let files = self.inode_count() as u64;
        StatFs {
            block_size: BLOCK as u32,
            blocks: chunks(|c| c.total) * (cs / BLOCK),
            blocks_free: chunks(|c| c.free) * (cs / BLOCK),
            // Metadata is local and bounded only by the daemon's memory.
            files: files + (1 << 32),
            files_free: 1 << 32,
            name_max: NAME_MAX as u32,
        }
    }

    /// `access(2)` by the usual owner/group/other rules (root may do anything but execute a
    /// file nobody may execute).
    pub fn access(&self, ino: Ino, mask: i32, caller: Caller) -> Result<()> {
        let meta = self.meta.lock();
        let i = Self::inode(&meta, ino)?;
        if mask == libc::F_OK {
            return Ok(());
        }
        if mask & libc::W_OK != 0 && self.config.read_only {
            return Err(err(libc::EROFS));
        }
        let perm = i.perm as i32;
        let granted = if caller.uid == 0 {
            let any_x = perm & 0o111 != 0 || i.kind == Kind::Dir;
            libc::R_OK | libc::W_OK | if any_x { libc::X_OK } else { 0 }
        } else if caller.uid == i.uid {
            (perm >> 6) & 7
        } else if caller.gid == i.gid {
            (perm >> 3) & 7
        } else {
            perm & 7
        };
        if mask & !granted == 0 {
            Ok(())
        } else {
            Err(err(libc::EACCES))
        }
    }

    /// Latencies of the pool's fabric batches, by kind.
    pub fn batch_latency(&self) -> Vec<crate::requests::OpSummary> {
        self.data.pool().batch_latency()
    }

    pub fn requests(&self) -> &crate::requests::RequestStats {
        &self.requests
    }

    /// Records how requests reach the FUSE adapter ("io_uring" or "/dev/fuse"), once.
    pub fn set_fuse_transport(&self, transport: &'static str) {
        let _ = self.fuse_transport.set(transport);
    }

    pub fn acl_enabled(&self) -> bool {
        self.config.acl
    }

    pub fn writeback_enabled(&self) -> bool {
        self.config.writeback
    }

    /// Whether a handle opened for writing now should bypass the kernel's writeback cache.
    /// Cached writes meet a full pool only when written back, and the kernel reports that
    /// at `fsync` or `close`: with the mount's dirty data kept below the pool's free room
    /// ([`crate::dirty_limit`]), new handles write through only once the pool is nearly
    /// full; without (a user's mount), whenever the pool has less room than the mount may
    /// hold dirty. Writing through, ENOSPC comes back from `write` itself.
    pub fn direct_writes(&self) -> bool {
        if !self.config.writeback {
            return false;
        }
        let (room, low_water) = (self.free_room(), self.config.writeback_low_water);
        self.dirty_limit
            .get()
            .map_or(room < low_water, |limit| limit.direct(room, low_water))
    }

    /// Free bytes of file data the pool can still take, copies counted, as last heard.
    fn free_room(&self) -> u64 {
        let s = self.statfs_as_heard();
        s.blocks_free.saturating_mul(s.block_size as u64)
    }

    /// Keeps the kernel's dirty data for this mount below the pool's free room from now on,
    /// through `limit` (the mount sets it once mounted).
    pub fn keep_dirty_limit(&self, limit: crate::dirty_limit::DirtyLimit) {
        if self.config.writeback && self.dirty_limit.set(limit).is_ok() {
            self.follow_room();
        }
    }

    /// Brings the dirty limit in step with the pool's free room (the upkeep does this every
    /// heartbeat, so the limit follows room taken by other clients too).
    pub fn follow_room(&self) {
        if let Some(limit) = self.dirty_limit.get() {
            limit.follow(self.free_room());
        }
    }

    fn check_xattr_name(&self, name: &[u8]) -> Result<()> {
        if name.len() > 255 || name.is_empty() {
            return Err(err(libc::ERANGE));
        }
        if self.config.acl
            && (name == crate::acl::ACCESS_XATTR || name == crate::acl::DEFAULT_XATTR)
        {
            return Ok(());
        }
        // trusted.* and security.* are the kernel's to guard (CAP_SYS_ADMIN, the LSM);
        // overlayfs keeps its upper layer's bookkeeping in trusted.overlay.*.
        let known: [&[u8]; 3] = [b"user.", b"trusted.", b"security."];
        if !known
            .iter()
            .any(|p| name.starts_with(p) && name.len() > p.len())
        {
            return Err(err(libc::EOPNOTSUPP));
        }
        Ok(())
    }

    /// Sets a `user.*`, `trusted.*` or `security.*` extended attribute (`XATTR_CREATE` /
    /// `XATTR_REPLACE` honoured).
    pub fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], flags: i32) -> Result<()> {
        self.writable()?;
        self.check_xattr_name(name)?;
        if value.len() > 64 * 1024 {
            return Err(err(libc::E2BIG));
        }
        #[cfg(feature = "testing")]
        if name == INJECT_PANIC_XATTR {
            *self.armed_panic.lock() = Some(String::from_utf8_lossy(value).into_owned());
            return Ok(());
        }
        let mut meta = self.meta.lock();
        let i = Self::inode_mut(&mut meta, ino)?;
        // As on Linux: user.* only on regular files and directories (a symlink's or a
        // device's permissions say nothing about who may annotate it).
        if name.starts_with(b"user.") && !matches!(i.kind, Kind::File | Kind::Dir) {
            return Err(err(libc::EPERM));
        }
        check_mutable(i)?;
        let mut value = value;
        let stored;
        if name == crate::acl::ACCESS_XATTR {
            // The mode follows the ACL; an ACL the mode says all of is not kept.
            let acl = crate::acl::Acl::parse(value)?;
            i.perm = (i.perm & !0o777) | acl.mode_bits();
            i.ctime = crate::meta::now();
            if acl.is_minimal() {
                if let Some(x) = i.xattrs.as_mut() {
                    x.remove(name);
                }
                return Ok(());
            }
            stored = acl.to_xattr();
            value = &stored;
        } else if name == crate::acl::DEFAULT_XATTR {
            if i.kind != Kind::Dir {
                return Err(Error::new(libc::EACCES, "a default ACL is for directories"));
            }
            crate::acl::Acl::parse(value)?;
        }
        let map = i.xattrs.get_or_insert_with(Default::default);
        let exists = map.contains_key(name);
        if flags & libc::XATTR_CREATE != 0 && exists {
            return Err(err(libc::EEXIST));
        }
        if flags & libc::XATTR_REPLACE != 0 && !exists {
            return Err(err(libc::ENODATA));
        }
        map.insert(name.into(), value.into());
        i.ctime = crate::meta::now();
        Ok(())
    }

    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        if ino == ROOT_INO && name == STATS_XATTR {
            return Ok(self.stats_text().into_bytes());
        }
        if ino == ROOT_INO && name == STATS_JSON_XATTR {
            return Ok(self.stats_json().to_string().into_bytes());
        }
        if name == PLACEMENT_XATTR {
            return Ok(self.placement(ino)?.to_string().into_bytes());
        }
        let meta = self.meta.lock();
        let i = Self::inode(&meta, ino)?;
        i.xattrs
            .as_ref()
            .and_then(|m| m.get(name))
            .map(|v| v.to_vec())
            .ok_or_else(|| err(libc::ENODATA))
    }

    /// All attribute names, each followed by a NUL (the `listxattr` format).
    pub fn listxattr(&self, ino: Ino) -> Result<Vec<u8>> {
        let meta = self.meta.lock();
        let i = Self::inode(&meta, ino)?;
        let mut out = Vec::new();
        for k in i.xattrs.iter().flat_map(|m| m.keys()) {
            out.extend_from_slice(k);
            out.push(0);
        }
        Ok(out)
    }

    pub fn removexattr(&self, ino: Ino, name: &[u8]) -> Result<()> {
        self.writable()?;
        let mut meta = self.meta.lock();
        let i = Self::inode_mut(&mut meta, ino)?;
        check_mutable(i)?;
        let removed = i.xattrs.as_mut().and_then(|m| m.remove(name));
        if i.xattrs.as_ref().is_some_and(|m| m.is_empty()) {
            i.xattrs = None;
        }
        match removed {
            Some(_) => {
                i.ctime = crate::meta::now();
                Ok(())
            }
            None => Err(err(libc::ENODATA)),
        }
    }

    /// The counters of this mount, as text: registration cache, fabric, servers, inodes.
    /// Every regular file's data, taken under the table's lock (released on return).
    pub fn files(&self) -> Vec<Arc<FileData>> {
        self.meta.lock().files().cloned().collect()
    }

    /// Where the copies of each chunk of file `ino` are ([`PLACEMENT_XATTR`]).
    pub fn placement(&self, ino: Ino) -> Result<serde_json::Value> {
        let file = self.file_data(ino)?;
        let servers = self.data.pool().status();
        let addr = |id: u32| servers.get(id as usize).map(|s| s.addr.to_string());
        let chunks = file.chunks.read();
        let list: Vec<serde_json::Value> = chunks
            .iter()
            .map(|(idx, c)| {
                let copies: Vec<_> = c.replicas().iter().map(|r| addr(r.server)).collect();
                serde_json::json!([idx, copies])
            })
            .collect();
        Ok(serde_json::Value::Array(list))
    }

    pub fn rebuild_stats(&self) -> &crate::rebuild::RebuildStats {
        &self.rebuild
    }

    /// Panics of the upkeep threads so far, by thread.
    pub fn upkeep_panics(&self) -> &crate::rebuild::UpkeepPanics {
        &self.upkeep_panics
    }

    /// Chunks by how many of their copies are on live servers. Taken file by file (the
    /// table's lock is not held while a file's chunk map is read).
    pub fn replica_health(&self) -> crate::data::ReplicaHealth {
        let mut health = crate::data::ReplicaHealth::default();
        for f in self.files() {
            self.data.health(&f.chunks.read(), &mut health);
        }
        health
    }

    /// What `stats_text` shows, as JSON: counts as numbers, states as strings, times as
    /// seconds since the epoch.
    pub fn stats_json(&self) -> serde_json::Value {
        use serde_json::json;
        let c = self.data.cache_stats();
        let pool = self.data.pool();
        let f = pool.fabric().counters();
        let epoch = |t: SystemTime| {
            t.duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
        };
        let servers: Vec<serde_json::Value> = pool
            .status()
            .iter()
            .map(|s| {
                json!({
                    "id": s.id.0,
                    "addr": s.addr.to_string(),
                    "state": match s.state {
                        crate::client::ServerState::Up => "up",
                        crate::client::ServerState::Down => "down",
                        crate::client::ServerState::Rejoining => "rejoining",
                    },
                    "since": epoch(s.since),
                    "free_bytes": s.capacity.free,
                    "total_bytes": s.capacity.total,
                    // Granted ahead for new small files (counted as used, not free).
                    "stocked_bytes": pool.stocked_bytes(s.id),
                    "downs": s.downs,
                })
            })
            .collect();
        let h = self.replica_health();
        let r = &self.rebuild;
        // Per operation name: count, mean, p50 and p99 in µs, and the time of all of them (for
        // exact means between two snapshots).
        let by_op = |summaries: Vec<crate::requests::OpSummary>| {
            summaries
                .into_iter()
                .map(|o| {
                    let figures = json!({"count": o.count, "mean_us": o.mean_us,
                                         "p50_us": o.p50_us, "p99_us": o.p99_us,
                                         "total_ns": o.total_nanos});
                    (o.op.to_string(), figures)
                })
                .collect::<serde_json::Map<String, serde_json::Value>>()
        };
        let requests = by_op(self.requests.summary());
        let batches = by_op(pool.batch_latency());
        json!({
            "registration_cache": {
                "policy": format!("{:?}", self.data.cache_policy()).to_lowercase(),
                "lookups": c.lookups(),
                "hits": c.hits,
                "subset_hits": c.subset_hits,
                "overlaps": c.overlaps,
                "misses": c.misses,
                "registrations": c.registrations,
                "registered_pages": c.registered_pages,
                "deregistrations": c.deregistrations,
                "deregistration_batches": c.deregistration_batches,
                "deregistered_pages": c.deregistered_pages,
                "full_events": c.full_events,
                "regions": c.regions,
                "pinned_pages": c.pinned_pages,
            },
            "fabric": {
                "name": pool.fabric().name(),
                "reads": f.reads,
                "bytes_read": f.bytes_read,
                "writes": f.writes,
                "bytes_written": f.bytes_written,
                "failed": f.failed,
                "remote_errors": f.remote_errors,
                "remote_refused": f.remote_refused,
                "registrations": f.registrations,
                "deregistrations": f.deregistrations,
                "deregistration_batches": f.deregistration_batches,
                "pinned_bytes": pool.fabric().pinned_bytes(),
                "unpinned_bytes": pool.fabric().unpinned_bytes(),
            },
            "fuse": {"transport": self.fuse_transport.get().copied().unwrap_or("")},
            "writeback": {
                "cache": self.config.writeback,
                // New writable handles: through the kernel's cache, or written through.
                "new_handles": match (self.config.writeback, self.direct_writes()) {
                    (false, _) => "uncached",
                    (true, true) => "direct",
                    (true, false) => "cached",
                },
                "dirty_limit_bytes": self.dirty_limit.get().map_or(0, |l| l.bytes()),
                "free_room_bytes": self.free_room(),
            },
            "fabric_batches": batches,
            "servers": servers,
            "chunks": {
                "copies": self.data.replicas(),
                "healthy": h.healthy,
                "degraded": h.degraded,
                "lost": h.lost,
            },
            "rebuild": {
                "running": r.running.load(Ordering::Relaxed),
                "passes": r.passes.load(Ordering::Relaxed),
                "chunks_rebuilt": r.chunks_rebuilt.load(Ordering::Relaxed),
                "bytes_copied": r.bytes_copied.load(Ordering::Relaxed),
                "last_rate_bytes_per_s": r.last_rate.load(Ordering::Relaxed),
                "chunks_left_degraded": r.left_degraded.load(Ordering::Relaxed),
            },
            "inodes": self.inode_count(),
            "contained_panics": self.contained_panics(),
            "upkeep_panics": self.upkeep_panics.to_json(),
            "requests": requests,
        })
    }

    /// What `rmemfs stats` prints: [`Fs::stats_json`] as text, so a figure is added once.
    pub fn stats_text(&self) -> String {
        stats_text_of(&self.stats_json())
    }
}

/// The text of `rmemfs stats` from the object [`Fs::stats_json`] builds.
fn stats_text_of(v: &serde_json::Value) -> String {
    use std::fmt::Write;
    // Field `path` ("a.b") as a number, or as text; absent fields read 0 and "".
    let field = |path: &str| path.split('.').try_fold(v, |v, k| v.get(k));
    let n = |path: &str| field(path).and_then(serde_json::Value::as_u64).unwrap_or(0);
    let t = |path: &str| {
        field(path)
            .and_then(serde_json::Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let mut out = String::new();
    let rc = |k: &str| n(&format!("registration_cache.{k}"));
    let (lookups, hits) = (rc("lookups"), rc("hits") + rc("subset_hits"));
    let _ = writeln!(
        out,
        "registration cache: {}",
        t("registration_cache.policy")
    );
    let _ = writeln!(
        out,
        "  lookups {lookups} (hits {}, subset hits {}, overlaps {}, misses {}), hit ratio {:.1}%",
        rc("hits"),
        rc("subset_hits"),
        rc("overlaps"),
        rc("misses"),
        if lookups == 0 {
            0.0
        } else {
            100.0 * hits as f64 / lookups as f64
        }
    );
    let _ = writeln!(
        out,
        "  registrations {} ({} pages), deregistrations {} in {} batches ({} pages), \
         full-cache events {}",
        rc("registrations"),
        rc("registered_pages"),
        rc("deregistrations"),
        rc("deregistration_batches"),
        rc("deregistered_pages"),
        rc("full_events")
    );
    let _ = writeln!(
        out,
        "  cached regions {}, pinned {} pages",
        rc("regions"),
        rc("pinned_pages")
    );
    let fab = |k: &str| n(&format!("fabric.{k}"));
    if !t("fuse.transport").is_empty() {
        let _ = writeln!(out, "fuse: {}", t("fuse.transport"));
    }
    let _ = writeln!(
        out,
        "writeback: new writable handles {}; dirty limit {} bytes (0: not kept); pool room {} \
         bytes",
        t("writeback.new_handles"),
        n("writeback.dirty_limit_bytes"),
        n("writeback.free_room_bytes")
    );
    let _ = writeln!(out, "fabric: {}", t("fabric.name"));
    let _ = writeln!(
        out,
        "  reads {} ({} bytes), writes {} ({} bytes), failed {} (remote access errors {}); \
         remote requests refused here {}",
        fab("reads"),
        fab("bytes_read"),
        fab("writes"),
        fab("bytes_written"),
        fab("failed"),
        fab("remote_errors"),
        fab("remote_refused")
    );
    let _ = writeln!(
        out,
        "  registrations {}, deregistrations {} in {} batches, pinned {} bytes{}",
        fab("registrations"),
        fab("deregistrations"),
        fab("deregistration_batches"),
        fab("pinned_bytes"),
        match fab("unpinned_bytes") {
            0 => String::new(),
            n => format!(", unpinned {n} bytes (the memlock limit, `ulimit -l`, refused more)"),
        }
    );
    // Per operation: count, mean, p50 and p99 in µs (by name: JSON objects keep keys sorted).
    let by_op = |out: &mut String, key: &str, indent: &str| {
        for (op, f) in v.get(key).and_then(|o| o.as_object()).into_iter().flatten() {
            let g = |k: &str| f.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
            let _ = writeln!(
                out,
                "{indent}{op} {} {} {} {}",
                g("count"),
                g("mean_us"),
                g("p50_us"),
                g("p99_us")
            );
        }
    };
    let _ = writeln!(
        out,
        "  batches, post to last completion: kind count mean_us p50_us p99_us"
    );
    by_op(&mut out, "fabric_batches", "    ");
    let now = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    for s in v
        .get("servers")
        .and_then(|s| s.as_array())
        .into_iter()
        .flatten()
    {
        let g = |k: &str| s.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
        let state = s.get("state").and_then(|x| x.as_str()).unwrap_or("");
        let _ = writeln!(
            out,
            "server server#{} {}: {}, since {} ({} s); {} of {} bytes free; down {} times",
            g("id"),
            s.get("addr").and_then(|x| x.as_str()).unwrap_or(""),
            // Trouble in capitals, to stand out.
            if state == "up" {
                state.to_string()
            } else {
                state.to_uppercase()
            },
            utc(g("since")),
            now.saturating_sub(g("since")),
            g("free_bytes"),
            g("total_bytes"),
            g("downs")
        );
    }
    let _ = writeln!(
        out,
        "chunks: {} copies each; healthy {}, degraded {}, lost {}",
        n("chunks.copies"),
        n("chunks.healthy"),
        n("chunks.degraded"),
        n("chunks.lost")
    );
    let rb = |k: &str| n(&format!("rebuild.{k}"));
    let running = field("rebuild.running").and_then(serde_json::Value::as_bool) == Some(true);
    let _ = writeln!(
        out,
        "rebuild: {}; {} passes, {} chunks ({} bytes) copied, last rate {} bytes/s, {} \
         chunks left short of copies",
        if running { "running" } else { "idle" },
        rb("passes"),
        rb("chunks_rebuilt"),
        rb("bytes_copied"),
        rb("last_rate_bytes_per_s"),
        rb("chunks_left_degraded")
    );
    let _ = writeln!(out, "inodes: {}", n("inodes"));
    let _ = writeln!(
        out,
        "requests failed by a contained panic: {}",
        n("contained_panics")
    );
    let _ = writeln!(
        out,
        "upkeep threads started again after a panic: {}",
        crate::rebuild::UPKEEP_THREADS
            .map(|t| format!("{t} {}", n(&format!("upkeep_panics.{t}"))))
            .join(", ")
    );
    let _ = writeln!(out, "requests: op count mean_us p50_us p99_us");
    by_op(&mut out, "requests", "  ");
    out
}

/// `YYYY-MM-DD HH:MM:SS UTC` (days to a civil date: H. Hinnant's algorithm), for `stats`.
fn utc(secs: u64) -> String {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod stats_text_tests {
    use super::{stats_text_of, utc};

    #[test]
    fn the_text_renders_every_section_of_the_json() {
        let v = serde_json::json!({
            "registration_cache": {"policy": "mrrc", "lookups": 4, "hits": 2, "subset_hits": 1,
                                   "overlaps": 0, "misses": 1, "regions": 3},
            "fabric": {"name": "tcp", "reads": 7, "bytes_read": 28672, "unpinned_bytes": 4096},
            "fabric_batches": {"read": {"count": 7, "mean_us": 45, "p50_us": 64, "p99_us": 128}},
            "servers": [
                {"id": 0, "addr": "127.0.0.1:7471", "state": "up", "since": 0,
                 "free_bytes": 10, "total_bytes": 20, "downs": 0},
                {"id": 1, "addr": "127.0.0.1:7472", "state": "down", "since": 86_400,
                 "free_bytes": 0, "total_bytes": 20, "downs": 2}
            ],
            "chunks": {"copies": 2, "healthy": 5, "degraded": 1, "lost": 0},
            "rebuild": {"running": true, "passes": 1},
            "inodes": 9,
            "contained_panics": 0,
            "upkeep_panics": {"heartbeat": 0, "reconnect": 2, "rebuild": 1},
            "requests": {"read": {"count": 7, "mean_us": 70, "p50_us": 64, "p99_us": 128},
                         "lookup": {"count": 2, "mean_us": 10, "p50_us": 16, "p99_us": 16}}
        });
        let text = stats_text_of(&v);
        for line in [
            "registration cache: mrrc",
            "  lookups 4 (hits 2, subset hits 1, overlaps 0, misses 1), hit ratio 75.0%",
            "  cached regions 3, pinned 0 pages",
            "fabric: tcp",
            "  reads 7 (28672 bytes), writes 0 (0 bytes), failed 0 (remote access errors 0); \
             remote requests refused here 0",
            "    read 7 45 64 128",
            "chunks: 2 copies each; healthy 5, degraded 1, lost 0",
            "inodes: 9",
            "upkeep threads started again after a panic: heartbeat 0, reconnect 2, rebuild 1",
            "  lookup 2 10 16 16",
            "  read 7 70 64 128",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line:?} missing from\n{text}"
            );
        }
        assert!(text.contains("unpinned 4096 bytes"), "{text}");
        assert!(text.contains("rebuild: running; 1 passes"), "{text}");
        assert!(text.contains("server server#0 127.0.0.1:7471: up, since 1970-01-01 00:00:00 UTC"));
        assert!(
            text.contains("server server#1 127.0.0.1:7472: DOWN, since 1970-01-02 00:00:00 UTC")
        );
        assert!(text.contains("0 of 20 bytes free; down 2 times"), "{text}");
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        // 2024-02-29 12:34:56 UTC, a leap day.
        assert_eq!(utc(1_709_210_096), "2024-02-29 12:34:56 UTC");
    }
}
