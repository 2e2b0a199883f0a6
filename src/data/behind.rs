//! Write-behind, for private mounts: a small write is answered once its chunks exist
//! (allocated and healed, so ENOSPC and a pool below `--min-replicas` are still the write's own
//! errors) and its bytes sit in a slot of a registered arena; they reach every copy soon after,
//! sent by the write-behind worker ([`DataStore::flush_queued`]) or by the next operation that
//! locks the file ([`DataStore::lock`], [`DataStore::view`]), whichever comes first. At most
//! one write waits per file, so a file's writes land in order, and nothing reads a file's
//! bytes before its waiting write has landed.
//!
//! Why: under the writeback cache the kernel writes a file back at close and waits for it, so
//! each small file written (`tar xf`, `cp -r`, a compiler's outputs) paid one fabric round
//! trip at its close (doc/BENCHMARKING.md). What is given up: a send that fails after the
//! answer (fewer than `--min-replicas` servers left in between) is reported by the file's
//! next fsync, as a local file system reports a failed writeback, not by its close.
//!
//! A volume's holder writes behind too, in the journal's order: a record that names a chunk
//! must never be durable before the bytes in it (a replay would name memory that holds
//! another file's old bytes). So before the journal writes a group of records or a
//! checkpoint, it has every write answered so far sent ([`DataStore::send_all_behind`]), as
//! ext4's `data=ordered` writes a transaction's data blocks before its commit. A shared
//! volume's client that asks for it (`-o write_behind`) too, write by write: other clients read the bytes as soon as the record
//! that names them is theirs, so a write's bytes are sent before the append that carries it
//! ([`DataStore::send_later`], `volume::shared::behind`): its writer sends them when the
//! change is appended at once, and whoever appends a write held back sends its bytes by the
//! write's number, never waiting for its file's lock (the writer of the file's next write
//! holds it and may wait for that append).
//!
//! Whoever needs a write settled while holding a lock that a file's writer may wait for (the
//! journal's committer: a writer on a full pool waits for the frees a commit releases) never
//! waits for that file's lock, only for the write to settle (see
//! [`WriteBehind::send_through`]): each write answered before it was sent is numbered, so
//! the one to wait for is known.

use super::*;
use crate::config::{WRITE_BEHIND_SLOTS, WRITE_BEHIND_SLOT_BYTES};
use crate::meta::FileData;
use crate::sync::atomic::AtomicU64;
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

#[cfg(all(test, feature = "shuttle"))]
mod model_tests;
mod worker;

/// The write-behind state of a store ([`DataStore::write_behind`]).
pub(super) struct WriteBehind {
    /// `WRITE_BEHIND_SLOTS` slots of `WRITE_BEHIND_SLOT_BYTES`, allocated once (stable, so
    /// the registration cache keeps them registered).
    arena: AlignedBuf,
    free: Mutex<Vec<usize>>,
    /// By file (its address; the entry holds the file, so the address is not reused).
    files: Mutex<HashMap<usize, Entry>>,
    /// How many entries have a waiting write: lets `view` and `lock` of files with none
    /// (nearly all of them) skip `files`.
    waiting: AtomicUsize,
    /// Files for the worker, each at most once (`Entry::queued`); one may have had its write
    /// sent by a later operation on it meanwhile.
    queue: Mutex<VecDeque<Arc<FileData>>>,
    queued: Condvar,
    counts: Counts,
    /// Told (under `files`) whenever a write settles or is dropped (see
    /// [`WriteBehind::send_through`]).
    settles: Condvar,
    /// The last number given to a write answered before it was sent: a file's writes are
    /// numbered in order, so one number says whether a given write has been sent
    /// ([`WriteBehind::send_through`]).
    numbered: AtomicU64,
}

