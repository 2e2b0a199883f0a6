//! The volume's journal: records buffered in memory as operations commit, written by a
//! committer thread to a ring on up to three servers (one batch of one-sided WRITEs per group
//! commit), and a checkpoint that bounds the ring.
//!
//! Why a committer: metadata operations must do no I/O of their own (they run under the
//! namespace's lock), so `record` only frames the batch into the pending buffer. The
//! committer writes what is pending every few ms ([`crate::config::JOURNAL_COMMIT_INTERVAL`]),
//! at once when `fsync` asks ([`Barrier::sync`] waits for its sequence number), or when a
//! batch's worth waits ([`crate::config::JOURNAL_COMMIT_BATCH`]).
//! When the ring cannot take the next group, a checkpoint (the namespace's image) is written
//! to new extents, the root is pointed at it on every server, and the ring starts over: its
//! older records carry lower sequence numbers, so a reader stops at them.
//!
//! Why a spare: a checkpoint is written beside the one it replaces (the root switches between
//! them), so every wrap needs room for a second image. On a full pool that room must already be
//! the journal's, or the journal stops and the volume with it. So the journal keeps a
//! [`Spare`] on each journal server, as large as the next checkpoint can be (the last one plus
//! one ring of records: an image grows by no more than the records that grew it); the wrap
//! writes into it, and the old checkpoint becomes the next spare. When no spare that large can
//! be had (the pool is full), what would grow the namespace is refused with ENOSPC
//! ([`Reserve`]), and frees go on: a full volume behaves like a full file system.

use super::root::{Place, Root};
use crate::client::volume::FreeGate;
use crate::client::Pool;
use crate::error::{Error, Result};
use crate::fabric::{RemoteRegion, ServerId};
use crate::fs::{Barrier, JournalStats, JournalView};
use crate::meta::{record, Change, Journal};
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{Arc, Condvar, Mutex};
use std::time::{Instant, SystemTime};

#[cfg(feature = "testing")]
mod hooks;
mod members;
mod spare;
mod writer;
pub(super) use spare::session_marks;
pub(super) use spare::{Reserve, Spare};

use crate::config::{
    JOURNAL_COMMIT_BATCH, JOURNAL_COMMIT_INTERVAL, JOURNAL_COPIES, JOURNAL_HEAL_RETRY,
};

/// Changes per checkpoint frame: frames stay far below a record's payload limit.
pub(super) const CHANGES_PER_FRAME: usize = 4096;

struct Pending {
    /// Commits held back (a test's crash between an operation and its commit).
    #[cfg(feature = "testing")]
    held: bool,
    /// The next group reaches the first ring copy whole and the others only up to this many
    /// bytes, and the journal stops (a test's crash between the copies' writes).
    #[cfg(feature = "testing")]
    tear: Option<usize>,
    bytes: Vec<u8>,
    /// Each framed record's sequence number and where it ends in `bytes`.
    frames: Vec<(u64, usize)>,
    sync_wanted: bool,
}

struct Done {
    committed: u64,
    failed: Option<String>,
}

/// What the journal has written (`stats`), kept by the writer.
#[derive(Default)]
pub(super) struct Written {
    groups: AtomicU64,
    bytes: AtomicU64,
    checkpoints: AtomicU64,
}

pub(super) struct Shared {
    written: Arc<Written>,
    pool: Arc<Pool>,
    reserve: Arc<Reserve>,
    /// The ring's writer: whoever holds it writes the next group (the committer, or an
    /// `fsync` that found no commit running).
    writer: Mutex<Writer>,
    pending: Mutex<Pending>,
    wake: Condvar,
    done: Mutex<Done>,
    done_cv: Condvar,
    pub(super) gate: Arc<FreeGate>,
    stop: AtomicBool,
    /// Test hook ([`VolumeJournal::stop_after_next_commit`]).
    #[cfg(feature = "testing")]
    stop_after: hooks::CommitStop,
}

