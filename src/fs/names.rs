//! Names: lookup and the kernel's references, making inodes (mknod, mkdir, symlink), links,
//! unlink, rmdir and rename.

use super::rules::{check_mutable, check_not_immutable, inherit_group};
use super::{attr_of, check_name, dir_of, err, inode, new_inode, Attr, Caller, Fs};
use super::{RENAME_EXCHANGE, RENAME_NOREPLACE, RENAME_WHITEOUT};
use crate::error::{Error, Result};
use crate::meta::{Body, Dir, Ino, Inode, Kind, Meta, NAME_MAX};
use crate::sync::Arc;

impl Fs {
    /// Looks `name` up in `parent`; counts a kernel reference on success.
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr> {
        // Asked before the table is read: held then, the table's view of the directory was
        // the engine's when it was read.
        let held = self.holds_turn(parent);
        match self.loading(|| self.lookup_here(parent, name)) {
            // On a shared volume a name another client made may not have reached this table
            // yet: it catches up once before saying there is none (a path another client just
            // made resolves at once), unless this client holds the directory's turn (no
            // other client can have added a name to it) or the engine says no change touched
            // the name since this table's view of it.
            Err(e)
                if e.errno == libc::ENOENT && !held && self.refresh_shared_name(parent, name) =>
            {
                self.loading(|| self.lookup_here(parent, name))
            }
            r => r,
        }
    }

