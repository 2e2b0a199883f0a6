//! Writes answered before the engine holds their size: a write's changes (the file's size and
//! times, the new chunks it filled) are held back while this client holds the file's turn,
//! and appended with this client's next change, at `fsync` and at a close, before the turn
//! goes back, and at the latest [`TURN_LINGER`] after the first of them.
//!
//! Why: a `tar x` or a copy writes a file in many small `write(2)`s, and a random 4 KiB
//! writer changes the file's times with every one; appended one by one, each waits a Redis
//! round trip (a `tar x` of small files spent a third of its round trips on them). Held
//! back, they cost none, and what a write promises is kept as a local file system keeps
//! it: its bytes and size are durable at `fsync` (a crash of this client before loses them,
//! as POSIX allows for data never synced; its memory is collected with the evicted
//! client's). With `-o write_behind` a small write is answered before its bytes are on the
//! copies, as on a private mount (`data::behind`), and they are sent before the append that
//! carries the write: no other client is ever given a record naming chunks
//! whose bytes are not there yet. A send that fails after the answer takes the failed
//! copies out, and that change goes in the same append. Every namespace change is still
//! answered only once the engine holds it.
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
//! - **An answer lost is not a write lost**: an append of them that the engine took as it
//!   went away (Redis killed as it answered), and that the append's own look at the log did
//!   not find (the engine away longer, [`super::append`]), is found in the log by the next
//!   catch-up or the next try's refusal, and counts as appended; the table applies only what else it
//!   carried (never the writes again, over writes made since).
//! - Checkpoints and a checkpoint's load append what is held back first (a table with
//!   changes the log lacks is never written, nor thrown away).

use super::append::{NotTaken, Outgoing};
use super::*;

/// Writes' changes held back, in the order they were answered.
#[derive(Default)]
pub(super) struct Behind {
    changes: Vec<Change>,
    /// Each write held back: its file, where its changes end in `changes`, and what runs
    /// once they are appended (the memory it let go of is freed).
    holds: Vec<Hold>,
    /// When the first of them was answered.
    since: Option<Instant>,
    /// Appends of what is held back whose answer was lost (the engine went away as it ran
    /// them): the engine may hold one. The log tells ([`State::settle_unanswered`]): a
    /// catch-up that finds one there applies only the rest of it, and the writes it carried
    /// are appended; one that reads to the log's head without finding them forgets them.
    unanswered: Vec<Unanswered>,
    /// Unanswered appends noted so far (their numbers).
    unanswered_count: u64,
}

struct Hold {
    file: Ino,
    end: usize,
    then: crate::meta::AfterRecord,
    /// Its bytes, answered before they were sent: sent before any append carries it.
    unsent: Option<crate::meta::SendLater>,
}

/// An append whose answer was lost: its record, and how many of the writes' changes held
/// back it carried first.
struct Unanswered {
    number: u64,
    record: Vec<u8>,
    held: usize,
}

impl Behind {
    /// The files the writes held back touch (sorted, once each).
    fn files(&self) -> Vec<Ino> {
        self.files_of(self.holds.len())
    }

    /// The files of the first `n` writes held back.
    fn files_of(&self, n: usize) -> Vec<Ino> {
        let mut files: Vec<Ino> = self.holds[..n].iter().map(|h| h.file).collect();
        files.sort_unstable();
        files.dedup();
        files
    }

    /// The bytes of every write held back are on their copies: those answered before they
    /// were sent are sent now (each once), and the chunk changes a failed send made (copies
    /// taken out) are held back after them, so the append that names the write's chunks
    /// names only copies that hold its bytes.
    fn send_unsent(&mut self) {
        let mut made = Vec::new();
        for h in &mut self.holds {
            if let Some(mut send) = h.unsent.take() {
                made.extend(send().into_iter().map(|e| Change::Extent {
                    ino: h.file,
                    idx: e.idx,
                    chunk: e.chunk,
                }));
            }
        }
        self.changes.extend(made);
    }

    /// The first `n` changes are appended: what waited for their writes runs.
    fn appended(&mut self, n: usize) {
        self.changes.drain(..n);
        let done = self.holds.iter().take_while(|h| h.end <= n).count();
        for h in self.holds.drain(..done) {
            (h.then)();
        }
        for h in &mut self.holds {
            h.end -= n;
        }
        if self.changes.is_empty() {
            self.since = None;
        }
    }

    /// Every change held back is appended.
    fn all_appended(&mut self) {
        self.appended(self.changes.len())
    }

    /// What an append carrying every change held back first came to: taken, they are
    /// appended (`Ok(None)`); its answer lost, it is noted (the log tells later) and its
    /// error returned; refused, the refusal (`Ok(Some)`).
    fn outcome(&mut self, sent: std::result::Result<(), NotTaken>) -> Result<Option<Error>> {
        match sent {
            Ok(()) => {
                self.all_appended();
                // An earlier append of them whose answer was lost is this one (the same
                // record, found in the log by the append itself) or was never taken (this
                // one would have been refused): either way nothing is left to find.
                self.unanswered.clear();
                Ok(None)
            }
            Err(NotTaken {
                error,
                unanswered: Some(record),
            }) => {
                self.note_unanswered(record);
                Err(error)
            }
            Err(NotTaken { error, .. }) => Ok(Some(error)),
        }
    }

    /// An append of `record`, carrying every change held back first, lost its answer.
    fn note_unanswered(&mut self, record: Vec<u8>) {
        // Sent again as it was (the engine unreachable): once is enough.
        if self.unanswered.iter().any(|u| u.record == record) {
            return;
        }
        self.unanswered_count += 1;
        self.unanswered.push(Unanswered {
            number: self.unanswered_count,
            record,
            held: self.changes.len(),
        });
    }

