//! Copies that agree after a crash (volumes). A write, truncation or hole punch over bytes a
//! file already holds changes each copy of their chunks in place, and no record names that
//! change: the chunks stay where they were. A daemon that dies part way leaves one copy new
//! and another old, and two reads of one byte could later return both (one before a server
//! is lost, one after). So before the first such change the file is marked
//! ([`crate::meta::Attrs::overwriting`]), and the mark is committed before a byte goes out:
//! md RAID's write-intent bitmap, at the grain of a file. Attach makes every marked file's
//! copies agree ([`Fs::reconcile_overwritten`]). The mark stays while a handle is open for
//! writing (a database writing between `fsync`s waits for the journal once, not at every
//! write) and goes, without waiting, with the last one; a record that drops it comes after
//! every change it covered, so a replay never sees it gone while they are cut.
//!
//! Appends need no mark: bytes past the committed size are read by no one if the daemon
//! dies before the size is committed, and the size is committed after they are on every
//! copy. Shared volumes (`--meta`) are not marked yet (see doc/FAILURES.md).

use super::*;

impl Fs {
    /// Locks `file`'s extent map for a change in place of the bytes `range` names (given the
    /// inode, under the table's lock), marking the file first if those bytes lie below its
    /// size in chunks of more than one copy. The mark is committed to the journal without
    /// the extent map's lock held: a checkpoint reads every map, and the commit may wait
    /// for one.
    pub(super) fn lock_for_overwrite<'a>(
        &'a self,
        ino: Ino,
        file: &'a FileData,
        range: impl Fn(&Inode) -> (u64, u64),
    ) -> Result<FileIo<'a>> {
        loop {
            let io = self.data.lock(file);
            if self.barrier.is_none() {
                return Ok(io);
            }
            let (start, end, marked) = {
                let meta = self.meta.lock();
                let i = inode(&meta, ino)?;
                let (start, end) = range(i);
                (start, end.min(i.size), i.overwriting)
            };
            if !io.shares_copies(start, end) {
                return Ok(io);
            }
            // Set is not enough: another writer may have set it and still be waiting for its
            // commit. Only a mark known committed lets the bytes go.
            let in_flight = marked && self.marks_in_flight.lock().contains(&ino);
            if marked && !in_flight {
                return Ok(io);
            }
            drop(io);
            if !marked {
                self.mark_overwriting(ino, true)?;
            }
            // Everything recorded before this returns is committed, the mark included.
            self.sync().unwrap_or(Ok(()))?;
            self.marks_in_flight.lock().remove(&ino);
            // Looked at again under the lock: the last writable handle may have closed and
            // taken the mark away meanwhile.
        }
    }

    /// Sets or clears `ino`'s mark (a batch of its own). A mark set is in flight until a
    /// sync after it returns.
    fn mark_overwriting(&self, ino: Ino, on: bool) -> Result<()> {
        let mut meta = self.meta.lock();
        if inode(&meta, ino)?.overwriting == on {
            return Ok(());
        }
        let mut b = meta.batch();
        b.update(ino, |a| a.overwriting = on)?;
        b.commit()?;
        // Under the table's lock, so no writer sees the mark before it is listed here.
        let mut in_flight = self.marks_in_flight.lock();
        if on {
            in_flight.insert(ino);
        } else {
            in_flight.remove(&ino);
        }
        Ok(())
    }

    /// Takes `ino`'s mark away if no handle is open on it for writing; call with its extent
    /// map locked (`_io`), so no change the mark covers is still on its way.
    pub(super) fn settle_overwrite(&self, ino: Ino, _io: &FileIo<'_>) {
        let marked = self.meta.lock().get(ino).is_some_and(|i| i.overwriting);
        if !marked || self.open_for_writing(ino) {
            return;
        }
        if let Err(e) = self.mark_overwriting(ino, false) {
            log::warn!("inode {ino} keeps its overwrite mark until the next attach: {e}");
        }
    }

    /// After the last handle on `ino` is released: its mark goes (see the module doc).
    pub(super) fn settle_overwrite_at_close(&self, ino: Ino) {
        if self.open_for_writing(ino) {
            return; // not the last: no need to wait for the file's lock
        }
        let file = {
            let meta = self.meta.lock();
            match meta.get(ino) {
                Some(i) if i.overwriting => i.file().cloned(),
                _ => None,
            }
        };
        if let Some(file) = file {
            let io = self.data.lock(&file);
            self.settle_overwrite(ino, &io);
        }
    }

    fn open_for_writing(&self, ino: Ino) -> bool {
        self.handles
            .lock()
            .values()
            .any(|h| h.ino == ino && h.mode.write)
    }

    /// At attach: makes the copies of every marked file's chunks agree (the first live copy
    /// of each chunk is copied over the others) and takes the marks away. Returns (files,
    /// chunks whose copies were written).
    pub fn reconcile_overwritten(&self) -> (usize, u64) {
        let marked: Vec<(Ino, Arc<FileData>)> = {
            let meta = self.meta.lock();
            meta.files()
                .filter(|(ino, _)| meta.get(*ino).is_some_and(|i| i.overwriting))
                .map(|(ino, f)| (ino, f.clone()))
                .collect()
        };
        let mut chunks = 0;
        for (ino, f) in &marked {
            let mut io = self.data.lock(f);
            let done = io.reconcile();
            self.commit_extents(*ino, &mut io);
            match done {
                Ok(n) => chunks += n,
                Err(e) => {
                    // Kept marked: the next attach tries again.
                    log::warn!("inode {ino}: its copies could not be compared ({e})");
                    continue;
                }
            }
            if let Err(e) = self.mark_overwriting(*ino, false) {
                log::warn!("inode {ino} keeps its overwrite mark: {e}");
            }
        }
        (marked.len(), chunks)
    }

    /// The bytes of each copy of chunk `idx` of `ino`, by server (tests).
    #[cfg(feature = "testing")]
    pub fn copies_of(&self, ino: Ino, idx: u64) -> Result<Vec<(u32, Vec<u8>)>> {
        let file = self.file_data(ino)?;
        let io = self.data.lock(&file);
        io.copies_of(idx)
    }

    /// Writes `bytes` at `offset` of chunk `idx` of `ino`, on its copy on `server` only: a
    /// write a crash cut after one copy (tests).
    #[cfg(feature = "testing")]
    pub fn write_one_copy(
        &self,
        ino: Ino,
        idx: u64,
        server: u32,
        offset: u64,
        bytes: &[u8],
    ) -> Result<()> {
        let file = self.file_data(ino)?;
        let io = self.data.lock(&file);
        io.write_one_copy(idx, server, offset, bytes)
    }
}