    fn lookup_here(&self, parent: Ino, name: &[u8]) -> Result<Attr> {
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
            b"." if inode(&meta, parent)?.nlink == 0 => return Err(err(libc::ESTALE)),
            b"." => parent,
            b".." => dir_of(&meta, parent)?.parent(),
            _ => dir_of(&meta, parent)?
                .get(name)
                .ok_or_else(|| err(libc::ENOENT))?,
        };
        inode(&meta, ino)?;
        meta.hold(ino, 1);
        Ok(attr_of(ino, inode(&meta, ino)?))
    }

    /// The kernel dropped `n` references.
    pub fn forget(&self, ino: Ino, n: u64) {
        let mut meta = self.meta.lock();
        meta.release_refs(ino, n);
        self.settle(meta, ino);
    }

    /// What a new inode takes from its directory `p`: the group of a set-group-ID directory,
    /// and the directory's default ACL, which when present decides the permissions (and the
    /// new inode's ACLs) instead of the caller's umask.
    pub(super) fn inherit_from_parent(&self, p: &Inode, inode: &mut Inode, caller: Caller) {
        inherit_group(p, inode);
        super::redundancy::inherit(p, inode);
        // Symlinks have neither ACLs nor a umask.
        let default_acl = self
            .config
            .acl
            .then(|| p.xattrs.as_ref()?.get(crate::fs::acl::DEFAULT_XATTR))
            .flatten()
            .and_then(|v| crate::fs::acl::Acl::parse(v).ok().map(|a| (a, v.clone())));
        if inode.kind != Kind::Symlink {
            match default_acl {
                Some((acl, raw)) => {
                    let (access, bits) = acl.inherit(inode.perm);
                    inode.perm = bits;
                    let x = inode.xattrs.get_or_insert_with(Default::default);
                    if let Some(a) = access {
                        x.insert(crate::fs::acl::ACCESS_XATTR.into(), a.to_xattr().into());
                    }
                    if inode.kind == Kind::Dir {
                        x.insert(crate::fs::acl::DEFAULT_XATTR.into(), raw);
                    }
                }
                None => inode.perm &= !(caller.umask as u16 & 0o777),
            }
        }
    }

    /// Adds a fresh inode (`build` makes it) under `parent/name` and counts a kernel
    /// reference to it.
    fn make(
        &self,
        parent: Ino,
        name: &[u8],
        build: impl Fn() -> Inode,
        caller: Caller,
    ) -> Result<Attr> {
        self.changing(|| self.make_once(parent, name, build(), caller))
    }

    fn make_once(&self, parent: Ino, name: &[u8], inode: Inode, caller: Caller) -> Result<Attr> {
        self.writable()?;
        check_name(name)?;
        let mut meta = self.meta.lock();
        if dir_of(&meta, parent)?.get(name).is_some() {
            return Err(err(libc::EEXIST));
        }
        let p = super::inode(&meta, parent)?;
        check_not_immutable(p)?;
        let is_dir = inode.kind == Kind::Dir;
        let mut inode = inode;
        self.inherit_from_parent(p, &mut inode, caller);
        let mut b = meta.batch();
        let ino = b.make(inode);
        b.insert_entry(parent, name, ino)?;
        b.stamp_dir(parent, i32::from(is_dir))?;
        b.commit()?;
        meta.hold(ino, 1);
        Ok(attr_of(ino, super::inode(&meta, ino)?))
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
        if matches!(kind, Kind::Dir | Kind::Symlink) {
            return Err(err(libc::EINVAL));
        }
        let build = || {
            let body = match kind {
                Kind::File => Body::File(Arc::default()),
                _ => Body::Special,
            };
            let mut inode = new_inode(kind, (mode & 0o7777) as u16, caller, body);
            inode.rdev = rdev;
            inode
        };
        self.make(parent, name, build, caller)
    }

    pub fn mkdir(&self, parent: Ino, name: &[u8], mode: u32, caller: Caller) -> Result<Attr> {
        let build = || {
            let body = Body::Dir(Box::new(Dir::new(parent)));
            new_inode(Kind::Dir, (mode & 0o7777) as u16, caller, body)
        };
        self.make(parent, name, build, caller)
    }

    pub fn symlink(&self, parent: Ino, name: &[u8], target: &[u8], caller: Caller) -> Result<Attr> {
        if target.is_empty() {
            return Err(err(libc::ENOENT));
        }
        if target.len() > libc::PATH_MAX as usize {
            return Err(err(libc::ENAMETOOLONG));
        }
        let build = || {
            let mut inode = new_inode(Kind::Symlink, 0o777, caller, Body::Symlink(target.into()));
            inode.size = target.len() as u64;
            inode
        };
        self.make(parent, name, build, caller)
    }

    pub fn link(&self, ino: Ino, newparent: Ino, newname: &[u8]) -> Result<Attr> {
        self.changing(|| self.link_once(ino, newparent, newname))
    }

    fn link_once(&self, ino: Ino, newparent: Ino, newname: &[u8]) -> Result<Attr> {
        self.writable()?;
        check_name(newname)?;
        let mut meta = self.meta.lock();
        if inode(&meta, ino)?.kind == Kind::Dir {
            return Err(err(libc::EPERM));
        }
        if dir_of(&meta, newparent)?.get(newname).is_some() {
            return Err(err(libc::EEXIST));
        }
        check_mutable(inode(&meta, ino)?)?;
        check_not_immutable(inode(&meta, newparent)?)?;
        let source = inode(&meta, ino)?;
        if source.nlink == 0 && !source.tmpfile {
            return Err(Error::new(libc::ENOENT, "the file was unlinked"));
        }
        let mut b = meta.batch();
        b.insert_entry(newparent, newname, ino)?;
        b.stamp_dir(newparent, 0)?;
        let now = crate::meta::now();
        b.update(ino, |a| {
            a.tmpfile = false;
            a.nlink += 1;
            a.ctime = now;
        })?;
        b.commit()?;
        meta.hold(ino, 1);
        Ok(attr_of(ino, inode(&meta, ino)?))
    }

    pub fn unlink(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.remove(parent, name, false)
    }

    pub fn rmdir(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.remove(parent, name, true)
    }

    fn remove(&self, parent: Ino, name: &[u8], want_dir: bool) -> Result<()> {
        self.removing(|drop_now| self.remove_once(parent, name, want_dir, drop_now))
    }

    /// Runs change `op`, which may take a file's last name away. On a shared volume, a file
    /// that no handle here holds goes in the same change (`op(true)`, as JuiceFS deletes a
    /// file at its unlink): its drop at the kernel's FORGET cost a second round trip to the
    /// engine. Open on another client, the engine refuses that drop: the name goes alone
    /// (`op(false)`), and that client drops the file once it lets go. Elsewhere the file goes
    /// at the kernel's FORGET, as a local file system's does.
    fn removing(&self, op: impl Fn(bool) -> Result<()>) -> Result<()> {
        if !self.is_shared() {
            return self.changing(|| op(false));
        }
        match self.changing(|| op(true)) {
            Err(e) if e.held_elsewhere.is_some() => self.changing(|| op(false)),
            r => r,
        }
    }

    /// Removes `name` from `parent`; with `drop_now`, drops the file it named at once if
    /// that was its last name and no handle here holds it (see [`Fs::removing`]).
    fn remove_once(&self, parent: Ino, name: &[u8], want_dir: bool, drop_now: bool) -> Result<()> {
        self.writable()?;
        if name == b"." {
            return Err(err(libc::EINVAL));
        }
        if name == b".." {
            return Err(err(libc::ENOTEMPTY));
        }
        let mut meta = self.meta.lock();
        let ino = dir_of(&meta, parent)?
            .get(name)
            .ok_or_else(|| err(libc::ENOENT))?;
        // The kernel's may_delete order: chattr flags refuse before the entry's kind or a
        // directory's emptiness is looked at.
        check_mutable(inode(&meta, parent)?)?;
        check_mutable(inode(&meta, ino)?)?;
        Self::check_removable(&meta, ino, want_dir)?;
        let mut b = meta.batch();
        b.remove_entry(parent, name)?;
        b.stamp_dir(parent, -i32::from(want_dir))?;
        let now = crate::meta::now();
        b.update(ino, |a| {
            a.nlink = if want_dir { 0 } else { a.nlink - 1 };
            a.ctime = now;
        })?;
        let dropped = drop_now.then(|| b.drop_unlinked(ino)).flatten();
        b.commit()?;
        self.settle_removed(meta, ino, dropped);
        Ok(())
    }

    /// After a committed change that took inode `ino`'s name: its data goes if the change
    /// dropped it (`dropped`: what [`crate::meta::Batch::drop_unlinked`] gave), else it is
    /// settled as any inode the kernel may still hold.
    fn settle_removed(
        &self,
        meta: crate::sync::MutexGuard<'_, Meta>,
        ino: Ino,
        dropped: Option<Option<Arc<crate::meta::FileData>>>,
    ) {
        match dropped {
            // Its drop, committed, names its chunks gone.
            Some(file) => {
                drop(meta);
                if let Some(f) = file {
                    self.data.release_all(&f);
                }
            }
            None => self.settle(meta, ino),
        }
    }

    /// Whether `victim` may go away in favour of (or as) a directory (`as_dir`) or not: the
    /// one rule `unlink`, `rmdir` and a replacing `rename` share.
    /// A directory's emptiness is read from its names: a partial table loads them first.
    fn check_removable(meta: &Meta, victim: Ino, as_dir: bool) -> Result<()> {
        let victim_dir = inode(meta, victim)?.dir();
        if victim_dir.is_some() && meta.names_unloaded(victim) {
            return Err(Error::unloaded(victim));
        }
        match (as_dir, victim_dir) {
            (true, None) => Err(err(libc::ENOTDIR)),
            (false, Some(_)) => Err(err(libc::EISDIR)),
            (true, Some(d)) if !d.is_empty() => Err(err(libc::ENOTEMPTY)),
            _ => Ok(()),
        }
    }

    /// True if `ino` is `ancestor` or lies below it. A partial table loads each directory
    /// above it that it does not hold ([`Error::unloaded`]): the walk must reach the root.
    fn is_within(meta: &Meta, mut ino: Ino, ancestor: Ino) -> Result<bool> {
        loop {
            if ino == ancestor {
                return Ok(true);
            }
            match inode(meta, ino)?.dir() {
                Some(d) if d.parent() != ino => ino = d.parent(),
                _ => return Ok(false),
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
        let asked = RenameAsked {
            parent,
            name,
            newparent,
            newname,
            flags,
        };
        self.removing(|drop_now| self.rename_once(asked, caller, drop_now))
    }

    /// With `drop_now`, a file whose last name the rename replaces goes with it if no handle
    /// here holds it (see [`Fs::removing`]).
    fn rename_once(&self, asked: RenameAsked<'_>, caller: Caller, drop_now: bool) -> Result<()> {
        let RenameAsked {
            parent,
            name,
            newparent,
            newname,
            flags,
        } = asked;
        self.writable()?;
        check_name(name)?;
        check_name(newname)?;
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT) != 0
            || flags & RENAME_EXCHANGE != 0 && flags != RENAME_EXCHANGE
        {
            return Err(err(libc::EINVAL));
        }
        let mut meta = self.meta.lock();
        let src = dir_of(&meta, parent)?
            .get(name)
            .ok_or_else(|| err(libc::ENOENT))?;
        let dst = dir_of(&meta, newparent)?.get(newname);
        // The kernel refuses a taken name under RENAME_NOREPLACE at its lookup, before
        // anything else.
        if dst.is_some() && flags & RENAME_NOREPLACE != 0 {
            return Err(err(libc::EEXIST));
        }
        // Moving an entry deletes it from one directory and adds it to another: the
        // kernel's may_delete and may_create rules for chattr flags.
        check_mutable(inode(&meta, parent)?)?;
        check_mutable(inode(&meta, src)?)?;
        check_not_immutable(inode(&meta, newparent)?)?;
        if let Some(d) = dst {
            check_mutable(inode(&meta, newparent)?)?;
            check_mutable(inode(&meta, d)?)?;
        }
        let src_is_dir = inode(&meta, src)?.kind == Kind::Dir;
        // A directory cannot move below itself.
        if src_is_dir && Self::is_within(&meta, newparent, src)? {
            return Err(err(libc::EINVAL));
        }
        let now = crate::meta::now();
        if flags & RENAME_EXCHANGE != 0 {
            let dst = dst.ok_or_else(|| err(libc::ENOENT))?;
            let dst_is_dir = inode(&meta, dst)?.kind == Kind::Dir;
            if dst_is_dir && Self::is_within(&meta, parent, dst)? {
                return Err(err(libc::EINVAL));
            }
            let mut b = meta.batch();
            b.replace_entry(parent, name, dst)?;
            b.replace_entry(newparent, newname, src)?;
            // Links `parent` gains (a directory moved in, less one moved out).
            let mut gained = 0;
            if parent != newparent {
                for (moved, is_dir, to, into_parent) in [
                    (src, src_is_dir, newparent, -1),
                    (dst, dst_is_dir, parent, 1),
                ] {
                    if is_dir {
                        b.set_parent(moved, to)?;
                        gained += into_parent;
                    }
                }
            }
            for ino in [src, dst] {
                b.update(ino, |a| a.ctime = now)?;
            }
            b.stamp_dir(parent, gained)?;
            if newparent != parent {
                b.stamp_dir(newparent, -gained)?;
            }
            return b.commit();
        }
        if let Some(dst) = dst {
            if dst == src {
                return Ok(()); // two names of one file: nothing to do
            }
            Self::check_removable(&meta, dst, src_is_dir)?;
        }
        // Detach the source, then put it in place of (or beside) the target.
        let mut b = meta.batch();
        b.remove_entry(parent, name)?;
        if flags & RENAME_WHITEOUT != 0 {
            let mut whiteout = new_inode(Kind::CharDevice, 0, caller, Body::Special);
            whiteout.rdev = 0;
            let w = b.make(whiteout);
            b.insert_entry(parent, name, w)?;
        }
        let replaced = b.remove_entry(newparent, newname)?;
        b.insert_entry(newparent, newname, src)?;
        let moved_dir = src_is_dir && parent != newparent;
        if moved_dir {
            b.set_parent(src, newparent)?;
        }
        b.update(src, |a| a.ctime = now)?;
        b.stamp_dir(parent, -i32::from(moved_dir))?;
        if newparent != parent {
            b.stamp_dir(newparent, i32::from(moved_dir))?;
        }
        if let Some(old) = replaced {
            let was_dir = inode(&b, old)?.kind == Kind::Dir;
            b.update(old, |a| {
                a.nlink = if was_dir { 0 } else { a.nlink - 1 };
                a.ctime = now;
            })?;
            if was_dir {
                b.stamp_dir(newparent, -1)?;
            }
            let dropped = drop_now.then(|| b.drop_unlinked(old)).flatten();
            b.commit()?;
            self.settle_removed(meta, old, dropped);
            return Ok(());
        }
        b.commit()
    }
}

/// What a `rename(2)` asks: `parent/name` to `newparent/newname`, with `RENAME_*` flags.
#[derive(Clone, Copy)]
struct RenameAsked<'a> {
    parent: Ino,
    name: &'a [u8],
    newparent: Ino,
    newname: &'a [u8],
    flags: u32,
}
