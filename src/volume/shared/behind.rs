//! Writes answered before the engine holds their size: a write's changes (the file's size and
//! times, the new chunks it filled) are held back while this client holds the file's turn,
//! and appended with this client's next change, at `fsync` and at a close, before the turn
//! goes back, and at the latest [`TURN_LINGER`] after the first of them.
//!
//! Why: a `tar x` or a copy writes a file in many small `write(2)`s, and a random 4 KiB
//! writer changes the file's times with every one; appended one by one, each waits a Redis
//! round trip (a `tar x` of small files spent a third of its round trips on them). Held
//! back, they cost none, and what a write promises is kept as a local file system keeps
//! it: its bytes are on every copy before it is answered (a shared mount does not write
//! behind), and its size is durable at `fsync` (a crash of this client before loses it, as
//! POSIX allows for data never synced; its memory is collected with the evicted client's).
//! Every namespace change is still answered only once the engine holds it.
//!
//! What stays true:
//! - **No other client changes the file meanwhile**: a write is held back only while this
//!   client holds the file's turn for at least [`TURN_LINGER`] more, and the turn goes back
//!   only after what is held back is appended, so the engine's versions still order every
//!   change of the file.
//! - **This client's own order**: held-back writes go into the engine ahead of any change
//!   this client makes after them (carried in the same append), so the log never shows a
//!   later change of this client without an earlier write.
//! - **Close-to-open**: a close returns after its file's writes are appended, so a client
//!   that opens the file afterwards sees them (as NFS and JuiceFS give); one that reads it
//!   while it is written sees its size at most [`TURN_LINGER`] (and a poll) old.
//! - **No memory goes back while the engine names it**: what a held-back write let go of (a
//!   first chunk moved to a larger one, a copy on a failed server) is freed once the write
//!   is appended, and the frees then wait for every member to apply it, as every shared
//!   free does. A write that drops a chunk or changes an encoded one is appended at once
//!   (`Fs::commit_write_with` decides).
//! - Checkpoints and a checkpoint's load append what is held back first (a table with
//!   changes the log lacks is never written, nor thrown away).

use super::*;

/// Writes' changes held back, in the order they were answered.
#[derive(Default)]
pub(super) struct Behind {
    changes: Vec<Change>,
    /// The files they touch (sorted, once each).
    files: Vec<Ino>,
    /// When the first of them was answered.
    since: Option<Instant>,
    /// What runs once they are appended: the memory they let go of is freed.
    then: Vec<crate::meta::AfterRecord>,
}

impl Behind {
    /// Appended: what waited for it runs.
    fn appended(&mut self) {
        self.changes.clear();
        self.files.clear();
        self.since = None;
        for then in self.then.drain(..) {
            then();
        }
    }
}

/// `a` and `b` together, sorted, once each.
fn union(a: &[Ino], b: &[Ino]) -> Vec<Ino> {
    let mut all = [a, b].concat();
    all.sort_unstable();
    all.dedup();
    all
}

impl State {
    /// Holds back write `changes` of file `ino`, `then` to run once they are appended, if
    /// this client holds its turn long enough for the linger thread to append them first;
    /// else gives `then` back.
    pub(super) fn hold_back(
        &self,
        ino: Ino,
        changes: &[Change],
        then: crate::meta::AfterRecord,
    ) -> std::result::Result<(), crate::meta::AfterRecord> {
        if !self.hold_writes.load(Ordering::SeqCst) || !self.holds_for(ino, TURN_LINGER * 2) {
            return Err(then);
        }
        let mut b = self.behind.lock();
        b.changes.extend_from_slice(changes);
        if let Err(at) = b.files.binary_search(&ino) {
            b.files.insert(at, ino);
        }
        b.since.get_or_insert_with(Instant::now);
        b.then.push(then);
        Ok(())
    }

    /// Appends `changes` (touching `keys`, claiming `claim`, marking `opened` and `dropped`)
    /// after every write held back: in one append when the engine takes both, else the
    /// writes first on their own. The table's lock is held (a batch's commit).
    pub(super) fn append_after_writes(
        &self,
        changes: &[Change],
        keys: &[Ino],
        claim: &[Ino],
        opened: &[Ino],
        dropped: &[Ino],
    ) -> Result<()> {
        let mut b = self.behind.lock();
        if b.changes.is_empty() {
            drop(b);
            return self.append_changes(changes, keys, claim, opened, dropped);
        }
        let both = [&b.changes[..], changes].concat();
        let both_keys = union(&b.files, keys);
        if self
            .append_changes(&both, &both_keys, claim, opened, dropped)
            .is_ok()
        {
            b.appended();
            return Ok(());
        }
        // Refused (most often the change lost to another client's): the writes alone, then
        // the change, which decides again if it loses again.
        self.append_held(&mut b)?;
        drop(b);
        self.append_changes(changes, keys, claim, opened, dropped)
    }

    /// Appends every write held back (see the module doc).
    pub(super) fn send_behind(&self) -> Result<()> {
        let mut b = self.behind.lock();
        self.append_held(&mut b)
    }

    /// Appends what was held back for at least [`TURN_LINGER`] (the linger thread).
    pub(super) fn send_behind_if_old(&self) {
        let due = self
            .behind
            .lock()
            .since
            .is_some_and(|t| t.elapsed() >= TURN_LINGER);
        if due {
            if let Err(e) = self.send_behind() {
                log::warn!("shared volume: appending writes held back: {}", e.message);
            }
        }
    }

    fn append_held(&self, b: &mut Behind) -> Result<()> {
        if b.changes.is_empty() {
            return Ok(());
        }
        match self.append_changes(&b.changes, &b.files, &[], &[], &[]) {
            Ok(()) => {
                b.appended();
                Ok(())
            }
            // Another client changed one of the files: its turn ran out before the writes
            // went (the engine unreachable past the lease). They cannot be ordered any more.
            Err(e) if e.conflict.is_some() => {
                // Their memory stays (the engine still names what they let go of).
                let files = b.files.clone();
                *b = Behind::default();
                Err(self.stop_for_good(format!(
                    "writes of inodes {files:?} answered here could not be appended before \
                     their turn ran out: {}; unmount and mount again to go on",
                    e.message
                )))
            }
            // The engine unreachable: kept, and tried again.
            Err(e) => Err(e),
        }
    }
}
