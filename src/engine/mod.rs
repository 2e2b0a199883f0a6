//! Metadata engines: where a shared volume's namespace lives when many clients write it,
//! instead of one holder's journal in the memory servers.
//!
//! Why a trait, and why this one: rmemfs must run on an existing distributed engine (Redis
//! here; TiKV or FoundationDB elsewhere), not a home-made one, and the namespace's rules stay
//! in one place (`fs` over `meta`). So an engine keeps what the volume journal keeps, in the
//! same records (`meta::record`: batches of typed changes): one totally ordered log of the
//! namespace's changes, and a checkpoint that bounds it. The engine gives each change its
//! place (its LSN); clients do not wait for one another to append.
//!
//! How many clients change one namespace at once (shared format 2, optimistic): a client
//! decides a change against its own table, as any mount does, and appends it with what it
//! touches: each inode it changes or whose state its checks read, and the version of that
//! inode (the LSN of the last change that touched it) its table holds. The engine appends it
//! only if no touched inode changed since (a *conflict* otherwise: the client catches up and
//! decides again), so every change was decided on the state the log gives it at its place,
//! and changes of different directories and files never wait for each other. Changes a
//! client cannot decide again (a write, whose bytes are in the servers already) take the
//! file's **turn** first: while a client holds an inode's turn no other client appends a
//! change touching it. Sessions with heartbeats say which clients live; a client whose
//! heartbeats stopped is evicted from the memory servers (`server::share`) before anything it
//! held goes to another.
//!
//! What another engine needs (not built here: no server package on these machines):
//! - the log: TiKV or FoundationDB keep it as keys `log/<lsn>` (big-endian) and a `head` key,
//!   and the versions as keys `ver/<ino>`; an append is one transaction that reads the
//!   touched versions and turns, checks them, and writes `head`, the entry and the versions
//!   (FoundationDB's serializable transactions, or TiKV's optimistic ones); reading after an
//!   LSN is a range scan; trimming a range delete;
//! - turns: a key per turned inode holding the owner and an expiry, read in the append's
//!   transaction;
//! - sessions: a key per session with its expiry, scanned for the expired;
//! - the servers' order and the format: one key each, set if absent;
//! - inode numbers: one counter, added to in a transaction;
//! - locks: a key per locked inode holding its table ([`crate::meta::locks`]), replaced in a
//!   transaction that reads it and the caller's session (compare-and-swap).

#[cfg(any(test, feature = "testing"))]
pub mod mem;
pub mod redis;
pub mod state;

use crate::meta::locks::LockTable;
pub use state::{KeyOp, NamesPage, StateDump, StateLoad};
use std::time::Duration;

/// The shared-volume format this build speaks: 7, the namespace's state kept beside the log
/// ([`state`]: each append writes it, which a format-6 client would not, leaving it behind
/// the log). Format 6 trimmed versions
/// ([`MetaEngine::trim_versions`]: a key with no version kept reads as the versions' floor,
/// where a format-5 client reads it as never touched, and would take a change decided on a
/// table older than the floor), as this format does. Format 5 gave names keys of their own and let
/// directories be changed by many clients at once ([`Touch`]'s shared versions; a name added
/// or removed logged with a [`crate::meta::Change::DirStamp`] and no `readdir` cookie),
/// which a format-4 client can neither read nor check its changes against. Format 4 put
/// memory servers' births in the log ([`crate::meta::Change::Born`]: a server that restarted
/// empty is forgotten at one place in the history), as this format does. Format 3 marked files open on a
/// client in the engine (a drop of one refused while another client holds it, [`Marks`]),
/// as this format does. Format 2 had
/// the same records and parallel changes, but its clients drop a file another client has
/// open, so the two never write one volume at once. Format 1 (one write turn for every
/// change) had no format key. A volume of an older format is upgraded by the first client
/// of this build once no other client is live ([`MetaEngine::upgrade`]); a client of an
/// older build then refuses it, naming its format.
pub const SHARED_FORMAT: u32 = 7;

/// No session's heartbeat reached the engine for this long (clients beat every second,
/// `volume::shared::HEARTBEAT_EVERY`): the engine was away (restarted, failed over,
/// unreachable), not every client, so no session is judged expired on the clock of that
/// outage ([`MetaEngine::heartbeat`]). Half the session's lease (10 s), so an outage shorter
/// than that expires none either way.
pub const ENGINE_AWAY: Duration = Duration::from_secs(5);

