//! Following a volume read-only (`rmemfs mount DIR --volume NAME --read-only`), on any
//! number of hosts at once, while its one holder keeps writing.
//!
//! A follower loads the newest checkpoint and the ring as attach does, then reads the ring's
//! tail every [`FOLLOW_POLL`] by one-sided READs and applies what the holder committed
//! ([`Fs::apply_followed`], which tells the kernel what to forget). It holds no lock and
//! sends the holder nothing: it cannot slow it. Each poll it tells every server how far it
//! has applied (`FollowAt`) and learns the volume's root: a new ring the follower has read up
//! to is read from its start; a checkpoint past what it has applied (it fell behind the
//! ring) is loaded whole and replaces the namespace ([`Fs::replace_followed`]).
//!
//! Memory it may still map is safe: the holder frees an extent only once every follower
//! has reported a sequence number past the record that dropped it (see
//! [`crate::client::volume::FreeGate`]), and a follower reports a record only after applying
//! it, which waits for the reads that used the old chunks. What is *not* ordered: a holder's
//! in-place overwrite of a chunk is in its memory before the record of it commits, so a
//! follower may read new bytes under old attributes (as NFS readers may).

use super::read::{self, Records};
use super::root::{Place, Root};
use crate::data::DataStore;
use crate::fabric::{RemoteRegion, ServerId};
use crate::fs::{Fs, FsConfig};
use crate::meta::{record, Meta};
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::{Arc, Condvar, Mutex, Weak};
use std::net::SocketAddr;

use crate::config::{FOLLOW_POLL, FOLLOW_WINDOW_MAX, FOLLOW_WINDOW_MIN};

/// What a follower has done (`stats`: the `follower` section).
#[derive(Debug, Default)]
pub struct FollowCounters {
    /// The last journal record applied.
    pub applied: AtomicU64,
    /// Records applied since the mount.
    pub records: AtomicU64,
    /// Looks at the journal's tail.
    pub polls: AtomicU64,
    /// Checkpoints loaded whole (it fell behind the ring).
    pub reloads: AtomicU64,
    /// Invalidations sent to the kernel.
    pub invalidations: AtomicU64,
    /// Polls that failed.
    pub errors: AtomicU64,
}

/// Where a follower is in the volume's journal.
struct Position {
    root: Root,
    /// The root's servers as this pool's indexes.
    perm: Vec<Option<u32>>,
    /// Where the next record is in the ring, and the sequence number expected there.
    tail: u64,
    next_lsn: u64,
    /// The last record applied.
    applied: u64,
    /// Bytes read at the tail in one go: small while the holder is quiet, grown while
    /// reads come back full (doubled while one record is longer).
    window: u64,
}

struct Shared {
    fs: Weak<Fs>,
    servers: Vec<String>,
    position: Mutex<Position>,
    figures: Arc<FollowCounters>,
    stop: Mutex<bool>,
    wake: Condvar,
    /// Polls left to [`Follower::poll_now`] (a test holding the follower back).
    #[cfg(feature = "testing")]
    paused: crate::sync::atomic::AtomicBool,
}

