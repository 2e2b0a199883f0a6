//! The inode turns this client holds ([`crate::fs::Turns`]): taken for a change of a file's
//! data (or after a namespace change lost on an inode), claimed for the inodes a change
//! makes and for the directories it names in that no other client worked in lately
//! ([`QUIET_DIR_AFTER`]), renewed by every change that touches the inode, and kept while this client works
//! on it, since its next change (the next write of a copy, the create's first write, the
//! next create in a new directory) usually follows within a FUSE round trip. While this
//! client holds a directory's turn, no other client adds a name to it, so a lookup that
//! finds nothing there needs no catch-up. A turn goes back once idle for [`TURN_LINGER`],
//! and at once when another client asks for it (the engine tells the lingering thread,
//! which gives turns back in batches, off the path of any request).

use super::*;
use crate::sync::MutexGuard;

/// The turn whose holder is the volume's rebuilder: a key no inode has.
pub(super) const REBUILD_ROLE: Ino = u64::MAX;

/// The turn whose holder writes the volume's next checkpoint ([`State::checkpoint`]): every
/// client counts the changes since the last one it knows, so under steady changes from many
/// clients each found one due at once and wrote the whole table, all but one for nothing.
/// A key no inode has, below the servers' births ([`touch::BIRTH_KEYS`]).
pub const CHECKPOINT_ROLE: Ino = touch::BIRTH_KEYS - 1;

/// How long the checkpoint's writer keeps its role at most: it gives it back once written (an
/// image of a million inodes takes a second or two); one that died hands it on after this.
pub(super) const CHECKPOINT_ROLE_LEASE: Duration = Duration::from_secs(30);

/// The rebuilder's lease, renewed before each file it repairs: a rebuilder that dies hands
/// the role on this long after (as long as a session's lease: by then it is evicted too);
/// one that lost it (a long stall) stops before its next file, and whatever it copies
/// meanwhile lands only under the file's own turn.
const REBUILD_ROLE_LEASE: Duration = SESSION_TTL;

mod linger;
#[cfg(all(test, feature = "shuttle"))]
mod model_tests;

pub(super) use linger::linger_loop;

/// One turn this client holds.
struct Held {
    /// Until when it is surely this client's (as this client's clock measures from the
    /// request that took or renewed it, less a margin).
    until: Instant,
    /// Changes using it now.
    users: usize,
    /// When its last user ended.
    idle_since: Instant,
    /// When it was taken or claimed: a wanted turn is kept [`TURN_MIN_HOLD`] from then.
    taken: Instant,
    /// Another client asked for it: it goes back once its users end.
    wanted: bool,
    /// Being given back: a new user waits, then takes it again.
    giving: bool,
    /// The table holds every change of the inode that came before this client held it: set
    /// once the take's catch-up ended (or by a claim, whose change touched it whole). Until
    /// then the turn vouches for nothing: a lookup there that finds nothing catches up, and
    /// this client's own name changes there do not count as seen ([`State::under_turn`]):
    /// the engine says the turn was this client's from the moment it gave it, before the
    /// table caught up with the changes before it.
    caught_up: bool,
}

impl Held {
    /// Whether a wanted turn has been kept long enough to go back (see [`TURN_MIN_HOLD`]).
    fn kept_enough(&self) -> bool {
        self.taken.elapsed() >= TURN_MIN_HOLD
    }
}

/// This client's turns, by inode.
#[derive(Default)]
pub(super) struct HeldTurns {
    map: HashMap<Ino, Held>,
    /// Inodes another client wanted the turn of, or changed first, and when: their
    /// directories are not claimed unasked for [`QUIET_DIR_AFTER`].
    contested: HashMap<Ino, Instant>,
    /// Turns this client is giving back or gave back lately: an engine's answer that the
    /// turn is this client's (a take, a claim) vouches for nothing if a give-back of it
    /// ended after the request was sent (the engine may have run the give-back last).
    given: HashMap<Ino, GivenBack>,
    /// `given`'s size at which it is pruned next (doubled past what a pruning leaves, so
    /// a burst of give-backs does not scan it at every one).
    given_prune_at: usize,
}

