//! A client that loads the namespace as it is used (shared format 7): its join reads the
//! root's names from the engine's state and serves at once; a lookup, a listing or a change
//! of what its table does not hold loads it ([`crate::fs::Turns::load`]); where the client
//! is to hold the whole namespace ([`keeper`]), the poller loads the rest, a batch of
//! directories a round, then the inodes no name leads to, until the table is whole. What
//! reads the table whole (a checkpoint, the rebuild, the collection of what an evicted
//! client left) waits for that.
//!
//! Why it is sound: a load reads the state and the log's head in one step (the state is the
//! log's up to that head), brings the table to that head first (applying, of other clients'
//! changes, those of what it holds: [`crate::meta::Meta::held_changes`]), and only then
//! installs what it read. So the table is of one change throughout, and a change this
//! client appends touches versions its table saw. Nothing is decided on a directory whose
//! names are not held (the file system's reads of names load them; the append refuses
//! such a change as a net under them).

use super::*;
use std::collections::BTreeMap;

/// A directory's names, each to the inode it leads to.
type Names = BTreeMap<Vec<u8>, Ino>;

/// Directories whose names the poller loads in one step (one script in the engine, which
/// runs alone there); their inodes ride along, one call each. Four directories of a
/// thousand names read in a few milliseconds of Redis's time, so other clients' changes
/// wait little behind one (a directory of a million names is one long step: not split).
const LOAD_BATCH: usize = 4;

/// Directories the poller loads per round at most: the rest waits for the next round, so
/// that a round also catches up, beats and settles.
const LOAD_ROUND: usize = 4096;

/// A directory of more names than this is read a page at a time
/// ([`State::load_names_paged`]), not in a load's one script: the engine runs a script
/// alone, and a name with its inode costs Redis about 4 µs, so 10,000 names hold every
/// other client back some 40 ms; a million would hold them for seconds (and past 5 s Redis
/// answers everyone else BUSY).
pub(super) const NAMES_IN_ONE_LOAD: u64 = 10_000;

/// Names one page reads (a few milliseconds of Redis's time, with their inodes after).
const NAMES_PAGE: u64 = 1_000;

/// Inodes a paged directory's names lead to, loaded per step (as many milliseconds).
const INODES_PER_LOAD: usize = 1_000;

/// Times a directory's names are paged again after the log was trimmed past the first page
/// (a checkpoint meanwhile), or a name led to no inode, before one script reads them
/// however long it takes.
const PAGED_TRIES: usize = 3;

/// A partial table holding the root and its names (the inodes they lead to) as of the
/// engine's head, and that head. A root of more names than one step reads stays unloaded:
/// its first use pages them ([`State::load`]).
pub(super) fn join_partial(
    engine: &dyn MetaEngine,
    config: &FsConfig,
) -> std::result::Result<(Meta, u64), String> {
    let root = crate::meta::ROOT_INO;
    let load = engine
        .load_state(&[root], &[root], NAMES_IN_ONE_LOAD)
        .map_err(|e| e.to_string())?;
    let loaded = state::changes_of(&load.dump).map_err(|e| e.message)?;
    let mut meta = Meta::new_shared(0o755, config.root_uid, config.root_gid);
    meta.start_partial();
    let names: &[Ino] = if load.too_big.is_empty() {
        &[root]
    } else {
        &[]
    };
    meta.install(names, &[root], loaded)
        .map_err(|e| format!("the engine's state: {}", e.message))?;
    Ok((meta, load.head))
}

/// What the log said of a directory whose names were read a page at a time.
enum Patched {
    /// Its name changes up to the head asked for are applied.
    Applied,
    /// It went (dropped): nothing to load.
    Dropped,
    /// The log no longer holds every change since the first page.
    Trimmed,
}

