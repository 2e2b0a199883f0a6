//! A client that loads the namespace as it is used (shared format 7): its join reads the
//! root's names from the engine's state and serves at once; a lookup, a listing or a change
//! of what its table does not hold loads it ([`crate::fs::Turns::load`]); the poller loads
//! the rest, a batch of directories a round, then the inodes no name leads to, until the
//! table is whole. What reads the table whole (a checkpoint, the rebuild, the collection of
//! what an evicted client left) waits for that.
//!
//! Why it is sound: a load reads the state and the log's head in one step (the state is the
//! log's up to that head), brings the table to that head first (applying, of other clients'
//! changes, those of what it holds: [`crate::meta::Meta::held_changes`]), and only then
//! installs what it read. So the table is of one change throughout, and a change this
//! client appends touches versions its table saw. Nothing is decided on a directory whose
//! names are not held (the file system's reads of names load them; the append refuses
//! such a change as a net under them).

use super::*;

/// Directories whose names the poller loads in one step (one script in the engine, which
/// runs alone there); their inodes ride along, one call each. Four directories of a
/// thousand names read in a few milliseconds of Redis's time, so other clients' changes
/// wait little behind one (a directory of a million names is one long step: not split).
const LOAD_BATCH: usize = 4;

/// Directories the poller loads per round at most: the rest waits for the next round, so
/// that a round also catches up, beats and settles.
const LOAD_ROUND: usize = 4096;

impl State {
    /// Loads `dirs` (their names, and the inodes they name) and `inodes` into a partial
    /// table, as of the engine's head, the table first caught up to it (under `catching`).
    pub(super) fn load(
        &self,
        fs: &Fs,
        dirs: &[Ino],
        inodes: &[Ino],
        in_request: bool,
    ) -> Result<()> {
        let _one = self.catching.lock();
        self.load_alone(fs, dirs, inodes, in_request)
    }

    /// [`State::load`], the caller holding `catching`.
    fn load_alone(&self, fs: &Fs, dirs: &[Ino], inodes: &[Ino], in_request: bool) -> Result<()> {
        if self.whole.load(Ordering::SeqCst) {
            return Ok(());
        }
        // What another load brought meanwhile (the poller's, a request's) is not read again.
        let (dirs, inodes): (Vec<Ino>, Vec<Ino>) = fs.inspect_meta(|m| {
            (
                dirs.iter()
                    .copied()
                    .filter(|d| !m.holds_whole(*d))
                    .collect(),
                inodes
                    .iter()
                    .copied()
                    .filter(|i| m.get(*i).is_none())
                    .collect(),
            )
        });
        if dirs.is_empty() && inodes.is_empty() {
            return Ok(());
        }
        let (dirs, inodes) = (&dirs[..], &inodes[..]);
        let (head, dump) = self.engine.load_state(dirs, inodes).map_err(engine_err)?;
        self.catch_up_through(fs, in_request, head)?;
        let loaded = state::changes_of(&dump)?;
        fs.install_loaded(dirs, &[], loaded)
    }

    /// Loads what a request found missing: inode `ino`, and its names if a directory.
    pub(super) fn load_for_request(&self, fs: &Fs, ino: Ino) -> Result<()> {
        self.load(fs, &[ino], &[ino], true)
    }

    /// The poller's share: up to [`LOAD_ROUND`] directories' names, then, once every
    /// directory's names are held, the inodes the state holds that no name leads to (files
    /// open on some client after their last name went), and the table is whole.
    pub(super) fn load_more(&self, fs: &Fs) -> Result<()> {
        if self.whole.load(Ordering::SeqCst) {
            return Ok(());
        }
        let mut budget = LOAD_ROUND;
        loop {
            let dirs = fs.inspect_meta(|m| m.unloaded_dirs(LOAD_BATCH.min(budget)));
            if dirs.is_empty() {
                break;
            }
            if budget == 0 {
                return Ok(());
            }
            budget = budget.saturating_sub(dirs.len());
            self.load(fs, &dirs, &[], true)?;
        }
        // Listed before `catching` is taken (a scan of Redis's keys, long in a large one,
        // must not hold catch-ups back): an inode made after the listing is applied by the
        // catch-ups, every make being kept once every directory's names are held.
        let listed = self.engine.state_inodes().map_err(engine_err)?;
        let _one = self.catching.lock();
        let held: std::collections::HashSet<Ino> = fs.inspect_meta(|m| m.inos().collect());
        let unnamed: Vec<Ino> = listed.into_iter().filter(|i| !held.contains(i)).collect();
        if !unnamed.is_empty() {
            self.load_alone(fs, &[], &unnamed, true)?;
        }
        if fs.finish_partial() {
            self.whole.store(true, Ordering::SeqCst);
            log::info!(
                "shared volume: the whole namespace is loaded ({} inodes)",
                fs.inode_count()
            );
        }
        Ok(())
    }

    /// Loads the rest of the namespace now, as the poller does over its rounds.
    pub(super) fn load_whole(&self, fs: &Fs) -> Result<()> {
        while !self.is_whole() {
            self.load_more(fs)?;
        }
        Ok(())
    }

    /// Whether this client's table holds the whole namespace (what reads it whole waits).
    pub(super) fn is_whole(&self) -> bool {
        self.whole.load(Ordering::SeqCst)
    }
}