/// Contested inodes remembered before the old ones are forgotten.
const CONTESTED_KEPT: usize = 4096;

/// Give-backs remembered before those older than a turn's lease are forgotten (a claim or a
/// take sent before one of those would have run out by now anyway).
const GIVEN_KEPT: usize = 4096;

/// How long a give-back whose request failed may still run at the engine (a request sent,
/// its answer timed out: the engine may run it until about its timeout): answers about
/// that turn are not trusted until then.
const GIVE_BACK_UNSURE: Duration = crate::engine::redis::REQUEST_TIMEOUT;

/// Give-backs of one inode's turn: how many are running, and when the last one ended.
#[derive(Clone, Copy)]
struct GivenBack {
    running: usize,
    ended: Instant,
}

impl HeldTurns {
    /// The inodes whose turns this client holds.
    pub(super) fn held(&self) -> std::collections::HashSet<Ino> {
        self.map.keys().copied().collect()
    }

    /// Another client works on `ino` too: it wanted its turn, changed it first, or held it.
    fn contest(&mut self, ino: Ino) {
        let now = Instant::now();
        if self.contested.len() >= CONTESTED_KEPT {
            self.contested
                .retain(|_, at| now.duration_since(*at) < QUIET_DIR_AFTER);
            // Still full (a burst of writes to many files): forgotten, at worst a shared
            // directory is claimed once more.
            if self.contested.len() >= CONTESTED_KEPT {
                self.contested.clear();
            }
        }
        self.contested.insert(ino, now);
    }

    /// A give-back of these turns starts (see [`HeldTurns::given`]).
    fn giving_back(&mut self, inos: &[Ino]) {
        let now = Instant::now();
        if self.given.len() >= self.given_prune_at.max(GIVEN_KEPT) {
            // (An `ended` still to come, after a failed give-back, counts as recent.)
            self.given.retain(|_, g| {
                g.running > 0 || now.saturating_duration_since(g.ended) < TURN_LEASE
            });
            self.given_prune_at = self.given.len() * 2;
        }
        for ino in inos {
            self.given
                .entry(*ino)
                .or_insert(GivenBack {
                    running: 0,
                    ended: now,
                })
                .running += 1;
        }
    }

    /// A give-back of these turns ended: the engine answered, or (`answered` false) failed
    /// to, and may still run it for [`GIVE_BACK_UNSURE`].
    fn given_back(&mut self, inos: &[Ino], answered: bool) {
        let now = if answered {
            Instant::now()
        } else {
            Instant::now() + GIVE_BACK_UNSURE
        };
        for ino in inos {
            if let Some(g) = self.given.get_mut(ino) {
                g.running = g.running.saturating_sub(1);
                g.ended = now;
            }
        }
    }

    /// Whether the engine may have run a give-back of `ino`'s turn after a request of this
    /// client's sent at `sent`: one is running, or one ended after it.
    fn given_since(&self, ino: Ino, sent: Instant) -> bool {
        self.given
            .get(&ino)
            .is_some_and(|g| g.running > 0 || g.ended >= sent)
    }

    /// Whether every give-back of `ino`'s turn has ended and is known to have (none is
    /// running, and none failed less than [`GIVE_BACK_UNSURE`] ago).
    fn given_settled(&self, ino: Ino) -> bool {
        self.given
            .get(&ino)
            .is_none_or(|g| g.running == 0 && g.ended <= Instant::now())
    }

    /// Whether this client may claim directory `dir`'s turn unasked: not held, and not
    /// contested lately.
    fn quiet(&self, dir: Ino) -> bool {
        !self.map.contains_key(&dir)
            && self
                .contested
                .get(&dir)
                .is_none_or(|at| at.elapsed() >= QUIET_DIR_AFTER)
    }
}

/// A turn in use by one change: its user count goes down when dropped.
struct TurnInUse {
    state: Arc<State>,
    ino: Ino,
}

