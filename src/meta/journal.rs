//! Where committed batches go ([`Journal`]): a volume's journal records them before they
//! count, a shared volume's client appends them to its engine, and a mount without a volume
//! records nothing ([`InMemory`]). Apart from [`super::batch`] because a journal is the
//! namespace's outward edge (what it hands on, and when the memory a write let go of and the
//! bytes it left unsent may go), not how a batch is built and undone.

use super::batch::Change;
use super::extents::ExtentChange;
use super::Ino;
use crate::error::Result;

/// Where committed batches go: a volume's journal records them before they count. An error
/// fails the operation and undoes its changes.
pub trait Journal: Send {
    /// `table`: the table with `changes` made (what a shared volume's append reads).
    fn record(&mut self, changes: &[Change], table: &super::TableView<'_>) -> Result<()>;

    /// A write's changes of file `ino` (its size, times and chunks, whose bytes are on every
    /// copy already): a journal may hold them back until [`Journal::record`] of the next
    /// batch, which then carries them first. `then` runs once they are recorded (it gives
    /// back the memory the write let go of: never before a record stops naming it), and is
    /// dropped unrun if they are refused. A shared volume's client holds them back while it
    /// holds the file's turn (see `volume::shared::behind`); others record them at once.
    ///
    /// `unsent`: the write was answered before its bytes reached the copies (`data::behind`);
    /// a journal has them sent before any record names the chunks they fill.
    fn record_write(
        &mut self,
        ino: Ino,
        changes: &[Change],
        table: &super::TableView<'_>,
        then: AfterRecord,
        unsent: Option<UnsentWrite<'_>>,
    ) -> Result<()> {
        let _ = ino;
        if let Some(u) = unsent {
            (u.now)();
        }
        self.record(changes, table)?;
        then();
        Ok(())
    }

    /// Whether a change of a name in a directory is logged as one that commutes with another
    /// client's change of another name there: a [`super::Change::DirStamp`] for the
    /// directory's times and link count, and a new entry without its `readdir` cookie (each
    /// table places it). A shared volume's log, whose clients change one directory at once,
    /// asks for it; a single writer's journal keeps exact attributes and places.
    fn commuting_dirs(&self) -> bool {
        false
    }
}

/// What runs once a write's changes are recorded ([`Journal::record_write`]).
pub type AfterRecord = Box<dyn FnOnce() + Send>;

/// Sends a write answered before its bytes were sent, from any thread, never waiting for its
/// file's lock (whose holder may wait for the caller); the chunk changes a failed send made
/// (copies taken out), if this call found them, for the record that names the write.
pub type SendLater = Box<dyn FnMut() -> Vec<ExtentChange> + Send>;

/// A write answered before its bytes reached the copies ([`Journal::record_write`]): sent
/// `now` by its writer, under the file's lock (for a record made at once), or `later` by
/// whoever records it (for a record held back).
pub struct UnsentWrite<'a> {
    pub now: &'a mut dyn FnMut(),
    pub later: SendLater,
}

/// The journal of a namespace that lives only in this process (a mount without a volume):
/// nothing to record.
#[derive(Debug, Default)]
pub struct InMemory;

impl Journal for InMemory {
    fn record(&mut self, _changes: &[Change], _table: &super::TableView<'_>) -> Result<()> {
        Ok(())
    }
}
