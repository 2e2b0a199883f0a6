//! Metadata engines: where a shared volume's namespace lives when many clients write it,
//! instead of one holder's journal in the memory servers.
//!
//! Why a trait, and why this one: rmemfs must run on an existing distributed engine (Redis
//! here; TiKV or FoundationDB elsewhere), not a home-made one, and the namespace's rules stay
//! in one place (`fs` over `meta`). So an engine keeps what the volume journal keeps, in the
//! same records (`meta::record`: batches of typed changes, numbered): one totally ordered log
//! of the namespace's changes, appended one record at a time under an exclusive write turn,
//! and a checkpoint that bounds it. A client replays the checkpoint and the log into its own
//! table (as a follower does), takes the turn for each change, catches up, validates and
//! applies the change locally and appends it; the engine refuses an append out of turn or
//! out of order, so a client whose turn lapsed (frozen, cut off) can never add a change.
//! Sessions with heartbeats say which clients live; a client whose heartbeats stopped is
//! evicted from the memory servers (`server::share`) before anything it held goes to another.
//!
//! What another engine needs (not built here: no server package on these machines):
//! - the log: TiKV or FoundationDB keep it as keys `log/<lsn>` (big-endian) and a `head` key;
//!   an append is one transaction that reads `head`, checks it, writes both (FoundationDB's
//!   serializable transactions, or TiKV's optimistic ones with `head` in the read set);
//!   reading after an LSN is a range scan; trimming a range delete;
//! - the turn: a key holding the owner and an expiry, taken and renewed in a transaction,
//!   and checked inside the append's transaction (the append's fencing);
//! - sessions: a key per session with its expiry, scanned for the expired;
//! - the servers' order: one key, set if absent.
//! - locks: a key per locked inode holding its table ([`crate::meta::locks`]), replaced in a
//!   transaction that reads it and the caller's session (compare-and-swap).

#[cfg(any(test, feature = "testing"))]
pub mod mem;
pub mod redis;

use crate::meta::locks::LockTable;
use std::time::Duration;

/// Why an engine could not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The engine is unreachable or failed (its message).
    #[error("metadata engine: {0}")]
    Unavailable(String),
    /// An append out of order: the log's last change is `head`.
    #[error("metadata engine: the log is at change {head}, not the one before this append")]
    Behind { head: u64 },
    /// An append, renewal or release by a client that does not hold the write turn.
    #[error("metadata engine: '{who}' does not hold the write turn")]
    NotYourTurn { who: String },
    /// An append or heartbeat of a session that is not there (never started, or evicted).
    #[error("metadata engine: there is no session '{who}' (it ended or was evicted)")]
    NoSession { who: String },
    /// The turn stayed with another client past the wait.
    #[error("metadata engine: the write turn stayed with '{holder}' for {waited:?}")]
    TurnBusy { holder: String, waited: Duration },
}

/// A checkpoint: every change through `lsn`, as one image (`meta::record` frames).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub lsn: u64,
    pub image: Vec<u8>,
}

/// What a shared volume's metadata engine keeps for one volume (see the module doc).
pub trait MetaEngine: Send + Sync {
    /// Where, for messages (`redis://host:port/db`).
    fn describe(&self) -> String;

    /// The number of the log's last change (0: none yet).
    fn head(&self) -> Result<u64, EngineError>;

    /// Appends `record` as change `lsn`, if `who`'s session lives, `who` holds the write turn
    /// and the log's last change is `lsn - 1`; the turn is then `who`'s for `lease` more.
    /// True when another client waits for the turn (since it was last taken): the holder
    /// should give it back once its change is done.
    fn append(
        &self,
        who: &str,
        lsn: u64,
        record: &[u8],
        lease: Duration,
    ) -> Result<bool, EngineError>;

    /// Changes after `after`, in order, at most `max` of them. Changes a checkpoint has
    /// trimmed are not there: a reader behind [`MetaEngine::checkpoint`]'s LSN reloads it.
    fn read_after(&self, after: u64, max: usize) -> Result<Vec<(u64, Vec<u8>)>, EngineError>;