impl Drop for TurnInUse {
    fn drop(&mut self) {
        let s = &self.state;
        let give = {
            let mut t = s.turns.lock();
            match t.map.get_mut(&self.ino) {
                Some(h) => {
                    h.users -= 1;
                    h.idle_since = Instant::now();
                    let now = h.users == 0 && h.wanted && !h.giving && h.kept_enough();
                    h.giving |= now;
                    now
                }
                None => false,
            }
        };
        if give {
            s.give_back(&[self.ino]);
        }
    }
}

impl State {
    /// The turn of `ino` in use by one more change: taken from the engine unless held (the
    /// table then catches up if the inode changed since this client last saw it).
    fn take_turn(self: &Arc<State>, fs: &Fs, ino: Ino) -> Result<HeldTurn> {
        let (turn, changed) = self.turn_in_use(ino)?;
        if changed {
            // Another client changed it since this one last did: it works there too.
            self.turns.lock().contest(ino);
            self.catch_up(fs, true)?;
        }
        self.caught_up_with(ino);
        Ok(Box::new(turn))
    }

    /// The table holds every change of `ino` from before this client's turn of it (see
    /// [`Held::caught_up`]).
    fn caught_up_with(&self, ino: Ino) {
        if let Some(h) = self.turns.lock().map.get_mut(&ino) {
            h.caught_up = true;
        }
    }

    /// [`crate::fs::Turns::pass`]: the turn taken (the table caught up with it) and given
    /// back at once, not left to linger: other clients add names to the directory too, and
    /// held, it would stop their changes there until they asked for it.
    fn pass_turn(self: &Arc<State>, fs: &Fs, ino: Ino) -> Result<()> {
        drop(self.take_turn(fs, ino)?);
        let give = {
            let mut t = self.turns.lock();
            match t.map.get_mut(&ino) {
                Some(h) if h.users == 0 && !h.giving => {
                    h.giving = true;
                    true
                }
                _ => false,
            }
        };
        if give {
            self.give_back(&[ino]);
        }
        Ok(())
    }

    /// [`State::take_turn`] without the table: the turn, and whether another client changed
    /// the inode since this table last saw it (the caller catches up then).
    fn turn_in_use(self: &Arc<State>, ino: Ino) -> Result<(TurnInUse, bool)> {
        loop {
            {
                let mut t = self.turns.lock();
                match t.map.get_mut(&ino) {
                    Some(h) if h.giving => {
                        drop(self.given.wait_timeout(t, TURN_LINGER));
                        continue;
                    }
                    // Another client asked for it and no change here uses it: it goes back
                    // first (the asker waits with backoff, so it is likely to get it).
                    Some(h) if h.wanted && h.users == 0 && h.kept_enough() => {
                        h.giving = true;
                        drop(t);
                        self.give_back(&[ino]);
                        continue;
                    }
                    Some(h) if h.until > Instant::now() => {
                        h.users += 1;
                        let turn = TurnInUse {
                            state: self.clone(),
                            ino,
                        };
                        return Ok((turn, false));
                    }
                    _ => {}
                }
            }
            let sent = Instant::now();
            let version = self
                .engine
                .take_turn(&self.who, ino, TURN_LEASE, crate::fs::CHANGE_WAIT)
                .map_err(engine_err)?;
            {
                let mut t = self.turns.lock();
                if !t.map.contains_key(&ino) && t.given_since(ino, sent) {
                    // Given back as the engine answered: what it said may be undone. Asked
                    // again once that give-back ends: at once if it has.
                    if !t.given_settled(ino) {
                        drop(self.given.wait_timeout(t, TURN_LINGER));
                    }
                    continue;
                }
                let h = t.map.entry(ino).or_insert(Held {
                    until: sent,
                    users: 0,
                    idle_since: sent,
                    taken: sent,
                    wanted: false,
                    giving: false,
                    caught_up: false,
                });
                if h.giving {
                    continue; // given back meanwhile by another thread: take it again
                }
                h.until = sent + TURN_LEASE - TURN_MARGIN;
                h.users += 1;
                // Taken again (the one recorded had run out): caught up anew.
                h.caught_up = false;
            }
            let guard = TurnInUse {
                state: self.clone(),
                ino,
            };
            let seen = self
                .ahead
                .lock()
                .seen(ino, self.applied.load(Ordering::SeqCst));
            return Ok((guard, version > seen));
        }
    }