/// What writes the ring and checkpoints: only the committer thread (and attach, before it
/// starts) uses it.
pub(super) struct Writer {
    /// The table and data store it reads (see [`crate::fs::JournalView`]).
    pub(super) view: JournalView,
    pub(super) pool: Arc<Pool>,
    pub(super) root: Root,
    /// Where the next record goes in the ring.
    pub(super) tail: u64,
    /// Ring size and checkpoint slice.
    pub(super) options: super::JournalOptions,
    pub(super) written: Arc<Written>,
    /// No attempt to restore the ring's copies before then (the last one failed: the pool
    /// may be full); none made yet.
    pub(super) heal_after: Option<Instant>,
    /// Bytes reserved for the current checkpoint's copies (the smallest of them), and their
    /// servers' downs when they were known good (see [`Spare::downs`]).
    pub(super) checkpoint_cap: u64,
    pub(super) checkpoint_marks: Vec<u64>,
    pub(super) spare: Spare,
    pub(super) reserve: Arc<Reserve>,
}

fn eio(why: String) -> Error {
    Error::new(libc::EIO, why)
}

pub(super) fn region(p: &Place, len: u64) -> RemoteRegion {
    RemoteRegion {
        server: ServerId(p.server),
        addr: p.addr,
        len,
        rkey: p.rkey,
    }
}

/// The running journal: the namespace's [`Journal`], the file system's [`Barrier`], and
/// the committer thread.
pub struct VolumeJournal {
    pub(super) shared: Arc<Shared>,
    epoch: u64,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// The namespace's end of the journal (handed to [`crate::meta::Meta::set_journal`]).
pub struct Recorder(Arc<Shared>);

impl Journal for Recorder {
    fn record(&mut self, changes: &[Change], _table: &crate::meta::TableView<'_>) -> Result<()> {
        if let Some(why) = &self.0.done.lock().failed {
            return Err(eio(why.clone()));
        }
        let gate = &self.0.gate;
        let lsn = gate.assigned.load(Ordering::SeqCst) + 1;
        let frame = record::encode(lsn, changes);
        if let Err(e) = self
            .0
            .reserve
            .admit(&self.0.pool, changes, frame.len() as u64)
        {
            self.0.wake.notify_one();
            return Err(e);
        }
        let mut p = self.0.pending.lock();
        p.bytes.extend_from_slice(&frame);
        let end = p.bytes.len();
        p.frames.push((lsn, end));
        gate.assigned.store(lsn, Ordering::SeqCst);
        if end >= JOURNAL_COMMIT_BATCH {
            self.0.wake.notify_one();
        }
        Ok(())
    }
}

impl Barrier for VolumeJournal {
    fn sync(&self) -> Result<()> {
        self.shared.sync()
    }

    fn stats(&self) -> JournalStats {
        let w = &self.shared.written;
        JournalStats {
            epoch: self.epoch,
            committed: self.committed(),
            groups: w.groups.load(Ordering::Relaxed),
            bytes: w.bytes.load(Ordering::Relaxed),
            checkpoints: w.checkpoints.load(Ordering::Relaxed),
            frees_held: self.shared.gate.held() as u64,
        }
    }

    fn rekey(&self, server: u32, keys: &std::collections::HashMap<u64, u64>) -> Result<()> {
        let mut w = self.shared.writer.lock();
        let mut root = w.root.clone();
        let mut changed = false;
        for p in root.ring.iter_mut().chain(root.checkpoint.iter_mut()) {
            if p.server != server {
                continue;
            }
            if let Some(&rkey) = keys.get(&p.addr) {
                changed |= rkey != p.rkey;
                p.rkey = rkey;
            }
        }
        // The spare is named by no root, but written into at the next wrap.
        for p in w.spare.places.iter_mut().filter(|p| p.server == server) {
            if let Some(&rkey) = keys.get(&p.addr) {
                p.rkey = rkey;
            }
        }
        if changed {
            w.publish(root).map_err(eio)?;
        }
        Ok(())
    }
}

impl Shared {
    /// Returns once every record assigned so far is committed. The caller writes the group
    /// itself when no commit is running (one thread hand-off fewer each way: an `fsync`
    /// costs the replicated WRITE), else it wakes the committer and waits.
    fn sync(&self) -> Result<()> {
        let target = self.gate.assigned.load(Ordering::SeqCst);
        loop {
            {
                let d = self.done.lock();
                if let Some(why) = &d.failed {
                    return Err(eio(why.clone()));
                }
                if d.committed >= target {
                    return Ok(());
                }
            }
            if let Some(mut w) = self.writer.try_lock() {
                if let Some((bytes, last)) = self.take_group() {
                    self.commit_group(&mut w, &bytes, last);
                    continue;
                }
                if self.stop.load(Ordering::SeqCst) {
                    return Err(eio("the volume's journal is stopped".into()));
                }
            }
            {
                let mut p = self.pending.lock();
                p.sync_wanted = true;
                self.wake.notify_one();
            }
            let d = self.done.lock();
            if d.committed < target && d.failed.is_none() {
                // Bounded: a commit that ended between the check and this wait is seen.
                let _ = self.done_cv.wait_timeout(d, JOURNAL_COMMIT_INTERVAL);
            }
        }
    }

