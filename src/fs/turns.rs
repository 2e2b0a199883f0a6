//! A shared volume's changes ([`crate::volume::shared`]): many clients change one namespace
//! at once, each deciding its changes on its own table.
//!
//! Two kinds of change, because of what a change can do again. A namespace change (a
//! create, a rename, an unlink, an xattr) has no effect outside its batch until the engine
//! takes it, so it runs optimistically: decided here, appended with what it touched, and
//! decided again on a table caught up when the engine says another client changed one of
//! those inodes first ([`Fs::changing`]). A change of a file's data (a write, a truncate)
//! has put bytes in the memory servers before its batch is appended, so it cannot be decided
//! again: it takes the file's turn first ([`Fs::file_turn`]), which no other client's
//! change of that file passes while it is held.

use super::Fs;
use crate::error::{Error, Result};
use crate::meta::Ino;
use std::time::{Duration, Instant};

/// How long one change may go on losing to others (or waiting for a turn) before it fails
/// (EIO): a turn held by a frozen client runs out within seconds, so this is well past it.
pub const CHANGE_WAIT: Duration = Duration::from_secs(30);

/// The turns a change that lost on `lost` holds next, in inode order (so that two clients
/// never wait for each other's), and whether those it holds (`held`) must be given back first
/// to be taken again in that order.
pub fn turns_in_order(held: &[Ino], lost: Ino) -> (bool, Vec<Ino>) {
    let mut keys = held.to_vec();
    keys.push(lost);
    keys.sort_unstable();
    (keys.last() != Some(&lost), keys)
}

/// A turn held for a change: given back (or left to linger) when dropped.
pub type HeldTurn = Box<dyn std::any::Any + Send>;

/// What runs once the kernel was told what to forget ([`Turns::tell_kernel_then`]): whether
/// it was.
pub type KernelTold = Box<dyn FnOnce(bool) + Send>;

/// What a shared volume's client gives the file system ([`crate::volume::shared`]).
pub trait Turns: Send + Sync {
    /// Before a namespace change is decided: inode numbers at hand for what it makes.
    fn prepare(&self, fs: &Fs) -> Result<()>;

    /// Takes inode `ino`'s turn and brings the table up to date with it; held until the
    /// result is dropped. While held, no other client's change touching `ino` is appended.
    fn take(&self, fs: &Fs, ino: Ino) -> Result<HeldTurn>;

    /// Waits until no other client holds inode `ino`'s turn and brings the table up to date
    /// with it, holding nothing after: a change that lost on a directory it shares with
    /// other clients (adding a name there) runs again beside theirs, not in turn with them.
    fn pass(&self, fs: &Fs, ino: Ino) -> Result<()>;

    /// Whether this client holds inode `ino`'s turn (its table's view of `ino` is then the
    /// engine's: no other client's change of it can land meanwhile).
    fn holds(&self, ino: Ino) -> bool;

    /// Brings the table up to date (a lookup that found nothing, an open, a change decided
    /// on a stale table): [`Turns::catch_up`] tried once; a failure is logged and the table
    /// stays as it was.
    fn refresh(&self, fs: &Fs) {
        if let Err(e) = self.catch_up(fs, Duration::ZERO) {
            log::warn!("catching up with the engine: {}", e.message);
        }
    }

    /// A lookup of `name` in directory `dir` found nothing: brings the table up to date
    /// with that name ([`Turns::refresh`]), unless the engine says no change touched the
    /// name since this table's view of it (then nothing is read: the table's answer is the
    /// engine's now).
    fn refresh_name(&self, fs: &Fs, dir: Ino, name: &[u8]);

    /// Brings the table up to date, trying again for up to `patience` while the engine
    /// cannot be read; fails at once if this client stopped (its table no longer the
    /// engine's history).
    fn catch_up(&self, fs: &Fs, patience: Duration) -> Result<()>;

    /// Before an open of file `ino` catches up: marks it open on this client, so that no
    /// other client drops it while it is (it stays readable here after an unlink there).
    fn opening(&self, ino: Ino) -> Result<()>;

    /// Whether another client has file `ino` open (its data must stay when it has no name
    /// and no handle here).
    fn open_elsewhere(&self, ino: Ino) -> Result<bool>;

    /// Server `server` came back empty (its session there is new): its birth is put in the
    /// history and the table caught up with it, so the copies listed there before are
    /// forgotten on every client ([`crate::meta::Change::Born`]). Only then is it used.
    fn server_reborn(&self, fs: &Fs, server: u32) -> Result<()>;

    /// Whether this client is the volume's rebuilder now: one member at a time makes copies
    /// again (taken, or renewed, through the engine without waiting; false while another
    /// holds it).
    fn rebuild_role(&self) -> bool;