/// Which of `inos` the table does not hold, once each.
fn not_held(fs: &Fs, mut inos: Vec<Ino>) -> Vec<Ino> {
    inos.sort_unstable();
    inos.dedup();
    fs.inspect_meta(|m| inos.retain(|i| m.get(*i).is_none()));
    inos
}

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
        let too_big = {
            let _one = self.catching.lock();
            self.load_alone(fs, dirs, inodes, in_request)?
        };
        for dir in too_big {
            self.load_names_paged(fs, dir, in_request)?;
        }
        Ok(())
    }

    /// [`State::load`], the caller holding `catching`, but for the directories of more names
    /// than one step reads: those are returned, their names not loaded.
    fn load_alone(
        &self,
        fs: &Fs,
        dirs: &[Ino],
        inodes: &[Ino],
        in_request: bool,
    ) -> Result<Vec<Ino>> {
        if self.whole.load(Ordering::SeqCst) {
            return Ok(Vec::new());
        }
        // What another load brought meanwhile (the poller's, a request's) is not read again.
        let dirs: Vec<Ino> = fs.inspect_meta(|m| {
            dirs.iter()
                .copied()
                .filter(|d| !m.holds_whole(*d))
                .collect()
        });
        let inodes = not_held(fs, inodes.to_vec());
        if dirs.is_empty() && inodes.is_empty() {
            return Ok(Vec::new());
        }
        let most = self.names_in_one_load.load(Ordering::SeqCst);
        self.load_step(fs, &dirs, &inodes, in_request, most)
    }

    /// One step of a load, the caller holding `catching`: `dirs` (those of at most `most`
    /// names) and `inodes` read as of the engine's head, the table caught up to it, then
    /// what was read installed. Returns the directories left out.
    fn load_step(
        &self,
        fs: &Fs,
        dirs: &[Ino],
        inodes: &[Ino],
        in_request: bool,
        most: u64,
    ) -> Result<Vec<Ino>> {
        let load = self
            .engine
            .load_state(dirs, inodes, most)
            .map_err(engine_err)?;
        self.catch_up_through(fs, in_request, load.head)?;
        let loaded = state::changes_of(&load.dump)?;
        let whole: Vec<Ino> = dirs
            .iter()
            .copied()
            .filter(|d| !load.too_big.contains(d))
            .collect();
        fs.install_loaded(&whole, &[], loaded)?;
        Ok(load.too_big)
    }

    /// Loads directory `dir`'s names a page at a time (more than one step reads):
    /// - the pages (`HSCAN`: a name the directory held from the first page to the last is
    ///   in them; one that came or went meanwhile may be or not);
    /// - the inodes they lead to, a batch a step, each as of its own head (the table
    ///   caught up to it first, as every load);
    /// - then, holding `catching`: the directory's name changes in the log from the first
    ///   page's moment to the head now, applied to the names read, in the log's order (a
    ///   name's last change there decides it; one unchanged is as the pages read it); the
    ///   inodes of names so added loaded, the log after them applied again, until none is
    ///   missing; the table brought to that head, and the names installed as of it.
    ///
    /// Names changing meanwhile cost the few changes read from the log, not a new pass.
    /// Read again if the log was trimmed past the first page (a checkpoint); after
    /// [`PAGED_TRIES`], in one step however long it takes.
    fn load_names_paged(&self, fs: &Fs, dir: Ino, in_request: bool) -> Result<()> {
        let most = self.names_in_one_load.load(Ordering::SeqCst).max(1);
        let batch = INODES_PER_LOAD.min(most as usize);
        for _ in 0..PAGED_TRIES {
            let (mut at, mut names) = self.read_names(dir, most)?;
            let named: Vec<Ino> = names.values().copied().collect();
            for part in not_held(fs, named).chunks(batch) {
                let _one = self.catching.lock();
                self.load_alone(fs, &[], part, in_request)?;
            }
            let _one = self.catching.lock();
            // Inodes loaded here and still missing: the state lacks them. Once one is missing
            // again after the log was read past its load, its name leads nowhere (a state
            // not whole?): the one step below reads the directory as it is.
            let mut tried = std::collections::HashSet::new();
            loop {
                if self.whole.load(Ordering::SeqCst) || fs.inspect_meta(|m| m.holds_whole(dir)) {
                    return Ok(()); // loaded meanwhile
                }
                let head = self.engine.head().map_err(engine_err)?;
                match self.name_changes(dir, at, head, &mut names)? {
                    Patched::Trimmed => break,
                    Patched::Dropped => return Ok(()),
                    Patched::Applied => at = head,
                }
                let missing = not_held(fs, names.values().copied().collect());
                if missing.is_empty() {
                    self.catch_up_through(fs, in_request, head)?;
                    let changes = names
                        .into_iter()
                        .map(|(name, ino)| Change::Entry {
                            dir,
                            name: name.into(),
                            ino: Some(ino),
                        })
                        .collect();
                    let loaded = crate::meta::Loaded {
                        changes,
                        placed: Vec::new(),
                    };
                    return fs.install_loaded(&[dir], &[], loaded);
                }
                if missing.iter().any(|i| tried.contains(i)) {
                    break;
                }
                for part in missing.chunks(batch) {
                    self.load_alone(fs, &[], part, in_request)?;
                }
                tried.extend(missing);
            }
        }
        log::warn!(
            "shared volume: directory {dir}'s names could not be read a page at a time (the \
             log trimmed meanwhile, or a name leading to no inode); read in one step"
        );
        let _one = self.catching.lock();
        self.load_step(fs, &[dir], &[], in_request, u64::MAX)
            .map(|_| ())
    }

    /// Directory `dir`'s names, pages of at most `most` names, and the log's head at the
    /// first page.
    fn read_names(&self, dir: Ino, most: u64) -> Result<(u64, Names)> {
        let mut names = Names::new();
        let (mut cursor, mut from) = (0, None);
        loop {
            let page = self
                .engine
                .names_page(dir, cursor, NAMES_PAGE.min(most))
                .map_err(engine_err)?;
            let from = *from.get_or_insert(page.head);
            names.extend(page.names);
            if page.next == 0 {
                return Ok((from, names));
            }
            cursor = page.next;
        }
    }

    /// Applies to `names` the log's changes of directory `dir`'s names after change `after`,
    /// up to `through`, in order.
    fn name_changes(
        &self,
        dir: Ino,
        after: u64,
        through: u64,
        names: &mut Names,
    ) -> Result<Patched> {
        let mut at = after;
        while at < through {
            let got = self.engine.read_after(at, READ_BATCH).map_err(engine_err)?;
            if got.first().is_none_or(|(first, _)| *first != at + 1) {
                // Trimmed past `at` (or the log lost its last changes: the catch-up says).
                return Ok(Patched::Trimmed);
            }
            for (lsn, bytes) in got.iter().take_while(|(lsn, _)| *lsn <= through) {
                for c in super::catchup::entry_changes(*lsn, bytes)? {
                    match c {
                        Change::Entry { dir: d, name, ino } if d == dir => match ino {
                            Some(ino) => names.insert(name.to_vec(), ino),
                            None => names.remove(&name[..]),
                        },
                        Change::EntryAt {
                            dir: d, name, ino, ..
                        } if d == dir => names.insert(name.to_vec(), ino),
                        Change::Drop { ino } if ino == dir => return Ok(Patched::Dropped),
                        _ => None,
                    };
                }
                at = *lsn;
            }
        }
        Ok(Patched::Applied)
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

#[cfg(feature = "testing")]
impl SharedClient {
    /// Directories of more than `most` names are loaded a page at a time (tests, on small
    /// directories; [`NAMES_IN_ONE_LOAD`] otherwise).
    pub fn page_names_over(&self, most: u64) {
        self.state.names_in_one_load.store(most, Ordering::SeqCst);
    }
}