    /// Waits until a group is due: records pending, and the commit interval passed, an
    /// `fsync` waiting or a batch's worth there; or, with nothing pending, until committed
    /// frees that wait for the followers are due to be asked about again. False: stopping
    /// with nothing left.
    fn wait_for_group(&self) -> bool {
        let mut p = self.pending.lock();
        #[cfg(feature = "testing")]
        while p.held && !self.stop.load(Ordering::SeqCst) {
            p = self.wake.wait(p);
        }
        while p.bytes.is_empty() {
            if self.stop.load(Ordering::SeqCst) {
                return false;
            }
            if self.reserve.wanted.load(Ordering::SeqCst) {
                return true;
            }
            if self.gate.waits_for_followers() {
                p = self
                    .wake
                    .wait_timeout(p, crate::config::FOLLOWER_FLOOR_POLL)
                    .0;
                if p.bytes.is_empty() {
                    return true;
                }
                continue;
            }
            p = self.wake.wait_timeout(p, JOURNAL_COMMIT_INTERVAL * 20).0;
        }
        let deadline = Instant::now() + JOURNAL_COMMIT_INTERVAL;
        while !p.sync_wanted
            && p.bytes.len() < JOURNAL_COMMIT_BATCH
            && !self.stop.load(Ordering::SeqCst)
        {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            p = self.wake.wait_timeout(p, left).0;
        }
        true
    }

    /// Takes what is pending as one group and its last sequence number; only under the
    /// writer's lock, so groups reach the ring in order.
    fn take_group(&self) -> Option<(Vec<u8>, u64)> {
        let mut p = self.pending.lock();
        #[cfg(feature = "testing")]
        if p.held {
            return None;
        }
        p.sync_wanted = false;
        if p.bytes.is_empty() {
            return None;
        }
        let last = p.frames.last().map(|f| f.0).unwrap_or(0);
        p.frames.clear();
        Some((std::mem::take(&mut p.bytes), last))
    }

    /// Writes one group (see [`Writer::append`]) and publishes the outcome.
    fn commit_group(&self, writer: &mut Writer, bytes: &[u8], last: u64) {
        if self.done.lock().failed.is_some() {
            return;
        }
        if let Some(why) = writer.pool.fenced() {
            return self.fail(why);
        }
        #[cfg(feature = "testing")]
        if let Some(n) = self.pending.lock().tear.take() {
            writer.tear(bytes, n);
            return self.fail("the journal was torn by a test".into());
        }
        // The bytes of writes answered before they were sent go first: a record never
        // commits before the data it names (see `data::behind`).
        if let Ok(data) = writer.data() {
            data.send_all_behind();
        }
        match writer.append(&self.gate, bytes, last) {
            Ok(lsn) => {
                // Backed servers write the group (and the data before it) to their medium
                // before it counts as committed.
                writer.pool.persist();
                self.forget_up_to(lsn);
                self.committed(&writer.pool, lsn.max(last));
            }
            Err(why) => self.fail(why),
        }
    }

    /// Drops pending records a checkpoint up to `lsn` holds already.
    fn forget_up_to(&self, lsn: u64) {
        let mut p = self.pending.lock();
        let cut = p
            .frames
            .iter()
            .take_while(|f| f.0 <= lsn)
            .last()
            .map(|f| f.1)
            .unwrap_or(0);
        if cut == 0 {
            return;
        }
        p.bytes.drain(..cut);
        p.frames.retain(|f| f.0 > lsn);
        for f in &mut p.frames {
            f.1 -= cut;
        }
    }

