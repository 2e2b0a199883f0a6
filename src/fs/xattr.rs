//! Extended attributes, dispatched by name to their handler (as the kernel's xattr handler
//! tables): virtual ones the daemon answers ([`Handler::Virtual`]; the root's report is the
//! FUSE adapter's), POSIX ACLs kept in step with the mode ([`Handler::Acl`]), and plain
//! `user.`, `trusted.` and `security.` ones.

use super::rules::{check_mutable, Caller, S_ISGID};
use super::{err, inode, Fs};
use crate::error::{Error, Result};
use crate::meta::{Ino, Kind};

/// A virtual attribute of a regular file: where each chunk's copies are, as JSON
/// (`[[chunk index, [server address, ...]], ...]`). A fault test reads it before it kills a
/// server, to name the chunks that server alone holds. Not listed by `listxattr`.
pub const PLACEMENT_XATTR: &[u8] = b"user.rmemfs.placement";

/// Setting this extended attribute (any file, value = an operation: `read` or `write`) makes
/// the next such call panic inside the file system, holding the file's lock; value = an
/// upkeep thread (`heartbeat`, `reconnect`, `rebuild`): its next round panics. Compiled only
/// with the `testing` feature.
#[cfg(feature = "testing")]
pub const INJECT_PANIC_XATTR: &[u8] = b"user.rmemfs.inject-panic";

/// Largest value kept (the kernel's XATTR_SIZE_MAX).
const XATTR_VALUE_MAX: usize = 64 * 1024;
/// Longest name (the kernel's XATTR_NAME_MAX).
const XATTR_NAME_MAX: usize = 255;

/// Who answers for an attribute name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handler {
    /// Made up by the daemon on each read (stats, placement) or a test's switch.
    Virtual,
    /// `system.posix_acl_access` and `system.posix_acl_default` (with `-o acl`).
    Acl,
    /// Stored as given.
    Plain,
}

impl Fs {
    /// The handler of `name` for a get (`reading`) or a set.
    fn handler(&self, name: &[u8], reading: bool) -> Result<Handler> {
        if reading && name == PLACEMENT_XATTR {
            return Ok(Handler::Virtual);
        }
        if name.len() > XATTR_NAME_MAX || name.is_empty() {
            return Err(err(libc::ERANGE));
        }
        #[cfg(feature = "testing")]
        if !reading && name == INJECT_PANIC_XATTR {
            return Ok(Handler::Virtual);
        }
        if self.config.acl
            && (name == crate::fs::acl::ACCESS_XATTR || name == crate::fs::acl::DEFAULT_XATTR)
        {
            return Ok(Handler::Acl);
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
        Ok(Handler::Plain)
    }

    /// Sets a `user.*`, `trusted.*` or `security.*` extended attribute, or an ACL
    /// (`XATTR_CREATE` / `XATTR_REPLACE` honoured). An access ACL sets the mode, under
    /// chmod's rule for set-group-ID (the kernel's `posix_acl_update_mode`).
    pub fn setxattr(
        &self,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        flags: i32,
        caller: Caller,
    ) -> Result<()> {
        let _turn = self.file_turn(ino)?;
        self.writable()?;
        let handler = self.handler(name, false)?;
        if value.len() > XATTR_VALUE_MAX {
            return Err(err(libc::E2BIG));
        }
        if handler == Handler::Virtual {
            #[cfg(feature = "testing")]
            {
                *self.armed_panic.lock() = Some(String::from_utf8_lossy(value).into_owned());
            }
            return Ok(());
        }
        // Whether an ACL keeps set-group-ID: the caller's groups are read from /proc, so
        // before the metadata lock (the group it is asked of is checked again under it).
        let keeps_set_gid = if name == crate::fs::acl::ACCESS_XATTR && !caller.privileged() {
            let gid = inode(&self.meta.lock(), ino)?.gid;
            Some((gid, caller.in_group(gid)))
        } else {
            None
        };
        let mut meta = self.meta.lock();
        let i = inode(&meta, ino)?;
        // As on Linux: user.* only on regular files and directories (a symlink's or a
        // device's permissions say nothing about who may annotate it).
        if name.starts_with(b"user.") && !matches!(i.kind, Kind::File | Kind::Dir) {
            return Err(err(libc::EPERM));
        }
        check_mutable(i)?;
        let (kind, mut perm) = (i.kind, i.perm);
        if let Some((gid, in_group)) = keeps_set_gid {
            if i.gid != gid || !in_group {
                perm &= !S_ISGID;
            }
        }
        let exists = i.xattrs.as_ref().is_some_and(|m| m.contains_key(name));
        let now = crate::meta::now();
        let mut b = meta.batch();
        let mut value = value;
        let stored;
        if name == crate::fs::acl::ACCESS_XATTR {
            // The mode follows the ACL; an ACL the mode says all of is not kept.
            let acl = crate::fs::acl::Acl::parse(value)?;
            b.update(ino, |a| {
                a.perm = (perm & !0o777) | acl.mode_bits();
                a.ctime = now;
            })?;
            if acl.is_minimal() {
                b.remove_xattr(ino, name)?;
                return b.commit();
            }
            stored = acl.to_xattr();
            value = &stored;
        } else if name == super::redundancy::REDUNDANCY_XATTR {
            self.check_redundancy(value)?;
        } else if name == crate::fs::acl::DEFAULT_XATTR {
            if kind != Kind::Dir {
                return Err(Error::new(libc::EACCES, "a default ACL is for directories"));
            }
            crate::fs::acl::Acl::parse(value)?;
        }
        if flags & libc::XATTR_CREATE != 0 && exists {
            return Err(err(libc::EEXIST));
        }
        if flags & libc::XATTR_REPLACE != 0 && !exists {
            return Err(err(libc::ENODATA));
        }
        b.set_xattr(ino, name, value)?;
        b.update(ino, |a| a.ctime = now)?;
        b.commit()
    }

    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        if matches!(self.handler(name, true), Ok(Handler::Virtual)) {
            let file = self.file_data(ino)?;
            let placement = self.data.view(&file).placement();
            return Ok(placement.to_string().into_bytes());
        }
        let meta = self.meta.lock();
        let i = inode(&meta, ino)?;
        i.xattrs
            .as_ref()
            .and_then(|m| m.get(name))
            .map(|v| v.to_vec())
            .ok_or_else(|| err(libc::ENODATA))
    }

    /// All attribute names, each followed by a NUL (the `listxattr` format).
    pub fn listxattr(&self, ino: Ino) -> Result<Vec<u8>> {
        let meta = self.meta.lock();
        let i = inode(&meta, ino)?;
        let mut out = Vec::new();
        for k in i.xattrs.iter().flat_map(|m| m.keys()) {
            out.extend_from_slice(k);
            out.push(0);
        }
        Ok(out)
    }

    pub fn removexattr(&self, ino: Ino, name: &[u8]) -> Result<()> {
        let _turn = self.file_turn(ino)?;
        self.writable()?;
        let mut meta = self.meta.lock();
        check_mutable(inode(&meta, ino)?)?;
        let mut b = meta.batch();
        if !b.remove_xattr(ino, name)? {
            return Err(err(libc::ENODATA));
        }
        b.touch(ino, false)?;
        b.commit()
    }
}
