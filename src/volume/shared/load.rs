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

/// Times a directory's names are paged again after one of them changed meanwhile, before
/// one script reads them however long it takes: names changed faster than pages are read
/// would otherwise never load.
const PAGED_TRIES: usize = 5;

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
        let most = self.names_in_one_load.load(Ordering::SeqCst);
        let load = self
            .engine
            .load_state(&dirs, &inodes, most)
            .map_err(engine_err)?;
        self.catch_up_through(fs, in_request, load.head)?;
        let loaded = state::changes_of(&load.dump)?;
        let whole: Vec<Ino> = dirs
            .iter()
            .copied()
            .filter(|d| !load.too_big.contains(d))
            .collect();
        fs.install_loaded(&whole, &[], loaded)?;
        for dir in load.too_big {
            self.load_names_paged(fs, dir, in_request)?;
        }
        Ok(())
    }

    /// Loads directory `dir`'s names a page at a time (more than one step reads), the
    /// caller holding `catching`: the pages, read while the directory's version stays (no
    /// name of it changed from the first page to the last); the inodes they lead to, a
    /// batch a step, each as of its own head; then, if the directory's version is still the
    /// first page's, its names, the table first brought to the head of that last look (the
    /// changes of the directory's names before it are in the pages, and none came after
    /// the first). Paged again if it changed; after [`PAGED_TRIES`], read in one step.
    fn load_names_paged(&self, fs: &Fs, dir: Ino, in_request: bool) -> Result<()> {
        for _ in 0..PAGED_TRIES {
            let Some((version, names)) = self.read_names(dir)? else {
                continue;
            };
            let missing: Vec<Ino> = fs.inspect_meta(|m| {
                let mut out: Vec<Ino> = names
                    .values()
                    .copied()
                    .filter(|i| m.get(*i).is_none())
                    .collect();
                out.sort_unstable();
                out.dedup();
                out
            });
            for batch in missing.chunks(INODES_PER_LOAD) {
                self.load_alone(fs, &[], batch, in_request)?;
            }
            let now = self.engine.names_page(dir, 0, 1).map_err(engine_err)?;
            if now.version != version {
                continue;
            }
            self.catch_up_through(fs, in_request, now.head)?;
            if !fs.inspect_meta(|m| names.values().all(|i| m.get(*i).is_some())) {
                continue;
            }
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
        log::warn!(
            "shared volume: directory {dir}'s names kept changing while read a page at a \
             time; read in one step"
        );
        let load = self
            .engine
            .load_state(&[dir], &[], u64::MAX)
            .map_err(engine_err)?;
        self.catch_up_through(fs, in_request, load.head)?;
        fs.install_loaded(&[dir], &[], state::changes_of(&load.dump)?)
    }

    /// Directory `dir`'s names, a page at a time, and its version, if it stayed from the
    /// first page to the last (none: a name changed meanwhile).
    fn read_names(&self, dir: Ino) -> Result<Option<(u64, Names)>> {
        let mut names = BTreeMap::new();
        let (mut cursor, mut version) = (0, None);
        // Never more a page than one step may read.
        let count = NAMES_PAGE.min(self.names_in_one_load.load(Ordering::SeqCst));
        loop {
            let page = self
                .engine
                .names_page(dir, cursor, count)
                .map_err(engine_err)?;
            if *version.get_or_insert(page.version) != page.version {
                return Ok(None);
            }
            names.extend(page.names);
            if page.next == 0 {
                return Ok(version.map(|v| (v, names)));
            }
            cursor = page.next;
        }
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
