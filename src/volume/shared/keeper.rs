//! Which clients hold the whole namespace. A client loads what it uses ([`load`]); the rest
//! it loads in the poller's rounds only where that costs little (a volume that gave out
//! fewer inode numbers than [`crate::config::SHARED_WHOLE_UNDER`]), or where it is the
//! volume's *keeper*: one client, holding a role in the engine (a turn, as the rebuilder's),
//! that keeps the whole table for what reads it whole (the checkpoints, the rebuild, the
//! collection of what an evicted client left). So on a large volume one client's memory
//! grows with the namespace, and every other client's with what it uses: it loads what it
//! looks at and forgets what the kernel let go of ([`crate::meta::Meta::forget_let_go`]).
//!
//! Why one keeper and not none: a checkpoint is the whole table's image, and without one the
//! log is never trimmed. Why a role rather than every client whole: with many clients and a
//! large namespace, each would hold all of it (about 640 bytes an inode here), and read it
//! all from the engine at its join.
//!
//! Large: the namespace holds more inodes than [`crate::config::SHARED_WHOLE_UNDER`], as the
//! clients holding the whole table count them and note in the engine. (Not the inode
//! numbers given out: each client takes them a thousand at a time, so a few hundred mounts
//! that made one file each would count as a large volume. They decide only before any
//! count is noted.)
//!
//! Who keeps: a client that holds the whole table already (the volume's maker, a client that
//! loaded it) takes the role at its first round; one that would have to load it waits
//! [`KEEPER_GRACE`] after its join first, so that such a client takes it before it does. The
//! keeper renews the role each second and gives it back when it leaves; one that dies hands
//! it on once its lease runs out (the next client to ask then loads the whole table).
//!
//! A client that evicts another while it holds part of a large volume's namespace leaves
//! the collection of the evicted client's memory (read from the whole table) to the keeper,
//! through the engine ([`crate::engine::MetaEngine::owe_collection`]). A client that loaded
//! the whole table for another reason keeps it until it leaves: one a server came back to
//! with new keys (every file's map is rekeyed), one an admin's drain or removal ran on, one
//! that fell behind a checkpoint's trim.

use super::*;

/// The keeper's role: a key no inode has, below the checkpoint's role.
pub(super) const KEEPER_ROLE: Ino = turns::CHECKPOINT_ROLE - 1;

/// How often a client asks whether the volume is large, and takes or renews the keeper's
/// role: each second, in the poller's round (not on the heartbeats' thread, which nothing
/// slow may hold up: a session's lease rests on it).
const KEEPER_EVERY: Duration = session::HEARTBEAT_EVERY;

/// The keeper's lease, renewed every [`KEEPER_EVERY`] by the poller: longer than the
/// poller's longest round (a load of 4,096 directories, a checkpoint's image of a million
/// inodes), so a busy keeper keeps it; a keeper that died hands it on this long after.
const KEEPER_LEASE: Duration = Duration::from_secs(60);

/// How long a client that does not hold the whole table waits after its join before it asks
/// for the keeper's role: three of its rounds, so that a client holding it (which asks at
/// its first) is the keeper, and no second client loads the whole namespace.
const KEEPER_GRACE: Duration = Duration::from_secs(3 * KEEPER_EVERY.as_secs());

/// Inodes forgotten (since the last trim) past which the allocator is asked to give its free
/// memory back to the system ([`give_freed_memory_back`]): glibc keeps what was freed for
/// the process's next allocations, so a client that forgot 200,000 inodes (some 110 MiB)
/// stayed at its size; a trim walks the heap (milliseconds), worth it for that much, not
/// for a directory.
const TRIM_AFTER: u64 = 10_000;

