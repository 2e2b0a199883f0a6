//! The one way at a file's extent map: [`FileIo`] holds the map's write lock across the remote
//! I/O of a write, truncation, allocation, punch, collapse, insert or chunk rebuild, and
//! [`FileView`] its read lock across a read. The map's own mutators keep the held bytes
//! (`st_blocks`) in step and log each change; the caller hands that log to the namespace
//! ([`FileIo::take_log`]) in the batch of the operation that made it.

use super::{DataStore, Payload, ReadBuf, ReplicaHealth};
use crate::error::Result;
use crate::fabric::RemoteRegion;
use crate::fabric::ServerId;
use crate::meta::{ChunkMap, ExtentChange, FileData};
use crate::sync::{RwLockReadGuard, RwLockWriteGuard};
use std::cell::RefCell;

thread_local! {
    /// Extents the operation running on this thread let go of (chunks cut away, stale or
    /// dead copies), freed when its [`FileIo`] is dropped: after the operation committed the
    /// chunk changes that stop referring to them, so a volume's journal never names memory
    /// already given back (see [`crate::client::volume`]). Every such let-go happens under
    /// a `FileIo`, on the thread that holds it.
    static RETIRED: RefCell<Vec<RemoteRegion>> = const { RefCell::new(Vec::new()) };
}

/// A file's extent map locked for change, with the store that moves its bytes.
pub struct FileIo<'a> {
    data: &'a DataStore,
    file: &'a FileData,
    chunks: RwLockWriteGuard<'a, ChunkMap>,
}

/// A file's extent map locked for reading.
pub struct FileView<'d, 'f> {
    data: &'d DataStore,
    chunks: RwLockReadGuard<'f, ChunkMap>,
}

impl DataStore {
    /// Locks `file`'s extent map for change (writers wait for readers and each other); a
    /// write of the file answered before it was sent is sent first (see `behind`).
    pub fn lock<'a>(&'a self, file: &'a FileData) -> FileIo<'a> {
        let mut chunks = file.chunks.write();
        self.flush_waiting(file, &mut chunks);
        FileIo {
            data: self,
            file,
            chunks,
        }
    }

    /// Locks `file`'s extent map to let all its data go: a write still waiting to be sent is
    /// dropped unsent (the bytes would land in memory about to be given back).
    pub fn lock_discarding<'a>(&'a self, file: &'a FileData) -> FileIo<'a> {
        let chunks = file.chunks.write();
        self.forget_waiting(file);
        FileIo {
            data: self,
            file,
            chunks,
        }
    }

    /// Reads many ranges of many files at once (a program's `read_many`, see
    /// `read::read_many`): `(file, offset, out)` each, holes as zeros. Each file's map is
    /// viewed once, the files in one fixed order (by address), so two such reads never wait
    /// on each other's writers in a cycle.
    pub fn read_many(&self, reads: &mut [(&FileData, u64, &mut [u8])]) -> Result<()> {
        let key = |f: &FileData| f as *const FileData as usize;
        let mut files: Vec<&FileData> = reads.iter().map(|r| r.0).collect();
        files.sort_by_key(|f| key(f));
        files.dedup_by_key(|f| key(f));
        let views: Vec<FileView<'_, '_>> = files.iter().map(|f| self.view(f)).collect();
        let mut plan: Vec<(&ChunkMap, u64, &mut [u8])> = reads
            .iter_mut()
            .map(|(f, offset, out)| {
                let v = files
                    .binary_search_by_key(&key(f), |g| key(g))
                    .expect("every file is viewed");
                (&*views[v].chunks, *offset, &mut **out)
            })
            .collect();
        self.read_ranges(&mut plan)
    }