    fn committed(&self, pool: &Pool, lsn: u64) {
        // The frees the commit lets go are sent before a waiting `fsync` learns of it: an
        // `rm` then `fsync` then a write (or `statfs`, which waits for the frees sent) finds
        // the room the `rm` made.
        pool.release_frees(&self.gate, lsn);
        {
            let mut d = self.done.lock();
            d.committed = d.committed.max(lsn);
        }
        self.done_cv.notify_all();
        #[cfg(feature = "testing")]
        self.stop_after.here();
    }

    fn fail(&self, why: String) {
        log::error!("volume journal stopped: {why}; every operation now fails (EIO)");
        self.done.lock().failed = Some(why);
        self.done_cv.notify_all();
    }
}

impl Shared {
    /// A checkpoint now, with a fresh ring on the journal servers of the moment, under the
    /// writer's lock; the records it holds count as committed (it holds every record assigned
    /// so far, so nothing need be synced first: a sync here would wait for the committer,
    /// which waits for this lock).
    fn checkpoint_now(&self, w: &mut Writer) -> Result<()> {
        if let Some(why) = &self.done.lock().failed {
            return Err(eio(why.clone()));
        }
        let lsn = w.checkpoint(&self.gate, true).map_err(eio)?;
        self.forget_up_to(lsn);
        self.committed(&w.pool, lsn);
        Ok(())
    }
}

impl VolumeJournal {
    /// Starts the committer over `writer`, records numbered after `last_lsn` (what attach
    /// replayed and checkpointed).
    pub(super) fn start(
        writer: Writer,
        gate: Arc<FreeGate>,
        last_lsn: u64,
    ) -> std::io::Result<(VolumeJournal, Recorder)> {
        gate.assigned.store(last_lsn, Ordering::SeqCst);
        let epoch = writer.pool.epoch();
        let shared = Arc::new(Shared {
            written: writer.written.clone(),
            pool: writer.pool.clone(),
            reserve: writer.reserve.clone(),
            writer: Mutex::new(writer),
            pending: Mutex::new(Pending {
                #[cfg(feature = "testing")]
                held: false,
                #[cfg(feature = "testing")]
                tear: None,
                bytes: Vec::new(),
                frames: Vec::new(),
                sync_wanted: false,
            }),
            wake: Condvar::new(),
            done: Mutex::new(Done {
                committed: last_lsn,
                failed: None,
            }),
            done_cv: Condvar::new(),
            gate: gate.clone(),
            stop: AtomicBool::new(false),
            #[cfg(feature = "testing")]
            stop_after: hooks::CommitStop::default(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("volume-commit".into())
            .spawn(move || {
                while s.wait_for_group() {
                    let mut w = s.writer.lock();
                    match s.take_group() {
                        Some((bytes, last)) => s.commit_group(&mut w, &bytes, last),
                        // Frees that wait only for the followers.
                        None => w.pool.release_frees(&s.gate, 0),
                    }
                    if s.reserve.due() {
                        w.grow_spare(&s.gate);
                    }
                }
            })?;
        Ok((
            VolumeJournal {
                shared: shared.clone(),
                epoch,
                thread: Mutex::new(Some(thread)),
            },
            Recorder(shared),
        ))
    }

    /// Every write answered so far on its copies (see `data::behind`: a write into a chunk
    /// already named waits for no record) and every change committed: before an unmount or a
    /// planned restart, which must lose nothing.
    pub fn sync_all(&self) -> Result<()> {
        let data = self.shared.writer.lock().data();
        if let Ok(data) = data {
            data.send_all_behind();
        }
        self.shared.sync()
    }

    /// Commits what is pending and stops the committer (an unmount).
    pub fn stop(&self) -> Result<()> {
        #[cfg(feature = "testing")]
        self.hold_commits(false);
        #[cfg(feature = "testing")]
        self.go_on();
        let res = self.sync_all();
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake.notify_all();
        let thread = self.thread.lock().take();
        if let Some(t) = thread {
            let _ = t.join();
        }
        res
    }

    /// Sequence number of the last commit (`stats`).
    pub fn committed(&self) -> u64 {
        self.shared.done.lock().committed
    }
}

impl Drop for VolumeJournal {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
