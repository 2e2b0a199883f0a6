//! The library's calls on names: stat, listdir, mkdir, unlink, rmdir, rename.

use super::Volume;
use crate::error::Result;
use crate::fs::Attr;
use crate::meta::Kind;

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: Vec<u8>,
    pub kind: Kind,
}

impl Volume {
    /// The attributes of what `path` names.
    pub fn stat(&self, path: &str) -> Result<Attr> {
        let looked = self.resolve(path)?;
        self.fs.getattr(looked.ino())
    }

    /// The entries of directory `path` (without `.` and `..`).
    pub fn listdir(&self, path: &str) -> Result<Vec<Entry>> {
        let looked = self.resolve(path)?;
        let ino = looked.ino();
        let fh = self.fs.opendir(ino)?;
        let mut entries = Vec::new();
        let mut offset = 0;
        let listed = loop {
            let before = entries.len();
            let r = self.fs.readdir(ino, fh, offset, &mut |e| {
                offset = e.offset;
                if e.name != b"." && e.name != b".." {
                    entries.push(Entry {
                        name: e.name,
                        kind: e.kind,
                    });
                }
                true
            });
            match r {
                Err(e) => break Err(e),
                // A pass that added nothing and moved nowhere: the end.
                Ok(()) if entries.len() == before => break Ok(()),
                Ok(()) => {}
            }
        };
        self.fs.releasedir(fh);
        listed.map(|()| entries)
    }

    /// Makes directory `path` with permissions `mode` (less the umask, 022).
    pub fn mkdir(&self, path: &str, mode: u32) -> Result<Attr> {
        let (dir, name) = self.parent(path)?;
        let attr = self.fs.mkdir(dir.ino(), name, mode, self.caller)?;
        self.fs.forget(attr.ino, 1);
        Ok(attr)
    }

    /// Removes the file (or symlink) `path`.
    pub fn unlink(&self, path: &str) -> Result<()> {
        let (dir, name) = self.parent(path)?;
        self.fs.unlink(dir.ino(), name)
    }

    /// Removes the empty directory `path`.
    pub fn rmdir(&self, path: &str) -> Result<()> {
        let (dir, name) = self.parent(path)?;
        self.fs.rmdir(dir.ino(), name)
    }

    /// Renames `from` to `to`, replacing what `to` names (as rename(2)).
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        let (a, a_name) = self.parent(from)?;
        let (b, b_name) = self.parent(to)?;
        self.fs
            .rename(a.ino(), a_name, b.ino(), b_name, 0, self.caller)
    }
}