/// What a format-1 client sees holding the old global write turn once a volume is upgraded
/// (it waits for that turn, then fails naming it).
pub const FORMAT_1_FENCE: &str = "a client of a newer shared format (this volume was \
     upgraded: mount it with an rmemfs that speaks its format)";

/// The URL schemes of the engines this build has (`--meta`).
pub const ENGINE_SCHEMES: &str = "redis://HOST[:PORT][/DB], rediss://HOST[:PORT][/DB] \
     (TLS) or redis+unix:///PATH[?db=DB] (Redis)";

/// The environment variable that names a PEM file of the certificate authority a
/// `rediss://` engine's certificate is checked against (unset: the system's roots).
pub const CA_VAR: &str = "RMEMFS_META_CA";

/// The environment variable a password for the engine may come in, so that it is not on the
/// command line (where `ps` shows it): put into a URL that names none.
pub const PASSWORD_VAR: &str = "RMEMFS_META_PASSWORD";

/// `url` as messages show it: a password in it replaced by `***`.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => {
            let user = rest[..at].split_once(':').map_or("", |(u, _)| u);
            format!("{scheme}://{user}:***@{}", &rest[at + 1..])
        }
        None => url.to_string(),
    }
}

/// `url` with `password` (from [`PASSWORD_VAR`]) when it names none.
pub fn with_password(url: &str, password: Option<String>) -> String {
    let Some(password) = password else {
        return url.to_string();
    };
    match url.split_once("://") {
        Some((scheme, rest)) if !rest[..rest.find('/').unwrap_or(rest.len())].contains('@') => {
            format!("{scheme}://:{password}@{rest}")
        }
        _ => url.to_string(),
    }
}

/// Opens the engine `url` names for volume `volume`: the scheme chooses it. Any other scheme
/// is refused, naming the ones there are. A password comes in the URL or in
/// [`PASSWORD_VAR`]; no message shows it. `rediss://` speaks TLS, the server's certificate
/// checked against the system's roots or the authority [`CA_VAR`] names.
pub fn open(url: &str, volume: &str) -> Result<crate::sync::Arc<dyn MetaEngine>, String> {
    let url = &with_password(url, std::env::var(PASSWORD_VAR).ok());
    let scheme = url.split_once("://").map(|(s, _)| s);
    match scheme {
        Some("redis" | "redis+unix" | "unix") => Ok(crate::sync::Arc::new(
            redis::RedisEngine::open(url, volume).map_err(|e| e.to_string())?,
        )),
        Some("rediss") => {
            let ca = match std::env::var_os(CA_VAR) {
                Some(path) => Some(std::fs::read(&path).map_err(|e| {
                    format!("{CA_VAR}={}: {e}", std::path::Path::new(&path).display())
                })?),
                None => None,
            };
            Ok(crate::sync::Arc::new(
                redis::RedisEngine::open_with_ca(url, volume, ca).map_err(|e| e.to_string())?,
            ))
        }
        _ => Err(format!(
            "--meta {}: no metadata engine for this URL; this rmemfs has {ENGINE_SCHEMES}",
            redacted(url)
        )),
    }
}

/// Why an engine could not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The engine is unreachable or failed (its message) while it ran a request: a change
    /// sent may have been taken.
    #[error("metadata engine: {0}")]
    Unavailable(String),
    /// The engine could not be reached (its message): the request was not sent, nothing was
    /// done.
    #[error("metadata engine: {0}")]
    Unreached(String),
    /// An append touching inode `key`, which change `lsn` changed after the version the
    /// appending client's table holds: decide the change again on a table caught up.
    #[error("metadata engine: inode {key} changed at change {lsn}, after this client's view")]
    Conflict { key: u64, lsn: u64 },
    /// An append touching inode `key`, whose turn another client (`holder`) holds.
    #[error("metadata engine: '{holder}' holds the turn of inode {key}")]
    Busy { key: u64, holder: String },
    /// An append, turn or heartbeat of a session that is not there (never started, or
    /// evicted).
    #[error("metadata engine: there is no session '{who}' (it ended or was evicted)")]
    NoSession { who: String },
    /// A drop of inode `key`, which another client (`holder`) has open: it stays until that
    /// client lets it go (and drops it then).
    #[error("metadata engine: inode {key} is open on '{holder}'")]
    Held { key: u64, holder: String },
    /// The volume has clients (their sessions live): it is not removed.
    #[error("metadata engine: the volume has clients mounted ({}): unmount them first", live.join(", "))]
    InUse { live: Vec<String> },
    /// A turn stayed with another client past the wait.
    #[error("metadata engine: the turn of inode {key} stayed with '{holder}' for {waited:?}")]
    TurnBusy {
        key: u64,
        holder: String,
        waited: Duration,
    },
    /// The volume's format is not this build's (`found`: none, an old volume with clients
    /// of the old format still live, named in `live`).
    #[error(
        "metadata engine: the shared volume is in format {found}, this rmemfs speaks format \
         {ours}{}",
        if live.is_empty() { String::new() } else {
            format!(" (clients of format {found} are mounted: {}; unmount them, then mount \
                     with this rmemfs to upgrade the volume)", live.join(", "))
        }
    )]
    Format {
        found: u32,
        ours: u32,
        live: Vec<String>,
    },
}