/// A running follower: stops (and is joined) on drop.
pub struct Follower {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The namespace as of `root`: the checkpoint and the ring's valid run, and where the run
/// ends.
fn load(
    data: &DataStore,
    root: &Root,
    perm: &[Option<u32>],
    config: &FsConfig,
) -> Result<(Meta, Position), String> {
    let pool = data.pool();
    let usable =
        |p: &Place| read::place_region(p, perm, |id| pool.is_live(ServerId(id)), |_, p| p.rkey);
    let mut meta = Meta::new(0o755, config.root_uid, config.root_gid);
    if let Some(records) = read::read_checkpoint(data, root, usable)? {
        read::apply_all(&mut meta, records, perm)?;
    }
    meta.number_from(root.next_ino);
    let (ring, end) = read::read_ring(data, root, usable)?;
    let applied = root.checkpoint_lsn + ring.len() as u64;
    read::apply_all(&mut meta, ring, perm)?;
    Ok((
        meta,
        Position {
            root: root.clone(),
            perm: perm.to_vec(),
            tail: end,
            next_lsn: applied + 1,
            applied,
            window: FOLLOW_WINDOW_MIN,
        },
    ))
}

/// Follows the volume the pool claimed with [`crate::proto::ClaimMode::Follow`]: its
/// namespace now, in a read-only file system kept in step with the holder's commits.
pub fn follow(
    data: DataStore,
    mut config: FsConfig,
    addrs: &[SocketAddr],
) -> Result<(Arc<Fs>, Follower), String> {
    let pool = data.pool().clone();
    let claims = pool.claims();
    let root = read::newest_root(claims.iter().map(|c| c.root.as_slice()))?.ok_or(
        "the volume has no journal yet (its holder has not finished attaching): try again",
    )?;
    if root.chunk_size != data.chunk_size() {
        return Err(format!(
            "the volume's chunks are {} bytes; this mount's are {} (follow with --chunk-size {})",
            root.chunk_size,
            data.chunk_size(),
            root.chunk_size
        ));
    }
    let servers: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
    let perm = read::permutation(&root, &servers, &[])?;
    config.read_only = true;
    config.writeback = false;
    let (meta, position) = load(&data, &root, &perm, &config)?;
    log::info!(
        "following volume: {} inodes, through record {} (checkpoint {})",
        meta.len(),
        position.applied,
        root.checkpoint_lsn
    );
    let fs = Arc::new(Fs::with_meta(data, config, meta));
    let figures = Arc::new(FollowCounters::default());
    figures.applied.store(position.applied, Ordering::Relaxed);
    pool.follow_at(position.applied);
    let shared = Arc::new(Shared {
        fs: Arc::downgrade(&fs),
        servers,
        position: Mutex::new(position),
        figures,
        stop: Mutex::new(false),
        wake: Condvar::new(),
        #[cfg(feature = "testing")]
        paused: Default::default(),
    });
    let s = shared.clone();
    let thread = std::thread::Builder::new()
        .name("volume-follow".into())
        .spawn(move || s.run())
        .map_err(|e| format!("cannot start the follower: {e}"))?;
    Ok((
        fs,
        Follower {
            shared,
            thread: Some(thread),
        },
    ))
}

impl Follower {
    pub fn figures(&self) -> Arc<FollowCounters> {
        self.shared.figures.clone()
    }

    /// Stops (or resumes) the follower's own polls: only [`Follower::poll_now`] moves it.
    #[cfg(feature = "testing")]
    pub fn pause(&self, paused: bool) {
        self.shared.paused.store(paused, Ordering::SeqCst);
    }

