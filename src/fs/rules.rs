//! The rules operations share: who the caller is, which set-ID bits a change drops, what
//! the inode flags (`chattr`) forbid, and when a read moves the access time.

use super::Fs;
use crate::error::{Error, Result};
use crate::meta::{Batch, Ino, Inode, Kind};
use crate::sync::atomic::{AtomicU32, Ordering};
use std::time::SystemTime;

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

pub(super) const S_ISUID: u16 = 0o4000;
pub(super) const S_ISGID: u16 = 0o2000;
const S_IXGRP: u16 = 0o0010;

/// A set-group-ID directory `parent` hands its group to what is made in it, and its
/// set-group-ID bit to subdirectories (the kernel already stripped the bit from a requested
/// mode the caller may not have).
pub(super) fn inherit_group(parent: &Inode, inode: &mut Inode) {
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
pub(super) fn set_id_bits_to_drop(
    perm: u16,
    caller: &Caller,
    in_group: impl FnOnce() -> bool,
) -> u16 {
    if caller.privileged() {
        return 0;
    }
    let mut drop = perm & S_ISUID;
    if perm & S_ISGID != 0 && (perm & S_IXGRP != 0 || !in_group()) {
        drop |= S_ISGID;
    }
    drop
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
pub(super) fn check_mutable(i: &Inode) -> Result<()> {
    if i.flags & (FS_IMMUTABLE_FL | FS_APPEND_FL) != 0 {
        return Err(Error::new(
            libc::EPERM,
            "the inode is immutable or append-only (chattr)",
        ));
    }
    Ok(())
}

/// EPERM for an immutable inode (no data or entry changes at all).
pub(super) fn check_not_immutable(i: &Inode) -> Result<()> {
    if i.flags & FS_IMMUTABLE_FL != 0 {
        return Err(Error::new(
            libc::EPERM,
            "the inode is immutable (chattr +i)",
        ));
    }
    Ok(())
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

/// How mount flags name a rule for files and whether directory reads count
/// ("relatime,nodiratime").
pub fn access_flags_name(atime: Atime, dir_atime: bool) -> String {
    format!(
        "{}{}",
        atime.flag(),
        if dir_atime { "" } else { ",nodiratime" }
    )
}

impl Atime {
    /// The mount flag that names this rule.
    pub fn flag(self) -> &'static str {
        match self {
            Atime::Relative => "relatime",
            Atime::Strict => "strictatime",
            Atime::Never => "noatime",
        }
    }

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

/// The access-time rule in force, read at every access: it starts as the mount's options
/// say, and follows the mount's flags when the kernel's change (`mount -o remount,noatime`:
/// `mount::flags` reads them and calls [`Fs::set_access_times`]).
#[derive(Debug)]
pub(super) struct AccessTimes(AtomicU32);

impl AccessTimes {
    /// Bit set: directory reads leave the directory's access time alone (`nodiratime`).
    const NO_DIR: u32 = 4;

    pub(super) fn new(atime: Atime, dir_atime: bool) -> AccessTimes {
        AccessTimes(AtomicU32::new(Self::encode(atime, dir_atime)))
    }

    fn encode(atime: Atime, dir_atime: bool) -> u32 {
        let rule = match atime {
            Atime::Relative => 0,
            Atime::Strict => 1,
            Atime::Never => 2,
        };
        rule | if dir_atime { 0 } else { Self::NO_DIR }
    }

    /// The rule for files, and whether directory reads move access times too.
    pub(super) fn get(&self) -> (Atime, bool) {
        let v = self.0.load(Ordering::Relaxed);
        let atime = match v & 3 {
            0 => Atime::Relative,
            1 => Atime::Strict,
            _ => Atime::Never,
        };
        (atime, v & Self::NO_DIR == 0)
    }

    fn set(&self, atime: Atime, dir_atime: bool) {
        self.0
            .store(Self::encode(atime, dir_atime), Ordering::Relaxed);
    }
}

impl Fs {
    /// The mount's access-time flags changed (a remount): reads follow `atime` from now on,
    /// and directory reads only with `dir_atime`. A namespace that keeps no access times (a
    /// shared volume's, whose reads take no turn) stays as it is; its mount follows no flags
    /// ([`Fs::follows_mount_flags`]).
    pub fn set_access_times(&self, atime: Atime, dir_atime: bool) {
        if !self.config.fixed_access_times {
            self.access_times.set(atime, dir_atime);
        }
    }

    /// Whether the access-time rule follows the mount's flags (not on a namespace that keeps
    /// no access times).
    pub fn follows_mount_flags(&self) -> bool {
        !self.config.fixed_access_times
    }

    /// The access-time rule in force (see [`AccessTimes`]).
    pub fn access_times(&self) -> (Atime, bool) {
        self.access_times.get()
    }

    /// An access of `ino` (a read, a directory read, a symlink read): its access time moves
    /// as the mount says, unless the mount is read-only or the inode is `chattr +A`.
    pub(super) fn accessed(&self, b: &mut Batch<'_>, ino: Ino) -> Result<()> {
        let i = super::inode(b, ino)?;
        if self.config.read_only || i.flags & FS_NOATIME_FL != 0 {
            return Ok(());
        }
        let now = crate::meta::now();
        if self.access_times.get().0.due(i, now) {
            b.update(ino, |a| a.atime = now)?;
        }
        Ok(())
    }

    /// Clears the set-ID bits a modification by `caller` removes (see
    /// [`set_id_bits_to_drop`]); the group lookup happens outside the metadata lock.
    pub(super) fn drop_set_id_bits(&self, ino: Ino, caller: &Caller) -> Result<()> {
        let (perm, gid) = {
            let meta = self.meta.lock();
            let i = super::inode(&meta, ino)?;
            (i.perm, i.gid)
        };
        let bits = set_id_bits_to_drop(perm, caller, || caller.in_group(gid));
        if bits != 0 {
            {
                let mut meta = self.meta.lock();
                let mut b = meta.batch();
                let now = crate::meta::now();
                b.update(ino, |a| {
                    a.perm &= !bits;
                    a.ctime = now;
                })?;
                b.commit()?;
            }
            self.tell_attr_changed(ino);
        }
        Ok(())
    }
}