struct Entry {
    /// Held so that the file's address, the entry's key, is not reused while it lives.
    file: Arc<FileData>,
    waiting: Option<Waiting>,
    /// A waiting write's send failed: the file's next fsync says so.
    failed: Option<Error>,
    /// In the worker's queue (so each file is there once, and the queue is bounded by the
    /// files with an entry).
    queued: bool,
    /// Its write taken out to be sent and not settled yet (under the file's lock): its number.
    sending: Option<u64>,
}

impl Entry {
    fn idle(&self) -> bool {
        self.waiting.is_none() && self.sending.is_none() && self.failed.is_none() && !self.queued
    }
}

/// A waiting write taken out to be sent: settled with the send's outcome, or, if a bug
/// unwinds past it, as failed (so its slot comes back and the file's next fsync reports EIO
/// instead of silently losing it).
struct Sending<'w, 'f> {
    wb: &'w WriteBehind,
    file: &'f FileData,
    w: Waiting,
    settled: bool,
}

impl Sending<'_, '_> {
    fn settle(mut self, res: Result<()>) {
        self.settled = true;
        self.wb.settle(self.file, self.w, res);
    }
}

impl Drop for Sending<'_, '_> {
    fn drop(&mut self) {
        if !self.settled {
            let e = Error::new(
                libc::EIO,
                "a bug stopped the send of a write answered before",
            );
            self.wb.settle(self.file, self.w, Err(e));
        }
    }
}

#[derive(Clone, Copy)]
struct Waiting {
    offset: u64,
    slot: usize,
    len: u64,
    /// Its place in the order of writes answered before they were sent.
    number: u64,
}

#[derive(Default)]
struct Counts {
    deferred: AtomicU64,
    by_worker: AtomicU64,
    inline: AtomicU64,
    failed: AtomicU64,
}

/// Write-behind counters, for `stats`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct WriteBehindStats {
    /// Writes answered before their bytes were remote.
    pub deferred: u64,
    /// Of those, sent in the background (by the worker, or before a volume's journal writes
    /// its records), and by the next operation on the file.
    pub sent_by_worker: u64,
    pub sent_inline: u64,
    /// Sends that failed (reported by the file's next fsync).
    pub failed: u64,
}

fn key(file: &FileData) -> usize {
    file as *const FileData as usize
}

/// How long [`WriteBehind::send_through`] waits for a write to settle before it tries the
/// file's lock again: a backstop only (a settle wakes it at once), short beside a fabric
/// round trip's tens of microseconds times the handful a send takes.
const SETTLE_POLL: Duration = Duration::from_millis(2);

/// Whether write `number` of `file` is settled, given the entries (see
/// [`WriteBehind::settled`]).
fn settled_in(files: &HashMap<usize, Entry>, file: &FileData, number: u64) -> bool {
    let Some(e) = files.get(&key(file)) else {
        return true;
    };
    let unsettled = |n: Option<u64>| n.is_some_and(|n| n <= number);
    !unsettled(e.waiting.map(|w| w.number)) && !unsettled(e.sending)
}

impl WriteBehind {
    fn new() -> Result<WriteBehind> {
        Ok(WriteBehind {
            arena: AlignedBuf::new(WRITE_BEHIND_SLOTS * WRITE_BEHIND_SLOT_BYTES)?,
            free: Mutex::new((0..WRITE_BEHIND_SLOTS).rev().collect()),
            files: Mutex::new(HashMap::new()),
            waiting: AtomicUsize::new(0),
            queue: Mutex::new(VecDeque::new()),
            queued: Condvar::new(),
            counts: Counts::default(),
            settles: Condvar::new(),
            numbered: AtomicU64::new(0),
        })
    }

    fn slot_addr(&self, slot: usize) -> u64 {
        self.arena.addr() + (slot * WRITE_BEHIND_SLOT_BYTES) as u64
    }

    fn has_waiting(&self, file: &FileData) -> bool {
        self.waiting.load(Ordering::Acquire) > 0 && self.peek_waiting(file).is_some()
    }

    /// Whether write `number` of `file` is settled: sent (or its send failed, kept for the
    /// file's next fsync, or dropped with the file's data).
    fn settled(&self, file: &FileData, number: u64) -> bool {
        settled_in(&self.files.lock(), file, number)
    }