    /// An append taken at `sent` renewed the turns of the inodes it touched that this
    /// client holds, made those of `claimed` this client's, and said which are `wanted`.
    pub(super) fn appended(&self, sent: Instant, touched: &[Ino], claimed: &[Ino], wanted: &[Ino]) {
        let until = sent + TURN_LEASE - TURN_MARGIN;
        let now = Instant::now();
        let mut t = self.turns.lock();
        // Renewed, and in use: it lingers from now. Only a turn still this client's when the
        // append was sent: the engine renews only its holder's (one run out meanwhile may be
        // another client's now).
        for ino in touched {
            if let Some(h) = t.map.get_mut(ino).filter(|h| h.until > sent) {
                h.until = until;
                h.idle_since = now;
            }
        }
        for ino in claimed {
            let given = t.given_since(*ino, sent);
            match t.map.get_mut(ino) {
                // Taken meanwhile by another of this client's changes (a directory's, which
                // the engine gave as this client's already): renewed, its users kept; the
                // claim's change touched it whole, so the table held all of it then.
                Some(h) => {
                    h.until = h.until.max(until);
                    h.caught_up = true;
                }
                // Given back (by this client's own take and give-back of it, or because
                // another client asked for it) after the append was sent: the engine may
                // hold it for no one now, so it is not recorded as held.
                None if given => {}
                None => {
                    t.map.insert(
                        *ino,
                        Held {
                            until,
                            users: 0,
                            idle_since: sent,
                            taken: sent,
                            wanted: false,
                            giving: false,
                            caught_up: true,
                        },
                    );
                }
            }
        }
        for ino in wanted {
            if let Some(h) = t.map.get_mut(ino) {
                h.wanted = true;
            }
        }
    }

    /// A change of this client's lost on `ino` to another client's (its turn held there,
    /// or its version newer than this table's).
    pub(super) fn contested(&self, ino: Ino) {
        self.turns.lock().contest(ino);
    }

    /// Adds to `claim` the directories whose names `changes` add or remove that no other
    /// client worked in lately ([`QUIET_DIR_AFTER`]): claimed with the change (which touches
    /// them, so the engine refuses the claim of one another client holds), then held while
    /// this client goes on changing them.
    pub(super) fn claim_quiet_dirs(&self, changes: &[Change], claim: &mut Vec<Ino>) {
        let dirs = touch::dirs_named(changes);
        if dirs.is_empty() {
            return;
        }
        let t = self.turns.lock();
        let before = claim.len();
        claim.extend(dirs.into_iter().filter(|d| t.quiet(*d)));
        if claim.len() > before {
            claim.sort_unstable();
            claim.dedup();
        }
    }

    /// Whether this client holds inode `ino`'s turn now (no other client's change of it can
    /// be appended: this table's view of it is the engine's).
    pub(super) fn holds(&self, ino: Ino) -> bool {
        self.holds_for(ino, Duration::ZERO)
    }

    /// Whether this client holds inode `ino`'s turn for at least `left` more, its table
    /// caught up with it.
    pub(super) fn holds_for(&self, ino: Ino, left: Duration) -> bool {
        let t = self.turns.lock();
        t.map
            .get(&ino)
            .is_some_and(|h| !h.giving && h.caught_up && h.until > Instant::now() + left)
    }

    /// Of `keys` (those a change touches shared), the ones whose turn this client holds with
    /// its table caught up ([`Held::caught_up`]): if the engine says the change was appended
    /// under those turns ([`crate::engine::Appended::held`]), no other client's change of
    /// them came between, and the change counts as seeing them whole.
    pub(super) fn under_turn(&self, keys: &[Ino]) -> Vec<Ino> {
        keys.iter().copied().filter(|k| self.holds(*k)).collect()
    }
}

pub(super) struct SharedTurns(pub(super) Arc<State>);