    /// The number of the last unanswered append noted (0: none yet).
    pub(super) fn last_unanswered(&self) -> u64 {
        self.unanswered_count
    }

    /// The log was read to its head after unanswered appends through `number` were noted,
    /// and held none of them: the engine never took them.
    pub(super) fn forget_unanswered_through(&mut self, number: u64) {
        self.unanswered.retain(|u| u.number > number);
    }
}

/// `a` and `b` together, sorted, once each.
impl State {
    /// Holds back write `changes` of file `ino`, `then` to run once they are appended, if
    /// this client holds its turn long enough for the linger thread to append them first;
    /// else gives `then` back.
    ///
    /// `unsent`: the write was answered before its bytes were sent; they are sent before the
    /// append that carries it ([`Behind::send_unsent`]).
    pub(super) fn hold_back(
        &self,
        ino: Ino,
        changes: &[Change],
        then: crate::meta::AfterRecord,
        unsent: Option<crate::meta::SendLater>,
    ) -> std::result::Result<(), crate::meta::AfterRecord> {
        if !self.hold_writes.load(Ordering::SeqCst) || !self.holds_for(ino, TURN_LINGER * 2) {
            return Err(then);
        }
        let mut b = self.behind.lock();
        b.changes.extend_from_slice(changes);
        let end = b.changes.len();
        b.holds.push(Hold {
            file: ino,
            end,
            then,
            unsent,
        });
        b.since.get_or_insert_with(Instant::now);
        Ok(())
    }

    /// Appends change `out` after every write held back: in one append when the engine takes
    /// both, else the writes first on their own. The table's lock is held (a batch's commit).
    pub(super) fn append_after_writes(&self, out: Outgoing<'_>) -> Result<()> {
        let mut b = self.behind.lock();
        if b.changes.is_empty() {
            drop(b);
            return self.append_changes(out);
        }
        b.send_unsent();
        let both = [&b.changes[..], out.changes].concat();
        let both_keys = touch::Touched::exclusive(b.files()).with(out.keys);
        let with_writes = Outgoing {
            changes: &both,
            keys: &both_keys,
            ..out
        };
        // Answer lost: the change fails (undone here), and the writes stay until the log
        // tells whether the engine took them.
        let sent = self.offer_changes(with_writes);
        if b.outcome(sent)?.is_none() {
            return Ok(());
        }
        // Refused (most often the change lost to another client's): the writes alone, then
        // the change, which decides again if it loses again.
        self.append_held(&mut b)?;
        drop(b);
        self.append_changes(out)
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
        b.send_unsent();
        let files = b.files();
        let keys = touch::Touched::exclusive(files.clone());
        let writes = Outgoing {
            changes: &b.changes,
            keys: &keys,
            ..Outgoing::default()
        };
        // Answer lost: kept, and tried again; the log tells whether the engine took this one.
        let sent = self.offer_changes(writes);
        let Some(error) = b.outcome(sent)? else {
            return Ok(());
        };
        if error.conflict.is_none() {
            // The engine unreachable: kept, and tried again.
            return Err(error);
        }
        // The files changed after this table's view: by an append of these writes whose
        // answer was lost (then the rest goes), or by another client, whose turn ran out
        // before the writes went (the engine unreachable past the lease).
        if !b.unanswered.is_empty() && self.find_unanswered(b)? {
            return self.append_held(b);
        }
        // They cannot be ordered any more. Their memory stays (the engine still names what
        // they let go of).
        *b = Behind::default();
        Err(self.stop_for_good(format!(
            "writes of inodes {files:?} answered here could not be appended before their turn \
             ran out: {}; unmount and mount again to go on",
            error.message
        )))
    }

    /// Reads the log past this table for an unanswered append of the writes held back;
    /// whether it was there (see [`State::settle_unanswered`]).
    fn find_unanswered(&self, b: &mut Behind) -> Result<bool> {
        let mut after = self.applied.load(Ordering::SeqCst);
        loop {
            let got = self
                .engine
                .read_after(after, READ_BATCH)
                .map_err(engine_err)?;
            if self.settle_unanswered(b, &got) {
                return Ok(true);
            }
            match got.last() {
                Some((lsn, _)) if got.len() == READ_BATCH => after = *lsn,
                _ => return Ok(false),
            }
        }
    }

    /// If one of `got` (entries of the log past this table) is an append of the writes held
    /// back whose answer was lost, those writes are appended: the table applies only the rest
    /// of it (another change of this client's it carried, undone here when it failed), and
    /// the writes held since go next. Whether one was. Under `behind`'s lock, so no append of
    /// them races it; before the catch-up applies `got`.
    pub(super) fn settle_unanswered(&self, b: &mut Behind, got: &[(u64, Vec<u8>)]) -> bool {
        if b.unanswered.is_empty() {
            return false;
        }
        let found = got.iter().find_map(|(lsn, bytes)| {
            b.unanswered
                .iter()
                .find(|u| u.record == *bytes)
                .map(|u| (*lsn, u.held))
        });
        let Some((lsn, held)) = found else {
            return false;
        };
        log::warn!(
            "shared volume: the engine took writes held back (change {lsn}) though their \
             answer was lost"
        );
        // At most one of them is in the log: each carries every write held back before it,
        // so any after the first taken is refused.
        b.unanswered.clear();
        let holds = b.holds.iter().take_while(|h| h.end <= held).count();
        let files = b.files_of(holds);
        self.ahead.lock().noted_prefix(lsn, held, &files);
        // Frees of what they let go wait for it to be applied everywhere.
        self.gate.assigned.fetch_max(lsn, Ordering::SeqCst);
        b.appended(held);
        true
    }
}