    /// Write `number` of `file` is settled when this returns ([`DataStore::send_all_behind`]):
    /// sent now through `flush` if the file's lock is free, else waited for. It never waits
    /// for the file's lock (its holder may be a writer waiting for the caller's locks), and
    /// need not: every thread that takes a file's lock for change sends or drops its waiting
    /// write before it does anything else (`DataStore::lock`, the worker, `lock_discarding`),
    /// so a write unsettled under a held lock is being settled by its holder, which tells
    /// `settles`. The wait is bounded by [`SETTLE_POLL`] only to look at the lock again.
    fn send_through(&self, file: &FileData, number: u64, flush: impl FnOnce(&mut ChunkMap)) {
        loop {
            if self.settled(file, number) {
                return;
            }
            if let Some(mut chunks) = file.chunks.try_write() {
                flush(&mut chunks);
                return;
            }
            let files = self.files.lock();
            if settled_in(&files, file, number) {
                return;
            }
            drop(self.settles.wait_timeout(files, SETTLE_POLL));
        }
    }

    /// `file`'s write of `len` bytes at `offset`, copied to `slot`, now waits to be sent (its
    /// lock held for change by the caller, its earlier one sent): numbered, and queued for
    /// the worker.
    fn put_waiting(&self, file: &Arc<FileData>, offset: u64, slot: usize, len: u64) -> u64 {
        let number = self.numbered.fetch_add(1, Ordering::AcqRel) + 1;
        let w = Waiting {
            offset,
            slot,
            len,
            number,
        };
        let before = self
            .files
            .lock()
            .entry(key(file))
            .or_insert_with(|| Entry {
                file: file.clone(),
                waiting: None,
                failed: None,
                queued: false,
                sending: None,
            })
            .waiting
            .replace(w);
        debug_assert!(before.is_none(), "the file's waiting write was sent first");
        self.waiting.fetch_add(1, Ordering::AcqRel);
        self.enqueue(file);
        number
    }

    /// Every write answered before it was sent and not settled yet: its file and number.
    fn answered(&self) -> Vec<(Arc<FileData>, u64)> {
        self.files
            .lock()
            .values()
            .filter_map(|e| Some((e.file.clone(), e.waiting.map(|w| w.number).or(e.sending)?)))
            .collect()
    }

    /// Each of `answered` settled ([`Self::send_through`], sent through `flush`).
    fn settle_all(
        &self,
        answered: &[(Arc<FileData>, u64)],
        flush: impl Fn(&FileData, &mut ChunkMap),
    ) {
        for (file, number) in answered {
            self.send_through(file, *number, |chunks| flush(file, chunks));
        }
    }

    fn peek_waiting(&self, file: &FileData) -> Option<Waiting> {
        self.files.lock().get(&key(file))?.waiting
    }

    fn take_waiting<'w, 'f>(&'w self, file: &'f FileData) -> Option<Sending<'w, 'f>> {
        if self.waiting.load(Ordering::Acquire) == 0 {
            return None;
        }
        let w = {
            let mut files = self.files.lock();
            let e = files.get_mut(&key(file))?;
            let w = e.waiting.take()?;
            e.sending = Some(w.number);
            w
        };
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        Some(Sending {
            wb: self,
            file,
            w,
            settled: false,
        })
    }

    /// `file` out of the worker's queue (taken by the worker).
    fn unqueue(&self, file: &FileData) {
        let mut files = self.files.lock();
        if let Some(e) = files.get_mut(&key(file)) {
            e.queued = false;
            if e.idle() {
                files.remove(&key(file));
            }
        }
    }

    /// Puts `file` in the worker's queue unless it is there.
    fn enqueue(&self, file: &Arc<FileData>) {
        let mut files = self.files.lock();
        let Some(e) = files.get_mut(&key(file)) else {
            return;
        };
        if !e.queued {
            e.queued = true;
            drop(files);
            self.queue.lock().push_back(file.clone());
            self.queued.notify_one();
        }
    }