/// A checkpoint: every change through `lsn`, as one image (`meta::record` frames).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub lsn: u64,
    pub image: Vec<u8>,
}

/// A key a change touches, and the version of it (the LSN of the last change that touched
/// it) the appending client's table holds.
///
/// A key keeps two versions. An *exclusive* touch (the default) is refused if either is
/// newer than `seen`, and sets the exclusive one. A *shared* touch (`shared`: a change that
/// adds or removes one name in a directory, which commutes with another client's change of
/// another name there) is refused only if the exclusive version is newer, and sets the
/// shared one: changes of different names in one directory are appended at once, while a
/// change that reads the whole directory (its emptiness, its attributes) sees every one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Touch {
    pub key: u64,
    pub seen: u64,
    pub shared: bool,
}

impl Touch {
    /// An exclusive touch of `key` at version `seen`.
    pub fn exclusive(key: u64, seen: u64) -> Touch {
        Touch {
            key,
            seen,
            shared: false,
        }
    }

    /// A shared touch of `key` at version `seen`.
    pub fn shared(key: u64, seen: u64) -> Touch {
        Touch {
            key,
            seen,
            shared: true,
        }
    }
}

/// What a change's append marks and checks besides turns: the files it opens (a create's,
/// marked open by the appending client), the inodes it drops (refused while open
/// elsewhere), and the keys it reads without writing (`checked`: refused as a conflict if
/// a change after `seen` wrote one exclusively; a chunk's copy on a memory server reads that server's
/// birth, which only a birth writes: see `crate::meta::Change::Born`), and the change's
/// writes of the namespace's state ([`state`]), run in the same step as the append.
#[derive(Debug, Clone, Copy, Default)]
pub struct Marks<'a> {
    pub opened: &'a [u64],
    pub dropped: &'a [u64],
    pub checked: &'a [Touch],
    pub state: &'a [KeyOp],
}

/// An append the engine took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    /// The change's place in the log.
    pub lsn: u64,
    /// Inodes whose turn this client holds and another client asked for since it was taken:
    /// give them back once this change is done.
    pub wanted: Vec<u64>,
    /// The keys touched shared whose turn this client held: no other client changed them
    /// since it took or claimed the turn (its table then held them whole), so its table
    /// holds every change of them up to this one.
    pub held: Vec<u64>,
}

/// What a shared volume's metadata engine keeps for one volume (see the module doc).
pub trait MetaEngine: Send + Sync {
    /// Where, for messages (`redis://host:port/db`).
    fn describe(&self) -> String;

    /// The number of the log's last change (0: none yet).
    fn head(&self) -> Result<u64, EngineError>;

    /// Key `key`'s exclusive version (see [`Touch`]; 0: never touched; the versions' floor
    /// where none is kept, [`MetaEngine::trim_versions`]): what a lookup that found no name
    /// reads of the name's key, to know whether its table may lack it.
    fn version(&self, key: u64) -> Result<u64, EngineError>;

    /// Forgets the versions no change after `upto` set (never past the log's head): each such
    /// key, and every key with no version kept, reads as the versions' *floor* from then on,
    /// `upto` (or a higher floor set before). Reading a key as newer than its last change is
    /// safe: an append that saw it is taken all the same, one decided on a table older than
    /// the floor is refused as a conflict (its client catches up and decides again), and a
    /// take and a version read say the floor. Two exceptions read such a key as never
    /// touched: an append's touch of a key whose turn the appender holds (no other client
    /// changed it since the take, which caught the appender's table up with it: so the
    /// writes a client holds back under its turns go whatever the trim), and a key only
    /// checked ([`Marks::checked`]), which callers keep from trims (`kept`). So the versions
    /// kept are those of keys changed since the floor, not of every key ever touched. Keys
    /// from `kept` up keep their versions whatever they are (a memory server's births: a
    /// conflict on one tells its client that the server was born again). Returns how many
    /// versions it forgot.
    fn trim_versions(&self, upto: u64, kept: u64) -> Result<u64, EngineError>;

