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
//! Who keeps: a client that holds the whole table already (the volume's maker, a client that
//! loaded it) takes the role at its first heartbeat; one that would have to load it waits
//! [`KEEPER_GRACE`] after its join first, so that such a client takes it before it does. The
//! keeper renews the role with each heartbeat and gives it back when it leaves; one that
//! dies hands it on once its lease runs out (the next client to ask then loads the whole
//! table). A client that evicted another loads the rest too, whoever keeps: the evicted
//! client's memory is collected from the whole table.

use super::*;

/// The keeper's role: a key no inode has, below the checkpoint's role.
pub(super) const KEEPER_ROLE: Ino = turns::CHECKPOINT_ROLE - 1;

/// The keeper's lease, renewed with each heartbeat ([`session::HEARTBEAT_EVERY`]): as long as
/// a session's, so a keeper that died hands the role on when it is evicted.
const KEEPER_LEASE: Duration = SESSION_TTL;

/// How long a client that does not hold the whole table waits after its join before it asks
/// for the keeper's role: three heartbeats, so that a client holding it (which asks at its
/// first) is the keeper, and no second client loads the whole namespace.
const KEEPER_GRACE: Duration = Duration::from_secs(3);

impl State {
    /// Takes or renews the keeper's role if this volume is large enough to have one (with each
    /// heartbeat). A failure is the next heartbeat's to mend.
    pub(super) fn keep_role(&self) -> std::result::Result<(), String> {
        let given = self.engine.alloc_inos(0, 0).map_err(|e| e.to_string())?;
        let large = given > self.whole_under.load(Ordering::SeqCst);
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
                self.keeper.store(false, Ordering::SeqCst);
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// Whether the poller loads the rest of the namespace: on a small volume, on the
    /// keeper, and on a client with an evicted client's memory to collect.
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
        let _one = self.catching.lock();
        let turns = self.turns.lock().held();
        let gone = fs.forget_let_go(&|ino| turns.contains(&ino));
        if gone > 0 {
            log::debug!("shared volume: {gone} inodes the kernel let go of forgotten");
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

#[cfg(feature = "testing")]
impl SharedClient {
    /// The volume counts as large (a keeper holds the whole table, the others what they
    /// use) past `n` inode numbers given, for this client (tests, on small volumes), and it
    /// hears so now.
    pub fn whole_under(&self, n: u64) -> std::result::Result<(), String> {
        self.state.whole_under.store(n, Ordering::SeqCst);
        self.state.keep_role()
    }

    /// Whether this client holds the keeper's role (tests).
    pub fn is_keeper(&self) -> bool {
        self.state.keeper.load(Ordering::SeqCst)
    }

    /// One heartbeat now, with the keeper's role taken or renewed as it would be (tests;
    /// `after_grace`: as if the client joined long enough ago to ask).
    pub fn beat_now(&self, after_grace: bool) -> std::result::Result<(), String> {
        if after_grace {
            let now = Instant::now();
            *self.state.joined.lock() = now.checked_sub(KEEPER_GRACE).unwrap_or(now);
        }
        self.state.beat()?;
        self.state.keep_role()
    }
}