impl Turns for SharedTurns {
    fn prepare(&self, fs: &Fs) -> Result<()> {
        let (left, floor) = fs.inos_left();
        if left >= INOS_LOW {
            return Ok(());
        }
        let first = self
            .0
            .engine
            .alloc_inos(INO_BATCH, floor)
            .map_err(engine_err)?;
        fs.give_inos(first..first + INO_BATCH);
        Ok(())
    }

    fn take(&self, fs: &Fs, ino: Ino) -> Result<HeldTurn> {
        self.0.take_turn(fs, ino)
    }

    fn pass(&self, fs: &Fs, ino: Ino) -> Result<()> {
        self.0.pass_turn(fs, ino)
    }

    fn refresh_name(&self, fs: &Fs, dir: Ino, name: &[u8]) {
        let s = &self.0;
        let key = touch::name_key(dir, name);
        if let Ok(version) = s.engine.version(key) {
            let seen = s.ahead.lock().seen(key, s.applied.load(Ordering::SeqCst));
            if version <= seen {
                return;
            }
        }
        self.refresh(fs);
    }

    fn load(&self, fs: &Fs, ino: Ino) -> Result<()> {
        self.0.load_for_request(fs, ino)
    }

    fn load_whole(&self, fs: &Fs) -> Result<()> {
        self.0.load_whole(fs)
    }

    fn rebuild_role(&self) -> bool {
        let s = &self.0;
        // The rebuild reads every file: not until this client holds them all.
        if !s.is_whole() {
            return false;
        }
        match s
            .engine
            .take_turn(&s.who, REBUILD_ROLE, REBUILD_ROLE_LEASE, Duration::ZERO)
        {
            Ok(_) => true,
            Err(EngineError::TurnBusy { .. }) => false,
            Err(e) => {
                log::warn!("shared volume: the rebuild waits: {e}");
                false
            }
        }
    }

    fn server_reborn(&self, fs: &Fs, server: u32) -> Result<()> {
        self.0.record_birth(fs, server)
    }

    fn opening(&self, ino: Ino) -> Result<()> {
        self.0.mark_open(ino)
    }

    fn open_elsewhere(&self, ino: Ino) -> Result<bool> {
        let s = &self.0;
        let other = s.engine.open_elsewhere(&s.who, ino).map_err(engine_err)?;
        Ok(other.is_some())
    }

    fn holds(&self, ino: Ino) -> bool {
        self.0.holds(ino)
    }

    fn send_writes(&self) -> Result<()> {
        self.0.still_whole()?;
        self.0.send_behind()
    }

    fn catch_up(&self, fs: &Fs, patience: Duration) -> Result<()> {
        self.0.catch_up_within(fs, patience)
    }

    fn tell_kernel_then(&self, then: crate::fs::KernelTold) {
        // Run by the notifier, after what catch-ups before queued.
        if let Err(crossbeam_channel::SendError(Notice::Flushed(then))) =
            self.0.notify.send(Notice::Flushed(then))
        {
            then(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::mem::MemEngine;

    /// The engine counts a turn as this client's from the moment it gives it, before the
    /// table caught up with the changes before it: until then, another thread's change under
    /// it must not count as having seen them, nor a lookup there trust the table.
    #[test]
    fn a_turn_taken_vouches_for_nothing_until_the_table_caught_up() {
        let engine = Arc::new(MemEngine::new());
        engine.start_session("a", SESSION_TTL).unwrap();
        let (notify, _) = crossbeam_channel::unbounded();
        let s = Arc::new(State::new(
            engine.clone(),
            "a".into(),
            FsConfig::default(),
            0,
            Arc::new(FreeGate::waiting_for_the_floor()),
            notify,
        ));
        let (turn, _) = s.turn_in_use(7).unwrap();
        assert_eq!(engine.turn_holder(7).as_deref(), Some("a"));
        assert!(!s.holds(7), "held before the table caught up");
        assert!(s.under_turn(&[7, 8]).is_empty());
        s.caught_up_with(7);
        assert!(s.holds(7));
        assert_eq!(s.under_turn(&[7, 8]), vec![7]);
        drop(turn);
    }
}