    /// Locks `file`'s extent map for reading, once no write of it waits to be sent.
    pub fn view<'f>(&self, file: &'f FileData) -> FileView<'_, 'f> {
        loop {
            let chunks = file.chunks.read();
            if !self.has_waiting(file) {
                return FileView { data: self, chunks };
            }
            drop(chunks);
            drop(self.lock(file));
        }
    }

    /// Gives back every chunk of a file that is going away (a write of it still waiting to
    /// be sent is dropped).
    pub fn release_all(&self, file: &FileData) {
        let chunks = {
            let mut map = file.chunks.write();
            self.forget_waiting(file);
            map.take_all()
        };
        self.release(chunks);
        self.free_retired();
    }

    /// A followed change to `file`'s map (a follower applies its holder's records): chunk
    /// `idx` is now `chunk` (none: a hole). Nothing is sent or freed: a follower writes
    /// nothing, and the memory is the holder's.
    pub fn apply_followed(&self, file: &FileData, idx: u64, chunk: Option<crate::meta::Chunk>) {
        file.chunks.write().apply(idx, chunk);
    }

    /// A followed birth of server `server` ([`crate::meta::Change::Born`]): every copy of
    /// `file` listed there is forgotten, freeing nothing (the server lost that memory).
    /// Reads still using the old map finish first.
    pub fn forget_followed(&self, file: &FileData, server: u32) {
        file.chunks.write().forget_server(server);
    }

    /// Forgets `file`'s whole map, freeing nothing (the memory is its holder's or another
    /// client's): reads still running finish first, later ones find no data.
    pub fn forget_map(&self, file: &FileData) {
        file.chunks.write().take_all();
    }

    /// Lets go of `region` once this thread's operation is done (see [`RETIRED`]).
    pub(super) fn retire(&self, region: RemoteRegion) {
        RETIRED.with(|r| r.borrow_mut().push(region));
    }

    /// What this thread's operation let go of so far, to be freed by the returned call
    /// (once the write's changes are recorded, [`crate::meta::Journal::record_write`]) instead
    /// of when its [`FileIo`] is dropped; dropped unrun (the changes refused), nothing is
    /// freed, and [`FileIo::undo`] frees what the write made.
    pub fn free_once_recorded(&self) -> crate::meta::AfterRecord {
        let retired = RETIRED.with(|r| std::mem::take(&mut *r.borrow_mut()));
        let pool = self.pool.clone();
        Box::new(move || {
            for region in retired {
                if let Err(e) = pool.free(region) {
                    log::debug!("freeing an extent on {}: {e}", region.server);
                }
            }
        })
    }

    pub(super) fn free_retired(&self) {
        let retired = RETIRED.with(|r| std::mem::take(&mut *r.borrow_mut()));
        for region in retired {
            if let Err(e) = self.pool.free(region) {
                log::debug!("freeing an extent on {}: {e}", region.server);
            }
        }
    }
}

impl Drop for FileIo<'_> {
    fn drop(&mut self) {
        self.data.free_retired();
    }
}

impl<'a> FileIo<'a> {
    /// Sends the file's write still waiting to be sent, if any (a failure is kept for its next
    /// fsync).
    pub fn send_waiting(&mut self) {
        self.settled();
    }

    /// See [`DataStore::free_once_recorded`].
    pub fn free_once_recorded(&self) -> crate::meta::AfterRecord {
        self.data.free_once_recorded()
    }

    /// The store and the file's map, once a write of the file still waiting to be sent has
    /// been (every change of the map goes through here, so none runs ahead of such a write).
    fn settled(&mut self) -> (&'a DataStore, &mut ChunkMap) {
        self.data.flush_waiting(self.file, &mut self.chunks);
        (self.data, &mut self.chunks)
    }

    /// As [`Self::settled`], for a change of the file's bytes in `[start, end)`: the file
    /// is marked changed now (an erasure code waits for it to be left alone), and encoded
    /// chunks holding those bytes are made copies first (a stripe is never written in place:
    /// `coding`).
    fn changing(&mut self, start: u64, end: u64) -> Result<(&'a DataStore, &mut ChunkMap)> {
        self.file.touch();
        let (data, chunks) = self.settled();
        data.thaw_range(chunks, start, end)?;
        Ok((data, chunks))
    }

    /// Writes `payload` at file `offset`, allocating or growing chunks as needed.
    pub fn write(&mut self, offset: u64, payload: Payload<'_>) -> Result<()> {
        let end = offset.saturating_add(payload.bytes().len() as u64);
        let (data, chunks) = self.changing(offset, end)?;
        data.write(chunks, offset, payload)
    }

    /// As [`Self::write`], but a small write on a store that writes behind returns once its
    /// chunks exist and its bytes are copied (see `behind`). `file` is the locked file.
    pub fn write_or_defer(
        &mut self,
        file: &crate::sync::Arc<FileData>,
        offset: u64,
        payload: Payload<'_>,
    ) -> Result<()> {
        assert!(
            std::ptr::eq(&**file, self.file),
            "write_or_defer names the file it locked"
        );
        let end = offset.saturating_add(payload.bytes().len() as u64);
        self.file.touch();
        self.data.thaw_range(&mut self.chunks, offset, end)?;
        if self
            .data
            .defer_write(file, &mut self.chunks, offset, &payload)?
        {
            return Ok(());
        }
        self.write(offset, payload)
    }