    /// After a waiting write was sent (or given up): its slot back, its failure kept.
    fn settle(&self, file: &FileData, w: Waiting, res: Result<()>) {
        {
            let mut files = self.files.lock();
            if let Some(e) = files.get_mut(&key(file)) {
                e.sending = None;
                if let Err(err) = res {
                    log::warn!(
                        "a write answered before it was sent failed ({} bytes at {}): {err}; \
                         the file's next fsync reports it",
                        w.len,
                        w.offset
                    );
                    self.counts.failed.fetch_add(1, Ordering::Relaxed);
                    e.failed = Some(err);
                }
                if e.idle() {
                    files.remove(&key(file));
                }
            }
            self.settles.notify_all();
        }
        self.free.lock().push(w.slot);
    }
}

impl DataStore {
    /// Answers small writes before their bytes are remote (see the module's doc). Needs the
    /// worker ([`Self::flush_queued`]) running beside the mount.
    pub fn write_behind(mut self) -> Result<DataStore> {
        self.behind = Some(WriteBehind::new()?);
        Ok(self)
    }

    pub fn writes_behind(&self) -> bool {
        self.behind.is_some()
    }

    pub fn write_behind_stats(&self) -> WriteBehindStats {
        let Some(wb) = &self.behind else {
            return WriteBehindStats::default();
        };
        let c = &wb.counts;
        WriteBehindStats {
            deferred: c.deferred.load(Ordering::Relaxed),
            sent_by_worker: c.by_worker.load(Ordering::Relaxed),
            sent_inline: c.inline.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
        }
    }