    /// Loads the rest of a partial table now (what reads every file's chunk map: a server
    /// back behind or with new keys), waiting until it is whole.
    fn load_whole(&self, fs: &Fs) -> Result<()>;

    /// Loads what a partial table lacks ([`crate::error::Error::unloaded`]): inode `ino`,
    /// or, held, its names (a directory), as of the engine's head, the table caught up to it.
    fn load(&self, fs: &Fs, ino: Ino) -> Result<()>;

    /// Appends every write's changes held back so far ([`crate::meta::Journal::record_write`]):
    /// `fsync`, a close, and anything that must see them in the engine first.
    fn send_writes(&self) -> Result<()>;

    /// Tells the kernel everything it must forget from the catch-ups so far (a file lock
    /// granted: [`Fs::set_lock`] caught up first), then runs `then` (false: it could not be
    /// told), on the thread that tells it: the caller does not wait, since that thread may
    /// wait for a directory lock that a request (perhaps one queued behind the caller's on a
    /// FUSE ring) holds.
    fn tell_kernel_then(&self, then: KernelTold);
}

impl Fs {
    /// Runs namespace change `op` (which must change nothing outside its batch, so that it
    /// can run again). On a shared volume, until the engine takes it: when another client
    /// changed an inode it touched, the table catches up, that inode's turn is taken (so the
    /// next try cannot lose on it again; a directory it only adds or removes a name in is
    /// passed instead, [`Turns::pass`]) and `op` runs again; a failure decided on a table not
    /// caught up is decided again on one that is (a name another client just made or
    /// removed), so no answer rests on a view older than the request.
    pub(super) fn changing<T>(&self, mut op: impl FnMut() -> Result<T>) -> Result<T> {
        let Some(turns) = self.turns.as_deref() else {
            return op();
        };
        let deadline = Instant::now() + CHANGE_WAIT;
        let mut fresh = false;
        // Turns taken after conflicts, in inode order (so that two clients never wait for
        // each other's).
        let mut held: Vec<(Ino, HeldTurn)> = Vec::new();
        let mut loaded = None;
        loop {
            turns.prepare(self)?;
            let e = match op() {
                Ok(v) => return Ok(v),
                // A drop refused for a file open on another client: no catch-up changes
                // that, the caller decides what goes instead ([`Fs::removing`]).
                Err(e) if e.held_elsewhere.is_some() => return Err(e),
                // What a partial table lacks: loaded, the change is decided again.
                Err(e) if e.unloaded.is_some() => {
                    loaded = Some(self.load_unloaded(turns, e, loaded)?);
                    continue;
                }
                // A catch-up after it may unload what was loaded (another client's name put
                // there): loaded again then.
                Err(e) => {
                    loaded = None;
                    e
                }
            };
            match e.conflict {
                Some(_) if Instant::now() >= deadline => {
                    return Err(Error::new(
                        libc::EIO,
                        format!("a change lost to other clients for {CHANGE_WAIT:?}: {e}"),
                    ))
                }
                // A directory this change adds a name to, as others may at once: caught up
                // once no other client holds its turn, and run again beside theirs. Turns
                // held go back first (nothing is held while waiting for another's).
                Some(ino) if e.conflict_shared => {
                    held.clear();
                    turns.pass(self, ino)?;
                }
                // Taking the turn catches the table up with the inode.
                Some(ino) if !held.iter().any(|(i, _)| *i == ino) => {
                    let held_inos: Vec<Ino> = held.iter().map(|(i, _)| *i).collect();
                    let (again, keys) = turns_in_order(&held_inos, ino);
                    if again {
                        held.clear(); // given back, to be taken again in order
                    }
                    for key in keys {
                        if !held.iter().any(|(i, _)| *i == key) {
                            held.push((key, turns.take(self, key)?));
                        }
                    }
                }
                // Lost on a turn held (its table was behind on another inode): caught up.
                Some(_) => turns.refresh(self),
                None if !fresh => {
                    turns.refresh(self);
                    fresh = true;
                }
                None => return Err(e),
            }
        }
    }

    /// Runs `op` (a read of names: a lookup, a listing) until what it needs of a partial
    /// table is held: each [`Error::unloaded`] loaded, then `op` again.
    pub(super) fn loading<T>(&self, mut op: impl FnMut() -> Result<T>) -> Result<T> {
        let mut loaded = None;
        loop {
            match (op(), self.turns.as_deref()) {
                (Err(e), Some(turns)) if e.unloaded.is_some() => {
                    loaded = Some(self.load_unloaded(turns, e, loaded)?);
                }
                (r, _) => return r,
            }
        }
    }