    /// Appends `record` as the log's next change, if `who`'s session lives and, for every
    /// inode touched, no other client holds its turn (`Busy`) and no change after `seen`
    /// touched it (`Conflict`), and no inode it drops is open on another client (`Held`).
    /// The turns of `claim` (inodes the change makes) become `who`'s for `lease`, and those
    /// of touched inodes `who` holds are renewed for `lease`; the files it opens are marked
    /// open by `who` ([`MetaEngine::mark_open`]).
    fn append(
        &self,
        who: &str,
        record: &[u8],
        touched: &[Touch],
        claim: &[u64],
        marks: Marks<'_>,
        lease: Duration,
    ) -> Result<Appended, EngineError>;

    /// Marks file `ino` open on `who` (`NoSession` unless its session lives): while it is, no
    /// other client's change drops it ([`MetaEngine::append`]), so a file unlinked elsewhere
    /// stays readable and writable here until this client lets it go.
    fn mark_open(&self, who: &str, ino: u64) -> Result<(), EngineError>;

    /// Takes `who`'s marks off `inos`.
    fn unmark_open(&self, who: &str, inos: &[u64]) -> Result<(), EngineError>;

    /// A client other than `who` that marks `ino` open, if any.
    fn open_elsewhere(&self, who: &str, ino: u64) -> Result<Option<String>, EngineError>;

    /// The inodes `who` marks open (an evicted client's, whose drops fall to the evictor).
    fn marked_by(&self, who: &str) -> Result<Vec<u64>, EngineError>;

    /// Changes after `after`, in order, at most `max` of them. Changes a checkpoint has
    /// trimmed are not there: a reader behind [`MetaEngine::checkpoint`]'s LSN reloads it.
    fn read_after(&self, after: u64, max: usize) -> Result<Vec<(u64, Vec<u8>)>, EngineError>;

    /// Stores `checkpoint` (unless a newer one is there) and trims the log up to `trim` (at
    /// most its LSN: the changes after it stay for clients that have not applied them).
    fn put_checkpoint(&self, checkpoint: &Checkpoint, trim: u64) -> Result<(), EngineError>;

    /// The newest checkpoint, if any.
    fn checkpoint(&self) -> Result<Option<Checkpoint>, EngineError>;

    /// The newest checkpoint's LSN, if any (without its image: a client due to write one
    /// first asks whether another client just did).
    fn checkpoint_lsn(&self) -> Result<Option<u64>, EngineError>;

    /// Takes inode `key`'s turn for `who` for `lease` (renews it if `who` holds it), waiting
    /// up to `wait` while another holds it (whose next append is told it is wanted). Returns
    /// the inode's newest version (exclusive or shared, see [`Touch`]): a client whose table
    /// holds an older one catches up first.
    fn take_turn(
        &self,
        who: &str,
        key: u64,
        lease: Duration,
        wait: Duration,
    ) -> Result<u64, EngineError>;

    /// Gives the turns of `keys` back (those `who` does not hold are left alone).
    fn give_turns(&self, who: &str, keys: &[u64]) -> Result<(), EngineError>;

    /// Waits up to `wait` until another client asks for a turn `who` holds (a take or an
    /// append refused as busy: each asks once until the turn changes hands), and returns
    /// the inodes asked for (none: the wait ran out). So a holder gives a turn back as soon
    /// as it is wanted, however long it would keep it otherwise.
    fn wanted(&self, who: &str, wait: Duration) -> Result<Vec<u64>, EngineError>;

    /// `n` inode numbers no other client is given: the first of them. Never below `floor`
    /// (a volume whose numbers were given out before the engine counted them).
    fn alloc_inos(&self, n: u64, floor: u64) -> Result<u64, EngineError>;

    /// The volume's format: none for a volume of format 1 (which kept none).
    fn format(&self) -> Result<Option<u32>, EngineError>;

    /// Makes a volume of an older format (none: format 1) one of [`SHARED_FORMAT`] (`Format`
    /// naming the live clients other than `who` if any: they may speak the old format), and
    /// fences older clients out ([`FORMAT_1_FENCE`], and the servers' format line). Nothing
    /// if it is in this format (or a newer one) already.
    fn upgrade(&self, who: &str) -> Result<(), EngineError>;

    /// Starts session `who`, to live `ttl` unless renewed.
    fn start_session(&self, who: &str, ttl: Duration) -> Result<(), EngineError>;