    /// Takes `payload` for writing behind at `offset` of `file` (whose map, `chunks`, the
    /// caller holds locked for change): its chunks are made to exist and healed now, its
    /// bytes copied to a slot. False, having done nothing, when it is not taken (no
    /// write-behind, too large, no free slot): the caller writes it now.
    pub(super) fn defer_write(
        &self,
        file: &Arc<FileData>,
        chunks: &mut ChunkMap,
        offset: u64,
        payload: &Payload<'_>,
    ) -> Result<bool> {
        let Some(wb) = &self.behind else {
            return Ok(false);
        };
        let data = payload.bytes();
        if data.is_empty() || data.len() > WRITE_BEHIND_SLOT_BYTES {
            return Ok(false);
        }
        // The file's own waiting write goes first (the caller's lock normally sent it).
        self.flush_waiting(file, chunks);
        let Some(slot) = wb.free.lock().pop() else {
            return Ok(false);
        };
        let len = data.len() as u64;
        let made = (|| {
            let loan = self.loan()?;
            for (idx, in_chunk, n, _) in self.pieces(offset, len) {
                self.ensure(chunks, idx, in_chunk + n, loan.bounce())?;
                self.heal(chunks, idx)?;
            }
            Ok(())
        })();
        if let Err(e) = made {
            wb.free.lock().push(slot);
            return Err(e);
        }
        wb.arena.write_at(slot * WRITE_BEHIND_SLOT_BYTES, data);
        wb.put_waiting(file, offset, slot, len);
        wb.counts.deferred.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// Sends `file`'s waiting write, if any, to every copy of its chunks (the caller holds
    /// `chunks`, the file's map, locked for change). A failure is kept for the file's next
    /// fsync ([`Self::take_write_error`]).
    pub(super) fn flush_waiting(&self, file: &FileData, chunks: &mut ChunkMap) {
        let Some(wb) = &self.behind else { return };
        let Some(sending) = wb.take_waiting(file) else {
            return;
        };
        wb.counts.inline.fetch_add(1, Ordering::Relaxed);
        let w = sending.w;
        let res = self.write_window(chunks, w.offset, wb.slot_addr(w.slot), w.len);
        sending.settle(res);
    }

    /// Every write answered so far is on its chunks' copies: each one waiting is sent now,
    /// and each one on its way (sent under its file's lock) is waited for. A volume's
    /// journal calls it before it writes records or a checkpoint that may name the chunks
    /// those writes fill.
    ///
    /// It never waits for a file's lock, only for a write to settle (`WriteBehind::
    /// send_through`): the committer calls it, and a file's lock may be held by an operation
    /// waiting for that very commit (an allocation on a full pool waits for the frees a
    /// commit releases). Such an operation sent the file's waiting write when it took the
    /// lock, but it may have taken the lock after this looked at the file: waiting for the
    /// lock then would wait for ever.
    pub fn send_all_behind(&self) {
        let Some(wb) = &self.behind else { return };
        let answered = wb.answered();
        // The waiting ones in batches as the worker sends them (each file's lock taken only
        // if free); then each left, settled by whoever holds its lock or sent now.
        let files = answered.iter().map(|(f, _)| f.clone()).collect();
        self.send_batches(wb, files, false);
        wb.settle_all(&answered, |file, chunks| self.flush_waiting(file, chunks));
        self.free_retired();
    }

    /// How to send `file`'s waiting write (the caller's, just answered, the file's lock held)
    /// later from any thread ([`crate::meta::SendLater`]); None if none waits. A shared
    /// volume's client sends it before the append that names its chunks.
    pub fn send_later(self: &Arc<Self>, file: &Arc<FileData>) -> Option<crate::meta::SendLater> {
        let number = self.behind.as_ref()?.peek_waiting(file)?.number;
        let (data, file) = (self.clone(), file.clone());
        Some(Box::new(move || data.send_through_waiting(&file, number)))
    }

    /// Write `number` of `file` is settled when this returns (see [`WriteBehind::send_through`]);
    /// the changes its send made to the file's map (copies on servers that failed taken out),
    /// when its lock is free (else its holder's record carries them: a map's changes are
    /// taken by the operation that holds its lock, and only a send of a write answered before
    /// changes it outside one).
    fn send_through_waiting(&self, file: &FileData, number: u64) -> Vec<crate::meta::ExtentChange> {
        let Some(wb) = &self.behind else {
            return Vec::new();
        };
        wb.send_through(file, number, |chunks| self.flush_waiting(file, chunks));
        file.chunks
            .try_write()
            .map_or_else(Vec::new, |mut chunks| chunks.take_log())
    }

    /// Whether `file` has a write waiting to be sent.
    pub(super) fn has_waiting(&self, file: &FileData) -> bool {
        self.behind.as_ref().is_some_and(|wb| wb.has_waiting(file))
    }

    /// The failure of a write of `file` answered before it was sent, once (call with the
    /// file's map locked, so its waiting write has been sent).
    pub(super) fn take_write_error(&self, file: &FileData) -> Option<Error> {
        let wb = self.behind.as_ref()?;
        let mut files = wb.files.lock();
        let e = files.get_mut(&key(file))?;
        let failed = e.failed.take();
        if e.idle() {
            files.remove(&key(file));
        }
        failed
    }

    /// `file` goes away: its waiting write is dropped unsent and its failure forgotten.
    pub(super) fn forget_waiting(&self, file: &FileData) {
        let Some(wb) = &self.behind else { return };
        let mut files = wb.files.lock();
        let Some(e) = files.get_mut(&key(file)) else {
            return;
        };
        e.failed = None;
        let dropped = e.waiting.take();
        if e.idle() {
            files.remove(&key(file));
        }
        wb.settles.notify_all();
        drop(files);
        if let Some(w) = dropped {
            wb.waiting.fetch_sub(1, Ordering::AcqRel);
            wb.free.lock().push(w.slot);
        }
    }

    /// Every byte written to `file` so far is on its chunks' copies; the failure of a write
    /// answered before it was sent, if any (once).
    pub fn sync_file(&self, file: &FileData) -> Result<()> {
        let io = self.lock(file);
        let failed = self.take_write_error(file);
        drop(io);
        failed.map_or(Ok(()), Err)
    }
}
