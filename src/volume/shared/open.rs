//! Files open on this client, marked in the engine, so that a file another client unlinks
//! stays readable and writable here until this client lets it go (JuiceFS's "sustained"
//! inodes, kept per session).
//!
//! How: a create marks the file it makes in its append, an open of an existing file marks it
//! before the open catches up (so an open that sees the file still named is marked before any
//! client can see it unnamed and drop it). A drop of a file another client marks is refused
//! by the engine (`Held`), and so is the release of its chunks, checked first: the inode
//! stays, unnamed, in every table. The client holding it drops it once its last handle is
//! closed; marks are taken off lazily (by the poller, a moment after the last close), and
//! inodes whose marks went are settled again then, after a catch-up, since another client's
//! drop may have been refused meanwhile. An evicted client's marks go with its session: the
//! evictor settles those inodes. An open that, caught up, finds the file unnamed and not open
//! here fails (ENOENT): it lost the race with the unlink.

use super::*;

/// A mark is taken off once the file has had no handle here for a poll and at least this
/// long: not in the moment between a create's append and its handle.
const MARK_LINGER: Duration = Duration::from_secs(1);

impl State {
    /// Marks `ino` open on this client unless it is already.
    pub(super) fn mark_open(&self, ino: Ino) -> Result<()> {
        if self.marked.lock().contains_key(&ino) {
            return Ok(());
        }
        self.engine.mark_open(&self.who, ino).map_err(engine_err)?;
        self.marked.lock().insert(ino, Instant::now());
        Ok(())
    }

    /// Files a change of this client made and opened (creates): marked by its append.
    pub(super) fn marked_by_append(&self, opened: &[Ino]) {
        let now = Instant::now();
        let mut m = self.marked.lock();
        for ino in opened {
            m.insert(*ino, now);
        }
    }

    /// Takes the marks off files with no handle here any more (and gone ones); their inodes
    /// are settled after the poll's catch-up ([`State::settle_let_go`]).
    pub(super) fn let_go_marks(&self, fs: &Fs) {
        let idle: Vec<Ino> = self
            .marked
            .lock()
            .iter()
            .filter(|(_, since)| since.elapsed() >= MARK_LINGER)
            .map(|(ino, _)| *ino)
            .collect();
        let unused: Vec<Ino> = idle.into_iter().filter(|&i| !fs.is_open_here(i)).collect();
        if unused.is_empty() {
            return;
        }
        match self.engine.unmark_open(&self.who, &unused) {
            Ok(()) => {
                let mut m = self.marked.lock();
                for ino in &unused {
                    m.remove(ino);
                }
                self.to_settle.lock().extend(unused);
            }
            Err(e) => log::warn!("shared volume: open marks stay until the next poll: {e}"),
        }
    }

    /// Settles the inodes whose marks went (this client's, or an evicted client's): a drop
    /// another client tried while they were marked fell to this client.
    pub(super) fn settle_let_go(&self, fs: &Fs) {
        let inos = std::mem::take(&mut *self.to_settle.lock());
        if inos.is_empty() {
            return;
        }
        // An inode a partial table does not hold would be settled as nothing: loaded first
        // (one the state no longer holds is gone already). Tried again next round if the
        // load fails.
        // As a request's load does (`in_request`): the kernel is told of what its catch-up
        // applies by the notifier thread, never while `catching` is held here (a request
        // holding a directory's lock the kernel's invalidation waits for may be waiting
        // for `catching`).
        if let Err(e) = self.load(fs, &[], &inos, true) {
            log::warn!(
                "shared volume: files let go settle next round: {}",
                e.message
            );
            self.to_settle.lock().extend(inos);
            return;
        }
        for ino in inos {
            fs.settle_unused(ino);
        }
    }
}