    /// `who` lives for `ttl` more (a heartbeat); `NoSession` if it ended, was evicted or ran
    /// out (an expired session is never renewed: another client may be evicting it). When no
    /// session's heartbeat reached the engine for [`ENGINE_AWAY`], the engine was away, not
    /// the clients: every session is renewed for `ttl` first.
    fn heartbeat(&self, who: &str, ttl: Duration) -> Result<(), EngineError>;

    /// Sessions whose heartbeats stopped: their last one ran out. None while no heartbeat
    /// has reached the engine for [`ENGINE_AWAY`] (it was away: the clients' next heartbeats
    /// renew their sessions).
    fn expired_sessions(&self) -> Result<Vec<String>, EngineError>;

    /// Forgets session `who` (after it was evicted from the memory servers), with its marks
    /// of open files.
    fn drop_session(&self, who: &str) -> Result<(), EngineError>;

    /// Makes the volume, in [`SHARED_FORMAT`]: stores its memory servers in their order
    /// (chunk maps name servers by it). False, storing nothing, when the volume exists
    /// already.
    fn create_volume(&self, servers: &[String]) -> Result<bool, EngineError>;

    /// The volume's memory servers in their order; none when this engine has no such volume.
    fn servers(&self) -> Result<Option<Vec<String>>, EngineError>;

    /// Removes the volume: every key of it (`InUse`, removing nothing, while a client's
    /// session lives).
    fn remove_volume(&self) -> Result<(), EngineError>;

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

    /// Every hash of the namespace's state beside the log ([`state`]), as of one moment.
    fn state(&self) -> Result<StateDump, EngineError>;

    /// Runs `ops` on the state if the log's head is still `at` (false, writing nothing, if
    /// it moved): a table's image as of change `at`, written a part at a time by a client
    /// that found the state not whole (a volume upgraded from format 6). With `whole`, the
    /// state is marked whole after them.
    fn put_state(&self, at: u64, ops: &[KeyOp], whole: bool) -> Result<bool, EngineError>;

    /// The parts of the state a client loads ([`state::load`]: the names of `dirs`, and each
    /// inode they name and each of `inodes`, with the servers' births), as of one moment,
    /// and the log's head then: the state is that change's. A directory of more than
    /// `names_at_most` names is left out, named in the answer's `too_big` (one step holds
    /// the engine alone: a directory of a million names would hold it for seconds); its
    /// names are read a page at a time ([`MetaEngine::names_page`]).
    fn load_state(
        &self,
        dirs: &[u64],
        inodes: &[u64],
        names_at_most: u64,
    ) -> Result<StateLoad, EngineError>;

    /// About `count` of directory `dir`'s names from `cursor` (0: the first page), with the
    /// log's head, of one moment ([`NamesPage`]). A name the directory holds from the first
    /// page to the last is in one of them; one that came or went meanwhile may be or not (the
    /// log says which: `HSCAN`'s promise). A page may repeat names of an earlier one.
    fn names_page(&self, dir: u64, cursor: u64, count: u64) -> Result<NamesPage, EngineError>;

    /// Every inode the state holds (its hashes, [`state::INODE`]): a client that loaded every
    /// directory's names looks here for the inodes no name leads to (open on some client
    /// after their last name went).
    fn state_inodes(&self) -> Result<Vec<u64>, EngineError>;

    /// Whether the state is whole: made with the volume, or written whole since
    /// ([`MetaEngine::put_state`]). Appends keep it whole.
    fn state_whole(&self) -> Result<bool, EngineError>;

    /// Notes how many inodes the namespace holds, as a client holding the whole table counts
    /// them: the clients that hold part of it read here whether the volume is large
    /// (`volume::shared::keeper`).
    fn note_inodes(&self, n: u64) -> Result<(), EngineError>;

    /// The count last noted ([`MetaEngine::note_inodes`]); none before any.
    fn noted_inodes(&self) -> Result<Option<u64>, EngineError>;

    /// Notes that evicted session `who` left memory to collect, for the large volume's
    /// keeper (`volume::shared::keeper`): the client that evicted it holds part of the
    /// namespace, and what no change names is read from the whole table.
    fn owe_collection(&self, who: &str) -> Result<(), EngineError>;

    /// The evicted sessions whose memory is owed ([`MetaEngine::owe_collection`]).
    fn owed_collections(&self) -> Result<Vec<String>, EngineError>;

    /// `who`'s memory was collected: no longer owed.
    fn collected(&self, who: &str) -> Result<(), EngineError>;
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