    /// Takes every chunk out of the map, each removal logged, and lets their memory go when
    /// this is dropped: the data of a file that lost its last name while the kernel still
    /// knows it (the inode stays; on a volume, a replay must not find chunks whose memory
    /// went back to the servers, where another file may hold it by then).
    /// Lock with [`DataStore::lock_discarding`], or a waiting write is sent first.
    pub fn release_all(&mut self) {
        self.data.forget_waiting(self.file);
        let idxs: Vec<u64> = self.chunks.iter().map(|(&i, _)| i).collect();
        let mut gone = std::collections::BTreeMap::new();
        for i in idxs {
            if let Some(c) = self.chunks.remove(&i) {
                gone.insert(i, c);
            }
        }
        self.data.release(gone);
    }

    /// Cuts the file's data at `size` (zeroing the tail of the chunk it ends in).
    pub fn truncate(&mut self, size: u64) -> Result<()> {
        // Only the chunk the file now ends inside keeps bytes that change (its tail zeroed).
        let inside = match size % self.data.chunk_size {
            0 => size,
            _ => size + 1,
        };
        let (data, chunks) = self.changing(size, inside)?;
        data.truncate(chunks, size)
    }

    /// Before the file grows from `size` to show `[size, to)`: zeroes what its chunks may
    /// hold there from a failed append (see [`crate::meta::ChunkMap::tail_unknown`]).
    pub fn zero_past_end(&mut self, size: u64, to: u64) -> Result<()> {
        let (data, chunks) = self.changing(size, to)?;
        data.zero_past_end(chunks, size, to)
    }

    /// A write past the file's end failed: some copies may hold some of its bytes there.
    pub fn past_end_failed(&mut self) {
        self.chunks.set_tail_unknown(true);
    }

    /// Reserves remote memory for `[offset, offset+len)`.
    pub fn allocate(&mut self, offset: u64, len: u64) -> Result<()> {
        let (data, chunks) = self.changing(offset, offset.saturating_add(len))?;
        data.allocate(chunks, offset, len)
    }

    /// Punches a hole over `[offset, offset+len)`.
    pub fn punch(&mut self, offset: u64, len: u64) -> Result<()> {
        // Chunks the hole covers whole go as they are; those at its edges are changed.
        let end = offset.saturating_add(len);
        self.changing(offset, (offset + 1).min(end))?;
        let (data, chunks) = self.changing(end.saturating_sub(1).max(offset), end)?;
        data.punch(chunks, offset, len)
    }

    /// Removes `[offset, offset+len)` of a file of `size` bytes, moving what follows down.
    pub fn collapse(&mut self, offset: u64, len: u64, size: u64) -> Result<()> {
        let (data, chunks) = self.changing(offset, size)?;
        data.collapse(chunks, offset, len, size)
    }

    /// Opens a hole of `len` bytes at `offset` in a file of `size` bytes.
    pub fn insert(&mut self, offset: u64, len: u64, size: u64) -> Result<()> {
        let (data, chunks) = self.changing(offset, size)?;
        data.insert(chunks, offset, len, size)
    }

    /// Brings chunk `idx` to the copy count (copies added, or extra ones dropped); the bytes
    /// copied (0: nothing copied).
    pub fn rebuild_chunk(&mut self, idx: u64) -> u64 {
        let (data, chunks) = self.settled();
        data.rebuild_chunk(chunks, idx)
    }

    /// Encodes chunk `idx` with `coding` (see `coding`); the bytes written (0: not
    /// encodable now).
    pub fn encode_chunk(&mut self, idx: u64, coding: crate::meta::Coding) -> Result<u64> {
        let (data, chunks) = self.settled();
        data.encode_chunk(chunks, idx, coding)
    }

    /// Moves one copy of chunk `idx` toward even use of the servers (see
    /// [`super::Ledger`]); the bytes copied (0: no move).
    pub fn balance_chunk(&mut self, idx: u64, ledger: &mut super::Ledger) -> u64 {
        let (data, chunks) = self.settled();
        data.balance_chunk(chunks, idx, ledger)
    }

    /// Forgets every copy on `server` (it came back empty); how many.
    pub fn forget_copies(&mut self, server: ServerId) -> u64 {
        let (data, chunks) = self.settled();
        data.forget_copies(chunks, server)
    }

    /// Gives the copies on `server` their new keys, by address; how many changed (see
    /// [`DataStore::rekey_copies`]).
    pub fn rekey_copies(
        &mut self,
        server: ServerId,
        keys: &std::collections::HashMap<u64, u64>,
    ) -> u64 {
        let (data, chunks) = self.settled();
        data.rekey_copies(chunks, server, keys)
    }