    /// One poll now (tests): reads the tail and the root; true if something was applied.
    pub fn poll_now(&self) -> Result<bool, String> {
        let fs = self.shared.fs.upgrade().ok_or("the file system is gone")?;
        self.shared.poll(&fs)
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        *self.shared.stop.lock() = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Shared {
    fn run(&self) {
        let mut failing = false;
        loop {
            {
                let stop = self.stop.lock();
                if *stop {
                    return;
                }
                let stop = self.wake.wait_timeout(stop, FOLLOW_POLL).0;
                if *stop {
                    return;
                }
            }
            #[cfg(feature = "testing")]
            if self.paused.load(Ordering::SeqCst) {
                continue;
            }
            let Some(fs) = self.fs.upgrade() else { return };
            match self.poll(&fs) {
                Ok(_) => failing = false,
                Err(why) => {
                    self.figures.errors.fetch_add(1, Ordering::Relaxed);
                    // Once per run of failures: a volume removed or a server away says so
                    // every poll.
                    if !std::mem::replace(&mut failing, true) {
                        log::error!("following the volume: {why}");
                    }
                }
            }
        }
    }

    /// Reads what the holder committed since the last poll and applies it, then reports
    /// how far and takes the volume's new root, if any (and reads on in it). True if
    /// something was applied. A ring that cannot be read is read again under the new root:
    /// the holder frees an old ring once this follower has read what it needs of it.
    fn poll(&self, fs: &Fs) -> Result<bool, String> {
        self.figures.polls.fetch_add(1, Ordering::Relaxed);
        let mut pos = self.position.lock();
        let first = self.read_on(fs, &mut pos);
        let roots = fs.data().pool().follow_at(pos.applied);
        if roots.is_empty() {
            return Err("no server answers for the volume (removed, or every server down)".into());
        }
        let newest = read::newest_root(roots.iter().map(|r| r.root.as_slice()))?;
        match newest.filter(|r| r.order() > pos.root.order()) {
            Some(root) => {
                self.take_root(fs, &mut pos, root)?;
                let more = self.read_on(fs, &mut pos)?;
                Ok(more || first.unwrap_or(false))
            }
            None => first,
        }
    }

    /// Reads and applies records at the tail until the ring has no more (a full window means
    /// more may follow at once). True if any were applied.
    fn read_on(&self, fs: &Fs, pos: &mut Position) -> Result<bool, String> {
        let mut any = false;
        while let Some(full) = self.read_tail(fs, pos)? {
            any = true;
            if !full {
                break;
            }
        }
        Ok(any)
    }

    /// Reads the ring at the tail and applies the records there: `Some(the window cut the
    /// read short)` if any were, `None` if none.
    fn read_tail(&self, fs: &Fs, pos: &mut Position) -> Result<Option<bool>, String> {
        let left = pos.root.ring_len.saturating_sub(pos.tail);
        if left == 0 || pos.root.ring.is_empty() {
            return Ok(None);
        }
        let len = pos.window.min(left);
        let pool = fs.data().pool();
        let mut bytes = None;
        for p in &pos.root.ring {
            let Some(r) =
                read::place_region(p, &pos.perm, |id| pool.is_live(ServerId(id)), |_, p| p.rkey)
            else {
                continue;
            };
            let r = RemoteRegion {
                len: pos.root.ring_len,
                ..r
            };
            match fs.data().read_region(r, pos.tail, len as usize) {
                Ok(b) => {
                    bytes = Some(b);
                    break;
                }
                Err(e) => log::debug!("reading the volume's journal on {}: {e}", r.server),
            }
        }
        let bytes = bytes.ok_or("no copy of the volume's journal can be read")?;
        let read = record::read(&bytes, pos.next_lsn);
        if let Some(why) = read::stop_reason(&read.stop) {
            return Err(why);
        }
        if read.records.is_empty() {
            pos.window = if matches!(read.stop, record::Stop::Torn) {
                // A record longer than the window (or one being written): a wider look next.
                (pos.window * 2).min(pos.root.ring_len)
            } else {
                FOLLOW_WINDOW_MIN
            };
            return Ok(None);
        }
        // The window, not the journal, ended the read: more may wait, read at once.
        let cut = matches!(read.stop, record::Stop::End | record::Stop::Torn);
        // Most of the window held records: read more at once next.
        if read.end as u64 * 2 >= len {
            pos.window = (pos.window * 4).clamp(FOLLOW_WINDOW_MIN, FOLLOW_WINDOW_MAX);
        }
        pos.tail += read.end as u64;
        pos.next_lsn += read.records.len() as u64;
        // Records a new ring repeats of what was applied already are skipped.
        let mut records: Records = read
            .records
            .into_iter()
            .filter(|(lsn, _)| *lsn > pos.applied)
            .collect();
        if records.is_empty() {
            return Ok(Some(cut));
        }
        read::renumber(&mut records, &pos.perm)?;
        let last = records.last().map(|r| r.0).unwrap_or(pos.applied);
        let told = fs.apply_followed(&records).map_err(|e| e.message)?;
        pos.applied = last;
        self.figures.applied.store(last, Ordering::Relaxed);
        self.figures
            .records
            .fetch_add(records.len() as u64, Ordering::Relaxed);
        self.figures
            .invalidations
            .fetch_add(told.len() as u64, Ordering::Relaxed);
        Ok(Some(cut))
    }

    /// The holder published `root`: a new ring is read from its start if this follower has
    /// applied everything its checkpoint holds; otherwise the checkpoint is loaded whole.
    fn take_root(&self, fs: &Fs, pos: &mut Position, root: Root) -> Result<(), String> {
        let perm = read::permutation(&root, &self.servers, &[])?;
        let new_cycle =
            root.ring != pos.root.ring || root.checkpoint_lsn != pos.root.checkpoint_lsn;
        if !new_cycle {
            pos.root = root;
            pos.perm = perm;
            return Ok(());
        }
        // Applied past the new checkpoint: one holder's checkpoint covers every record it
        // committed before it, so this is a new holder whose attach replayed fewer records
        // than this follower applied (it died between its ring copies' writes, and the copy
        // that had them is gone); its records from the checkpoint on reuse those numbers
        // for other changes. Only its checkpoint says what the volume is now.
        if pos.applied == root.checkpoint_lsn {
            pos.tail = 0;
            pos.next_lsn = root.checkpoint_lsn + 1;
            pos.root = root;
            pos.perm = perm;
            return Ok(());
        }
        log::info!(
            "the volume's journal moved past this follower or took another course (applied \
             {}, checkpoint {}): loading the checkpoint",
            pos.applied,
            root.checkpoint_lsn
        );
        let (meta, fresh) = load(fs.data(), &root, &perm, fs.config())?;
        let told = fs.replace_followed(meta);
        *pos = fresh;
        self.figures.reloads.fetch_add(1, Ordering::Relaxed);
        self.figures.applied.store(pos.applied, Ordering::Relaxed);
        self.figures
            .invalidations
            .fetch_add(told.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}
