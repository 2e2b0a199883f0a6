//! Attributes: `stat`, `setattr` (mode, owner, size, times), symlink targets, inode flags
//! and `access(2)`.

use super::rules::{check_mutable, check_not_immutable, set_id_bits_to_drop, INODE_FLAGS, S_ISGID};
use super::{attr_of, err, inode, Attr, Caller, Fs, SetAttr, SetTime};
use crate::error::{Error, Result};
use crate::meta::{Body, Ino, Kind};

impl Fs {
    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        let meta = self.meta.lock();
        Ok(attr_of(ino, inode(&meta, ino)?))
    }

    /// `setattr` by `caller`. As the kernel leaves it to the file system (it negotiates
    /// FUSE_HANDLE_KILLPRIV_V2): a truncation by a caller without CAP_FSETID drops set-ID
    /// bits as a write does, and a change of owner or group drops set-user-ID, and
    /// set-group-ID from a group-executable file.
    pub fn setattr(&self, ino: Ino, set: &SetAttr, caller: Caller) -> Result<Attr> {
        let _turn = self.file_turn(ino)?;
        if set.mode.is_some() || set.uid.is_some() || set.gid.is_some() || set.size.is_some() {
            self.writable()?;
        }
        {
            let meta = self.meta.lock();
            let i = inode(&meta, ino)?;
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
        let i = inode(&meta, ino)?;
        let (kind, mut perm, gid) = (i.kind, i.perm, i.gid);
        let now = crate::meta::now();
        let mut killed = false;
        if (set.uid.is_some() || set.gid.is_some()) && kind != Kind::Dir && set.mode.is_none() {
            // chown drops as an unprivileged write would, whoever changes the owner, with
            // the group test left out (the kernel's chown_common).
            let anyone = Caller {
                cap_fsetid: false,
                ..caller
            };
            let bits = set_id_bits_to_drop(perm, &anyone, || true);
            perm &= !bits;
            killed = bits != 0;
        }
        // chmod moves the access ACL's owner, mask and other entries with it.
        let mut moved_acl = None;
        if let Some(mode) = set.mode {
            perm = (mode & 0o7777) as u16;
            // The kernel's setattr_prepare: set-group-ID is kept only by a member of the
            // (new) group or a caller with CAP_FSETID, on files and directories alike.
            let group = set.gid.unwrap_or(gid);
            if perm & S_ISGID != 0 && !caller.privileged() && !caller.in_group(group) {
                perm &= !S_ISGID;
            }
            let acl = i
                .xattrs
                .as_ref()
                .and_then(|x| x.get(crate::fs::acl::ACCESS_XATTR));
            if let Some(Ok(mut acl)) = acl.map(|v| crate::fs::acl::Acl::parse(v)) {
                acl.chmod(perm);
                moved_acl = Some(acl.to_xattr());
            }
        }
        let pick = |t: SetTime| match t {
            SetTime::Now => now,
            SetTime::At(t) => t,
        };
        let mut b = meta.batch();
        if let Some(acl) = &moved_acl {
            b.set_xattr(ino, crate::fs::acl::ACCESS_XATTR, acl)?;
        }
        b.update(ino, |a| {
            a.perm = perm;
            if let Some(uid) = set.uid {
                a.uid = uid;
            }
            if let Some(gid) = set.gid {
                a.gid = gid;
            }
            if let Some(t) = set.atime {
                a.atime = pick(t);
            }
            if let Some(t) = set.mtime {
                a.mtime = pick(t);
            }
            a.ctime = set.ctime.unwrap_or(now);
        })?;
        b.commit()?;
        let attr = attr_of(ino, inode(&meta, ino)?);
        drop(meta);
        if set.size.is_some() && set.mode.is_none() && attr.kind == Kind::File {
            self.drop_set_id_bits(ino, &caller)?;
        }
        if moved_acl.is_some() || killed {
            // The kernel caches ACLs: have it forget this inode's.
            self.tell_attr_changed(ino);
        }
        Ok(attr)
    }

    /// Dates a shared volume's root, which every client's table starts with the epoch for
    /// its times ([`crate::meta::Meta::new_shared`]: a name's change moves only the
    /// directory's change and modification times, so tables started at different times
    /// would differ): birth and access now, and the other two now where no change moved
    /// them yet. Under the root's turn (the table caught up with it), so one client does it
    /// once; whether this one did.
    pub fn date_new_root(&self) -> Result<bool> {
        let epoch = std::time::SystemTime::UNIX_EPOCH;
        let undated = |fs: &Fs| -> Result<bool> {
            Ok(inode(&fs.meta.lock(), crate::meta::ROOT_INO)?.btime == epoch)
        };
        // The turn only for a root not dated yet: held, it would keep other clients' changes
        // of the root waiting.
        if !undated(self)? {
            return Ok(false);
        }
        let _turn = self.file_turn(crate::meta::ROOT_INO)?;
        if !undated(self)? {
            return Ok(false);
        }
        let mut meta = self.meta.lock();
        let now = crate::meta::now();
        let mut b = meta.batch();
        b.update(crate::meta::ROOT_INO, |a| {
            a.btime = now;
            a.atime = now;
            for t in [&mut a.mtime, &mut a.ctime] {
                if *t == epoch {
                    *t = now;
                }
            }
        })?;
        b.commit()?;
        Ok(true)
    }

    /// Sets a regular file's size (truncate or extend with a hole).
    pub(super) fn resize(&self, ino: Ino, size: u64) -> Result<()> {
        self.data.check_end(size, 0)?;
        let file = {
            let meta = self.meta.lock();
            let i = inode(&meta, ino)?;
            match i.kind {
                Kind::File => i.file().cloned().expect("files have data"),
                Kind::Dir => return Err(err(libc::EISDIR)),
                _ => return Err(err(libc::EINVAL)),
            }
        };
        // Cutting zeroes the rest of the chunk the file now ends in, in place.
        let cut_end = size.next_multiple_of(self.data.chunk_size());
        let mut io = self.lock_for_overwrite(ino, &file, |_| (size, cut_end))?;
        let old = inode(&self.meta.lock(), ino)?.size;
        let cut = if size < old {
            io.truncate(size)
        } else if size > old {
            io.zero_past_end(old, size)
        } else {
            Ok(())
        };
        {
            let mut meta = self.meta.lock();
            let mut b = meta.batch();
            if cut.is_ok() {
                b.update(ino, |a| a.size = size)?;
                b.touch(ino, true)?;
            }
            Self::commit_with(b, ino, &mut io)?;
        }
        self.settle_overwrite(ino, &io);
        cut
    }

    /// Reads a symlink, an access of it (the kernel asks again each time it follows the link
    /// and leaves the access time to the file system).
    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        let mut meta = self.meta.lock();
        let target = match &inode(&meta, ino)?.body {
            Body::Symlink(t) => t.to_vec(),
            _ => return Err(err(libc::EINVAL)),
        };
        let mut b = meta.batch();
        self.accessed(&mut b, ino)?;
        b.commit()?;
        Ok(target)
    }

    /// The inode flags (`FS_IOC_GETFLAGS`, `lsattr`).
    pub fn get_flags(&self, ino: Ino) -> Result<u32> {
        Ok(inode(&self.meta.lock(), ino)?.flags)
    }

    /// Sets the inode flags (`FS_IOC_SETFLAGS`, `chattr`). Who may is the kernel's check
    /// (the owner; CAP_LINUX_IMMUTABLE for immutable and append-only); flags outside
    /// [`INODE_FLAGS`] are EOPNOTSUPP.
    pub fn set_flags(&self, ino: Ino, flags: u32) -> Result<()> {
        let _turn = self.file_turn(ino)?;
        self.writable()?;
        if flags & !INODE_FLAGS != 0 {
            return Err(Error::new(
                libc::EOPNOTSUPP,
                format!("inode flags {:#x} are not supported", flags & !INODE_FLAGS),
            ));
        }
        {
            let mut meta = self.meta.lock();
            let mut b = meta.batch();
            // A change of inode, even to the same flags (as on tmpfs and ext4).
            let now = crate::meta::now();
            b.update(ino, |a| {
                a.flags = flags;
                a.ctime = now;
            })?;
            b.commit()?;
        }
        // The kernel keeps no flags of a FUSE inode and does not refresh its cached
        // attributes after the ioctl: have it forget them, or stat shows the old ctime.
        self.tell_attr_changed(ino);
        Ok(())
    }

    /// `access(2)` by the usual owner/group/other rules (root may do anything but execute a
    /// file nobody may execute).
    pub fn access(&self, ino: Ino, mask: i32, caller: Caller) -> Result<()> {
        let meta = self.meta.lock();
        let i = inode(&meta, ino)?;
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
}