    /// Lets go of the copies on a server back behind what was written to it, into `gone`;
    /// returns the copies kept (see `DataStore::let_go_of_behind_copies`).
    pub fn let_go_of_behind_copies(
        &mut self,
        server: ServerId,
        keys: Option<&std::collections::HashMap<u64, u64>>,
        gone: &mut Vec<RemoteRegion>,
    ) -> u64 {
        let (data, chunks) = self.settled();
        data.let_go_of_behind_copies(chunks, server, keys, gone)
    }

    /// Whether a chunk holding bytes of `[start, end)` has more than one copy.
    pub fn shares_copies(&self, start: u64, end: u64) -> bool {
        self.data.shares_copies(&self.chunks, start, end)
    }

    /// Makes the copies of every chunk agree (see [`DataStore::reconcile`]); returns the
    /// chunks whose copies were written.
    pub fn reconcile(&mut self) -> Result<u64> {
        let (data, chunks) = self.settled();
        data.reconcile(chunks)
    }

    /// The bytes of each copy of chunk `idx`, by server.
    #[cfg(feature = "testing")]
    pub fn copies_of(&self, idx: u64) -> Result<Vec<(u32, Vec<u8>)>> {
        self.data.copies_of(&self.chunks, idx)
    }

    /// Writes `bytes` at `offset` of chunk `idx`'s copy on `server` only.
    #[cfg(feature = "testing")]
    pub fn write_one_copy(&self, idx: u64, server: u32, offset: u64, bytes: &[u8]) -> Result<()> {
        self.data
            .write_one_copy(&self.chunks, idx, server, offset, bytes)
    }

    /// The chunk changes since the last call, for the namespace's batch.
    pub fn take_log(&mut self) -> Vec<ExtentChange> {
        self.chunks.take_log()
    }

    /// Undoes `log` (taken by [`FileIo::take_log`]; the namespace refused the batch that
    /// carried it): the map names what it named before, so nothing this client holds differs
    /// from what the namespace (and every other client of a shared volume) holds. Memory the
    /// changes allocated goes back; memory they let go of is kept (it is named again). A
    /// write of this operation still waiting to be sent is dropped (it failed; `lock` sent
    /// any earlier one).
    pub fn undo(&mut self, log: &[ExtentChange]) {
        if log.is_empty() {
            return;
        }
        self.data.forget_waiting(self.file);
        self.chunks.undo(log);
        let key = |r: &RemoteRegion| (r.server, r.addr);
        let mut named = std::collections::HashSet::new();
        for e in log {
            if let Some(c) = self.chunks.get(&e.idx) {
                named.extend(super::regions(c).iter().map(key));
            }
        }
        let made: Vec<RemoteRegion> = log
            .iter()
            .filter_map(|e| e.chunk.clone())
            .flat_map(|c| super::regions(&c))
            .collect();
        RETIRED.with(|r| {
            let mut retired = r.borrow_mut();
            retired.retain(|g| !named.contains(&key(g)));
            let mut gone: std::collections::HashSet<_> = retired.iter().map(key).collect();
            for m in made {
                if !named.contains(&key(&m)) && gone.insert(key(&m)) {
                    retired.push(m);
                }
            }
        });
    }
}

impl<'d> FileView<'d, '_> {
    /// Reads `len` bytes at `offset`, left where the fabric put them (in a buffer of the
    /// store's, which outlives the lock).
    pub fn read_buf(&self, offset: u64, len: usize) -> Result<ReadBuf<'d>> {
        self.data.read_buf(&self.chunks, offset, len)
    }

    /// Counts the chunks by health into `into`.
    pub fn health(&self, into: &mut ReplicaHealth) {
        self.data.health(&self.chunks, into)
    }

    /// The chunks short of copies.
    pub fn degraded(&self) -> Vec<u64> {
        self.data.degraded(&self.chunks)
    }

    /// The chunks short of copies or holding more than the count (see
    /// [`DataStore::set_replicas`]).
    pub fn out_of_step(&self) -> Vec<u64> {
        self.data.out_of_step(&self.chunks)
    }

    /// The chunks an erasure code is to take, now or once it can (see `coding`).
    pub fn to_encode(&self) -> Vec<u64> {
        self.data.to_encode(&self.chunks)
    }

    /// Where each chunk's copies are (`[[index, [address, ...]], ...]`).
    pub fn placement(&self) -> serde_json::Value {
        self.data.placement(&self.chunks)
    }
}

impl std::ops::Deref for FileView<'_, '_> {
    type Target = ChunkMap;
    /// The map itself, to read (its extents for `SEEK_DATA`).
    fn deref(&self) -> &ChunkMap {
        &self.chunks
    }
}