    /// Stores `checkpoint` (unless a newer one is there) and trims the log up to its LSN.
    fn put_checkpoint(&self, checkpoint: &Checkpoint) -> Result<(), EngineError>;

    /// The newest checkpoint, if any.
    fn checkpoint(&self) -> Result<Option<Checkpoint>, EngineError>;

    /// Takes the write turn for `who` for `lease` (renews it if `who` holds it), waiting up
    /// to `wait` while another holds it (which the holder is told by its next append).
    fn take_turn(&self, who: &str, lease: Duration, wait: Duration) -> Result<(), EngineError>;

    /// [`MetaEngine::take_turn`], then [`MetaEngine::read_after`] `after` (`max` changes):
    /// one round trip where the engine can (a client's change needs both).
    fn take_turn_after(
        &self,
        who: &str,
        lease: Duration,
        wait: Duration,
        after: u64,
        max: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>, EngineError> {
        self.take_turn(who, lease, wait)?;
        self.read_after(after, max)
    }

    /// Gives the write turn back (nothing if `who` does not hold it).
    fn give_turn(&self, who: &str) -> Result<(), EngineError>;

    /// Starts session `who`, to live `ttl` unless renewed.
    fn start_session(&self, who: &str, ttl: Duration) -> Result<(), EngineError>;

    /// `who` lives for `ttl` more (a heartbeat); `NoSession` if it ended or was evicted (it
    /// never comes back).
    fn heartbeat(&self, who: &str, ttl: Duration) -> Result<(), EngineError>;

    /// Sessions whose heartbeats stopped: their last one ran out.
    fn expired_sessions(&self) -> Result<Vec<String>, EngineError>;

    /// Forgets session `who` (after it was evicted from the memory servers).
    fn drop_session(&self, who: &str) -> Result<(), EngineError>;

    /// Makes the volume: stores its memory servers in their order (chunk maps name servers
    /// by it). False, storing nothing, when the volume exists already.
    fn create_volume(&self, servers: &[String]) -> Result<bool, EngineError>;

    /// The volume's memory servers in their order; none when this engine has no such volume.
    fn servers(&self) -> Result<Option<Vec<String>>, EngineError>;

    /// The names of the volumes this engine's store holds (to name them when a mount asks
    /// for one it does not).
    fn volumes(&self) -> Result<Vec<String>, EngineError>;

    /// Inode `ino`'s lock table as stored (empty: no locks).
    fn locks(&self, ino: u64) -> Result<Vec<u8>, EngineError>;

    /// Replaces inode `ino`'s lock table with `new` (empty: none) if it is still `old`, as
    /// session `who`: `NoSession` unless `who`'s session lives (started, not run out), so a
    /// client past its session's end can never take a lock; false if the table changed.
    fn swap_locks(&self, who: &str, ino: u64, old: &[u8], new: &[u8]) -> Result<bool, EngineError>;

    /// The inodes that have lock tables.
    fn locked_inodes(&self) -> Result<Vec<u64>, EngineError>;
}

/// Changes inode `ino`'s lock table by `change` as session `who`, atomically (compare and
/// swap, again while others change it); returns what `change` returned. `NoSession` once
/// `who`'s session has ended.
pub fn change_locks<R>(
    engine: &dyn MetaEngine,
    who: &str,
    ino: u64,
    mut change: impl FnMut(&mut LockTable) -> R,
) -> Result<R, EngineError> {
    loop {
        let old = engine.locks(ino)?;
        let mut table = LockTable::decode(&old).map_err(EngineError::Unavailable)?;
        let out = change(&mut table);
        let new = table.encode();
        // Swapped even when unchanged: the swap is what checks that `who`'s session lives
        // (a client evicted meanwhile must hear so, not that another holds the lock).
        if engine.swap_locks(who, ino, &old, &new)? {
            return Ok(out);
        }
    }
}

/// Drops every lock of session `gone` (evicted, or leaving), as session `who`.
pub fn drop_session_locks(
    engine: &dyn MetaEngine,
    who: &str,
    gone: &str,
) -> Result<(), EngineError> {
    for ino in engine.locked_inodes()? {
        change_locks(engine, who, ino, |t| t.release_session(gone))?;
    }
    Ok(())
}