/// Asks the allocator to give the memory freed so far back to the system (glibc's
/// `malloc_trim`; nothing elsewhere).
fn give_freed_memory_back() {
    #[cfg(target_env = "gnu")]
    // SAFETY: `malloc_trim` only returns free heap pages to the system; it is thread-safe
    // (it takes each arena's lock) and touches no memory the program holds.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Whether one of `roles` is a role's key rather than an inode's turn: the linger thread
/// keeps a role another client asks for (it goes back when its work is done or its lease
/// ends, never because it is wanted).
pub(super) fn is_role(key: Ino) -> bool {
    key == KEEPER_ROLE || key == turns::CHECKPOINT_ROLE || key == turns::REBUILD_ROLE
}

impl State {
    /// Once every [`KEEPER_EVERY`] (the poller's round): a client holding the whole table
    /// notes how many inodes it holds, one holding part reads that count, and where it
    /// passes [`crate::config::SHARED_WHOLE_UNDER`] (the volume is large) the client takes or
    /// renews the keeper's role. A failure is the next round's to mend.
    pub(super) fn keeper_round(&self, fs: &Fs) {
        {
            let mut next = self.keeper_next.lock();
            if Instant::now() < *next {
                return;
            }
            *next = Instant::now() + KEEPER_EVERY;
        }
        if let Err(e) = self.claim_keeper_role(fs) {
            log::warn!("shared volume: the keeper's role (next round): {e}");
        }
    }

    /// [`State::keeper_round`] now.
    pub(super) fn claim_keeper_role(&self, fs: &Fs) -> std::result::Result<(), String> {
        let noted = match self.is_whole() {
            true => {
                let n = fs.inode_count() as u64;
                self.engine.note_inodes(n).map_err(|e| e.to_string())?;
                Some(n)
            }
            false => self.engine.noted_inodes().map_err(|e| e.to_string())?,
        };
        self.noted_inodes
            .store(noted.unwrap_or(0), Ordering::SeqCst);
        // None noted yet (a volume of an older build, or one whose clients all hold part of
        // it): the inode numbers given out, which no count of inodes passes, decide. Taken
        // for large on them, a volume that is not loses nothing for long: its keeper loads
        // it and notes the count.
        let inodes = match noted {
            Some(n) => n,
            None => self.engine.alloc_inos(0, 0).map_err(|e| e.to_string())?,
        };
        let large = inodes > self.whole_under.load(Ordering::SeqCst);
        self.large.store(large, Ordering::SeqCst);
        if !large || (!self.is_whole() && self.joined.lock().elapsed() < KEEPER_GRACE) {
            return Ok(());
        }
        match self
            .engine
            .take_turn(&self.who, KEEPER_ROLE, KEEPER_LEASE, Duration::ZERO)
        {
            Ok(_) => {
                if !self.keeper.swap(true, Ordering::SeqCst) {
                    log::info!("shared volume: this client keeps the whole namespace");
                }
                Ok(())
            }
            Err(EngineError::TurnBusy { .. }) => {
                if self.keeper.swap(false, Ordering::SeqCst) {
                    log::warn!("shared volume: the keeper's role went to another client");
                }
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// Whether the poller loads the rest of the namespace: on a small volume, on the
    /// keeper, and on a client with an evicted client's memory to collect (one that held
    /// the whole table when it evicted it, or could not leave it to the keeper).
    pub(super) fn wants_whole(&self) -> bool {
        !self.large.load(Ordering::SeqCst)
            || self.keeper.load(Ordering::SeqCst)
            || !self.to_collect.lock().is_empty()
    }

    /// Forgets what the kernel let go of, on a client that holds what it uses
    /// ([`Fs::forget_let_go`]). Under `catching`, so that no catch-up applies changes it
    /// kept for inodes gone meanwhile; the inodes whose turns this client holds stay (a
    /// write held back under one is appended later).
    pub(super) fn forget_let_go(&self, fs: &Fs) {
        let gone = {
            let _one = self.catching.lock();
            if !fs.inspect_meta(crate::meta::Meta::has_let_go) {
                return;
            }
            let turns = self.turns.lock().held();
            fs.forget_let_go(&|ino| turns.contains(&ino))
        };
        if gone > 0 {
            log::debug!("shared volume: {gone} inodes the kernel let go of forgotten");
        }
        // Off the catch-up's lock: the heap's walk holds up no request.
        let since = self
            .forgotten_since_trim
            .fetch_add(gone as u64, Ordering::SeqCst)
            + gone as u64;
        if since >= TRIM_AFTER {
            self.forgotten_since_trim.store(0, Ordering::SeqCst);
            give_freed_memory_back();
        }
    }

    /// On the keeper, the evicted clients whose memory a client holding part of the
    /// namespace left to it ([`MetaEngine::owe_collection`]): taken before the round's
    /// catch-up, so that the catch-up that precedes their collection follows their eviction
    /// (as the evicting client's own collection waits for its next round).
    pub(super) fn take_owed(&self) {
        if !self.keeper.load(Ordering::SeqCst) || !self.is_whole() {
            return;
        }
        match self.engine.owed_collections() {
            Ok(owed) => {
                let mut c = self.to_collect.lock();
                for who in owed {
                    if !c.contains(&who) {
                        c.push(who);
                    }
                }
            }
            Err(e) => log::warn!("shared volume: what evicted clients left (next round): {e}"),
        }
    }

    /// Gives the keeper's role back (leaving the volume).
    pub(super) fn give_keeper_role(&self) {
        if self.keeper.swap(false, Ordering::SeqCst) {
            if let Err(e) = self.engine.give_turns(&self.who, &[KEEPER_ROLE]) {
                log::warn!("shared volume: the keeper's role stays until its lease ends: {e}");
            }
        }
    }
}

/// Where a client stands on holding the namespace (`rmemfs stats`, its "shared" section).
#[derive(Debug, Clone, Copy, Default)]
pub struct Standing {
    pub keeper: bool,
    pub whole: bool,
    pub large: bool,
    /// The namespace's inodes as last noted or read (0: none noted yet).
    pub noted_inodes: u64,
    pub applied: u64,
}

/// Reads a client's [`Standing`] now (for the mount's report, which outlives no client).
pub type StandingSource = Arc<dyn Fn() -> Standing + Send + Sync>;

impl SharedClient {
    /// Where this client stands, read each time it is called.
    pub fn standing(&self) -> StandingSource {
        let s = self.state.clone();
        Arc::new(move || Standing {
            keeper: s.keeper.load(Ordering::SeqCst),
            whole: s.is_whole(),
            large: s.large.load(Ordering::SeqCst),
            noted_inodes: s.noted_inodes.load(Ordering::SeqCst),
            applied: s.applied.load(Ordering::SeqCst),
        })
    }
}

#[cfg(feature = "testing")]
impl SharedClient {
    /// The volume counts as large (a keeper holds the whole table, the others what they
    /// use) past `n` inodes, for this client (tests, on small volumes), and it hears so now.
    pub fn whole_under(&self, n: u64) -> std::result::Result<(), String> {
        self.state.whole_under.store(n, Ordering::SeqCst);
        self.keeper_round_now(false)
    }

    /// Whether this client holds the keeper's role (tests).
    pub fn is_keeper(&self) -> bool {
        self.state.keeper.load(Ordering::SeqCst)
    }

    /// The keeper's round now (tests; `after_grace`: as if the client joined long enough
    /// ago to ask).
    pub fn keeper_round_now(&self, after_grace: bool) -> std::result::Result<(), String> {
        let fs = self.fs.upgrade().ok_or("the file system is gone")?;
        if after_grace {
            let now = Instant::now();
            *self.state.joined.lock() = now.checked_sub(KEEPER_GRACE).unwrap_or(now);
        }
        self.state.claim_keeper_role(&fs)
    }
}