    /// Loads what `e` says the table lacks; ENOENT if it is what the last load (`last`)
    /// loaded: the engine's state does not hold it either (gone meanwhile).
    fn load_unloaded(&self, turns: &dyn Turns, e: Error, last: Option<Ino>) -> Result<Ino> {
        let ino = e.unloaded.expect("an unloaded error");
        if last == Some(ino) {
            return Err(Error::new(libc::ENOENT, e.message));
        }
        turns.load(self, ino)?;
        Ok(ino)
    }

    /// On a shared volume whose client holds part of the namespace, loads the rest now
    /// ([`Turns::load_whole`]); nothing elsewhere.
    pub fn load_whole_shared(&self) -> Result<()> {
        self.turns.as_deref().map_or(Ok(()), |t| t.load_whole(self))
    }

    /// On a shared volume, inode `ino`'s turn for a change of its data (see the module doc);
    /// none elsewhere.
    pub(super) fn file_turn(&self, ino: Ino) -> Result<Option<HeldTurn>> {
        self.turns.as_ref().map(|t| t.take(self, ino)).transpose()
    }

    /// Takes file `ino`'s turn on a shared volume (none elsewhere), catching up with it: no
    /// other client changes the file while it is held (the rebuild's copy of a chunk).
    pub fn take_file_turn(&self, ino: Ino) -> Result<Option<HeldTurn>> {
        self.file_turn(ino)
    }

    /// On a shared volume, puts the birth of server `server` (back empty) in the history
    /// ([`Turns::server_reborn`]); none elsewhere (the caller forgets the copies there).
    pub fn server_reborn(&self, server: crate::fabric::ServerId) -> Option<Result<()>> {
        self.turns.as_ref().map(|t| t.server_reborn(self, server.0))
    }

    /// Whether this mount makes copies again now: always, but on a shared volume only its
    /// rebuilder ([`Turns::rebuild_role`]).
    pub fn may_rebuild(&self) -> bool {
        self.turns.as_ref().is_none_or(|t| t.rebuild_role())
    }

    /// New inodes take their numbers from `given` (a shared volume's engine gave them).
    pub fn give_inos(&self, given: std::ops::Range<Ino>) {
        self.meta.lock().give_inos(given);
    }

    /// How many given inode numbers are left, and the number the table would give next by
    /// itself (see [`crate::meta::Meta::inos_left`]).
    pub fn inos_left(&self) -> (u64, Ino) {
        let meta = self.meta.lock();
        (meta.inos_left(), meta.next_ino())
    }

    /// Whether this client holds `ino`'s turn on a shared volume (the table's view of it is
    /// the engine's: no other client's change of it can land meanwhile).
    pub fn holds_turn(&self, ino: Ino) -> bool {
        self.turns.as_ref().is_some_and(|t| t.holds(ino))
    }

    /// On a shared volume, brings the table up to date with name `name` of directory `dir`
    /// ([`Turns::refresh_name`]); false (nothing done) elsewhere.
    pub fn refresh_shared_name(&self, dir: Ino, name: &[u8]) -> bool {
        self.turns
            .as_deref()
            .map(|t| t.refresh_name(self, dir, name))
            .is_some()
    }

    /// On a shared volume, brings the table up to date; false (nothing done) elsewhere.
    pub fn refresh_shared(&self) -> bool {
        self.turns.as_deref().map(|t| t.refresh(self)).is_some()
    }

    /// On a shared volume, brings the table up to date, trying again for up to
    /// [`CHANGE_WAIT`] while the engine cannot be read (for what must not rest on a stale
    /// view: a lock taken). Nothing elsewhere.
    pub fn catch_up_shared(&self) -> Result<()> {
        self.turns
            .as_deref()
            .map_or(Ok(()), |t| t.catch_up(self, CHANGE_WAIT))
    }

    /// On a shared volume, sends the writes held back ([`Turns::send_writes`]): a close
    /// answered after them is seen by every client that opens the file next (close-to-open,
    /// as NFS and JuiceFS give). Nothing elsewhere.
    pub fn send_shared_writes(&self) -> Result<()> {
        self.turns.as_ref().map_or(Ok(()), |t| t.send_writes())
    }

    /// Whether this is a shared volume's client (many writers, see [`Turns`]).
    pub fn is_shared(&self) -> bool {
        self.turns.as_ref().is_some()
    }

    /// On a shared volume, see [`Turns::tell_kernel_then`]; elsewhere `then(true)` at once
    /// (nothing to tell).
    pub fn tell_kernel_then(&self, then: KernelTold) {
        match self.turns.as_ref() {
            Some(t) => t.tell_kernel_then(then),
            None => then(true),
        }
    }
}
