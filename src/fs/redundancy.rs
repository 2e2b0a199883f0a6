//! A file's redundancy as a policy on the tree (`user.rmemfs.redundancy`: `copies` or
//! `ec:K+M`), as CephFS's file layouts and HDFS's erasure-coding policies are set: on a file
//! it says what keeps that file's data; on a directory, new files and directories made in it
//! get the same attribute. A file without one follows the mount's `--redundancy`. Hot,
//! often-rewritten data can keep copies while bulk data is encoded.
//!
//! The attribute is a plain stored one (journaled on a volume, listed by `listxattr`); this
//! module checks a value before it is stored, passes it to what is made in a directory, and
//! tells the encoder each file's code.

use super::{err, Fs};
use crate::error::{Error, Result};
use crate::meta::{Coding, Ino, Inode, Kind, Redundancy};

/// The attribute's name.
pub const REDUNDANCY_XATTR: &[u8] = b"user.rmemfs.redundancy";

impl Fs {
    /// Refuses a redundancy attribute this mount cannot keep: a value that is not one (EINVAL),
    /// a shared volume (EOPNOTSUPP: its chunks keep copies), or a code wider than the live
    /// servers (ENOSPC: 8+3 on six servers would never be encoded).
    pub(super) fn check_redundancy(&self, value: &[u8]) -> Result<()> {
        let text = std::str::from_utf8(value).map_err(|_| err(libc::EINVAL))?;
        let asked: Redundancy = text
            .trim_end_matches('\0')
            .parse()
            .map_err(|e: String| Error::new(libc::EINVAL, e))?;
        let Redundancy::Coded(coding) = asked else {
            return Ok(());
        };
        if self.is_shared() {
            return Err(Error::new(
                libc::EOPNOTSUPP,
                "shared volumes keep copies: their chunks are not encoded",
            ));
        }
        let servers = self.data.pool().placeable_servers();
        if coding.width() > servers {
            return Err(Error::new(
                libc::ENOSPC,
                format!(
                    "ec:{coding} needs {} servers to hold its fragments; {servers} are up",
                    coding.width()
                ),
            ));
        }
        Ok(())
    }

    /// The code `ino`'s cold chunks are encoded with: its own attribute's, else the mount's
    /// (none: copies).
    pub fn file_coding(&self, ino: Ino) -> Option<Coding> {
        let own = self.inspect_meta(|m| {
            let value = m.get(ino)?.xattrs.as_ref()?.get(REDUNDANCY_XATTR)?.clone();
            std::str::from_utf8(&value).ok()?.parse::<Redundancy>().ok()
        });
        match own {
            Some(Redundancy::Coded(c)) => Some(c),
            Some(Redundancy::Copies) => None,
            None => self.data.coding(),
        }
    }
}

/// What `inode`, made in directory `parent`, takes of its redundancy: the directory's
/// attribute, copied (files and directories; a symlink or a device has no data to keep).
pub(super) fn inherit(parent: &Inode, inode: &mut Inode) {
    if !matches!(inode.kind, Kind::File | Kind::Dir) {
        return;
    }
    if let Some(v) = parent.xattrs.as_ref().and_then(|x| x.get(REDUNDANCY_XATTR)) {
        inode
            .xattrs
            .get_or_insert_with(Default::default)
            .insert(REDUNDANCY_XATTR.into(), v.clone());
    }
}
