//! Directory streams: `opendir`, `readdir` and `readdirplus` with offsets that stay valid
//! while entries come and go.

use super::{attr_of, dir_of, err, Attr, DirEntry, Fs};
use crate::error::Result;
use crate::meta::{Ino, Kind};

/// What one directory stream lists: the entries (cookie, name) the directory had when the
/// stream was opened or rewound, shared by its reads.
pub(super) type Listing = Option<std::sync::Arc<Vec<(u64, crate::meta::Name)>>>;

impl Fs {
    /// Opens a directory stream; [`Fs::releasedir`] ends it.
    /// On a shared volume the table catches up first (as an open of a file does), unless
    /// this client holds the directory's turn: a listing shows every name added or removed
    /// on any client before it began.
    pub fn opendir(&self, ino: Ino) -> Result<u64> {
        if !self.holds_turn(ino) {
            self.refresh_shared();
        }
        self.loading(|| dir_of(&self.meta.lock(), ino).map(|_| ()))?;
        let fh = self.issue_fh(crate::fs::OpenMode::from_flags(libc::O_RDONLY));
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
        self.loading(|| self.list(ino, fh, offset, &mut |e, _| add(e), false))
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
        self.loading(|| self.list(ino, fh, offset, &mut |e, a| add(e, a.expect("plus")), true))
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
            // A stream an earlier daemon of this connection opened: listed afresh from
            // `offset` (offsets are cookies, which the namespace kept).
            None if self.inherited(fh) => None,
            None => return Err(err(libc::EBADF)),
            Some(l) if offset > 0 => l.clone(),
            Some(_) => None,
        };
        let mut meta = self.meta.lock();
        if offset == 0 && self.access_times().1 {
            let mut b = meta.batch();
            self.accessed(&mut b, ino)?;
            b.commit()?;
        }
        let dir = dir_of(&meta, ino)?;
        let listing = match listing {
            Some(l) => l,
            None => {
                let fresh = std::sync::Arc::new(dir.listing());
                let mut streams = self.dir_streams.lock();
                if let Some(l) = streams.get_mut(&fh) {
                    *l = Some(fresh.clone());
                } else if self.inherited(fh) {
                    streams.insert(fh, Some(fresh.clone()));
                }
                fresh
            }
        };
        let dots = [(1u64, &b"."[..], ino), (2, &b".."[..], dir.parent())];
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
            meta.hold(child, 1);
        }
        Ok(())
    }
}
