//! Where a change meets the engine: a committed batch appended with what it touches
//! ([`EngineRecorder`], the shared volume's [`crate::meta::Journal`]), a write's held back
//! ([`super::behind`]), an engine's refusal turned into the file system's error, and an
//! answer lost on the way read from the log ([`Appender::find_lost`]).

use super::*;

/// What a change's append sent and got back (see [`Appender`]).
pub(super) struct Sent {
    /// When it was sent (turns it renewed last from then).
    pub(super) at: Instant,
    /// The last change the table held with every change before it, when it was sent: the
    /// engine's place for it must come after (a catch-up on another thread may apply it
    /// before its answer is looked at).
    pub(super) applied: u64,
    pub(super) answer: std::result::Result<crate::engine::Appended, EngineError>,
}

/// The one place a change meets the engine: a record appended as `who`, touching inodes at
/// the versions this table holds (the applied log, or a change of this client's own ahead
/// of it); a change the engine takes is noted as ahead of the applied log, and every answer
/// counted, so a catch-up knows its own changes (see [`Ahead`]). The model tests run it too.
pub(super) struct Appender<'a> {
    pub(super) engine: &'a dyn MetaEngine,
    pub(super) who: &'a str,
    pub(super) ahead: &'a Mutex<Ahead>,
    pub(super) answered: &'a Condvar,
    /// The last change the table holds with every change before it.
    pub(super) applied: &'a AtomicU64,
    /// How long an append whose answer was lost waits for the engine to read its log again
    /// ([`Appender::find_lost`]).
    pub(super) lost_answer_wait: Duration,
}

impl Appender<'_> {
    /// Appends `record`, touching `keys`: a change not in the table, which a catch-up
    /// applies from the log as it does another client's ([`births`]).
    pub(super) fn append_unapplied(&self, record: &[u8], keys: &[Ino], state: &[KeyOp]) -> Sent {
        let keys = touch::Touched::exclusive(keys.to_vec());
        let marks = Marks {
            state,
            ..Marks::default()
        };
        self.append(record, &keys, &[], marks, &[], false)
    }

    /// Appends `record` (a change in the table already, if `in_table`), touching `keys`,
    /// claiming `claim`, marking `marks`, checking `checked` (keys it reads and does not
    /// write, each at the version this table holds or the one given, whichever is newer).
    pub(super) fn append(
        &self,
        record: &[u8],
        keys: &touch::Touched,
        claim: &[Ino],
        marks: Marks<'_>,
        checked: &[(Ino, u64)],
        in_table: bool,
    ) -> Sent {
        let (touched, checked, applied): (Vec<Touch>, Vec<Touch>, u64) = {
            let mut a = self.ahead.lock();
            a.sent += 1;
            let applied = self.applied.load(Ordering::SeqCst);
            let seen = |key, at_least| a.seen(key, applied).max(at_least);
            let touched = keys
                .exclusive
                .iter()
                .map(|&key| Touch::exclusive(key, seen(key, 0)))
                .chain(
                    keys.shared
                        .iter()
                        .map(|&key| Touch::shared(key, seen(key, 0))),
                )
                .collect();
            (
                touched,
                checked
                    .iter()
                    .map(|&(key, at)| Touch::exclusive(key, seen(key, at)))
                    .collect(),
                applied,
            )
        };
        let marks = Marks {
            checked: &checked,
            ..marks
        };
        let at = Instant::now();
        let mut answer = self
            .engine
            .append(self.who, record, &touched, claim, marks, TURN_LEASE);
        // Before it counts as answered, so that no catch-up meanwhile takes it for another
        // client's.
        if let Err(EngineError::Unavailable(why)) = &answer {
            if let Some(lsn) = self.find_lost(record, applied) {
                log::warn!(
                    "shared volume: the engine took change {lsn} though its answer was lost \
                     ({why})"
                );
                // Which turns it held is lost with the answer: none counted.
                answer = Ok(crate::engine::Appended {
                    lsn,
                    wanted: Vec::new(),
                    held: Vec::new(),
                });
            }
        }
        {
            let mut a = self.ahead.lock();
            a.answered += 1;
            if let (Ok(done), true) = (&answer, in_table) {
                // Of the shared keys, only those whose turn this client held: otherwise this
                // change says nothing of another client's change of another name there
                // before it, which the table may not hold yet.
                let held = done.held.iter().filter(|k| keys.under_turn.contains(k));
                let seen: Vec<Ino> = keys.exclusive.iter().chain(held).copied().collect();
                a.noted(done.lsn, &seen);
            }
        }
        self.answered.notify_all();
        Sent {
            at,
            applied,
            answer,
        }
    }
}

impl Appender<'_> {
    /// Where the engine put `record`, an append whose answer was lost (the engine went away
    /// as it ran: Redis killed, the connection cut), if it did: the log past `after` (what the
    /// table held when it was sent) is read for it, the engine waited for up to
    /// `lost_answer_wait`. The same bytes from another client would be the same change
    /// decided on the same view (a change's record names the inodes it makes, which the engine
    /// gave this client alone, and the times it set).
    fn find_lost(&self, record: &[u8], mut after: u64) -> Option<u64> {
        let deadline = Instant::now() + self.lost_answer_wait;
        let mut pause = crate::sync::Backoff::new(LOST_ANSWER_FIRST_PAUSE, LOST_ANSWER_MAX_PAUSE);
        loop {
            match self.engine.read_after(after, READ_BATCH) {
                Ok(got) => {
                    let a = self.ahead.lock();
                    if let Some((lsn, _)) = got
                        .iter()
                        .find(|(lsn, bytes)| bytes == record && !a.is_own(*lsn))
                    {
                        return Some(*lsn);
                    }
                    match got.last() {
                        Some((lsn, _)) if got.len() == READ_BATCH => after = *lsn,
                        _ => return None,
                    }
                }
                Err(e) if Instant::now() + pause.current() > deadline => {
                    log::warn!(
                        "shared volume: an append's answer was lost, and so is the log: {e}"
                    );
                    return None;
                }
                Err(_) => pause.sleep(),
            }
        }
    }
}

/// A change on its way to the engine: its changes (in the table already), the inodes it
/// touches and those whose turn it claims, the files it marks open and the inodes it drops.
#[derive(Clone, Copy)]
pub(super) struct Outgoing<'a> {
    pub(super) changes: &'a [Change],
    pub(super) keys: &'a touch::Touched,
    pub(super) claim: &'a [Ino],
    pub(super) opened: &'a [Ino],
    pub(super) dropped: &'a [Ino],
}

impl Default for Outgoing<'_> {
    fn default() -> Self {
        static NOTHING: touch::Touched = touch::Touched {
            exclusive: Vec::new(),
            shared: Vec::new(),
            claimed: Vec::new(),
            under_turn: Vec::new(),
        };
        Outgoing {
            changes: &[],
            keys: &NOTHING,
            claim: &[],
            opened: &[],
            dropped: &[],
        }
    }
}

/// An append of changes the engine did not take, or whose answer was lost.
pub(super) struct NotTaken {
    pub(super) error: Error,
    /// The record sent, when its answer was lost on the way (the engine went away while it
    /// ran): the engine may hold it.
    pub(super) unanswered: Option<Vec<u8>>,
}

impl From<Error> for NotTaken {
    fn from(error: Error) -> NotTaken {
        NotTaken {
            error,
            unanswered: None,
        }
    }
}

/// An engine's refusal of a change touching `keys` as the file system's error: a change
/// decided on a stale view (or touching another client's turn) is decided again
/// ([`Error::conflict`]; on a key it touched shared, [`Error::conflict_shared`]), anything
/// else fails (EIO).
pub(super) fn refused(e: EngineError, keys: &touch::Touched) -> Error {
    match e {
        EngineError::Conflict { key, .. } | EngineError::Busy { key, .. } => Error {
            conflict_shared: keys.passes(key),
            ..Error::conflict(key, e.to_string())
        },
        // A drop of a file open on another client: that client drops it once it lets go.
        EngineError::Held { key, .. } => Error::held_elsewhere(key, e.to_string()),
        e => engine_err(e),
    }
}

impl State {
    /// Where this client's changes meet the engine.
    pub(super) fn appender(&self) -> Appender<'_> {
        Appender {
            engine: &*self.engine,
            who: &self.who,
            ahead: &self.ahead,
            answered: &self.answered,
            applied: &self.applied,
            lost_answer_wait: Duration::from_millis(
                self.lost_answer_wait_ms.load(Ordering::SeqCst),
            ),
        }
    }
}

/// Appends each committed batch to the engine, with what it touches; a write's may be held
/// back ([`behind`]).
pub(super) struct EngineRecorder(pub(super) Arc<State>);

impl crate::meta::Journal for EngineRecorder {
    /// Clients change one directory at once (see [`touch`]).
    fn commuting_dirs(&self) -> bool {
        true
    }

    fn record(&mut self, changes: &[Change], table: &TableView<'_>) -> Result<()> {
        let s = &self.0;
        s.still_whole()?;
        let (mut keys, mut claim) = touch::touched(changes, table);
        // The net under every path that loads names before it decides on them.
        if let Some(dir) = touch::names_read_unloaded(changes, table) {
            return Err(Error::unloaded(dir));
        }
        s.claim_quiet_dirs(changes, &mut claim);
        keys.claiming(&claim);
        let (opened, dropped) = touch::opened_and_dropped(changes);
        s.append_after_writes(Outgoing {
            changes,
            keys: &keys,
            claim: &claim,
            opened: &opened,
            dropped: &dropped,
        })
    }

    fn record_write(
        &mut self,
        ino: Ino,
        changes: &[Change],
        table: &TableView<'_>,
        then: crate::meta::AfterRecord,
        unsent: Option<crate::meta::UnsentWrite<'_>>,
    ) -> Result<()> {
        let s = &self.0;
        s.still_whole()?;
        let (now, later) = unsent.map(|u| (u.now, u.later)).unzip();
        match s.hold_back(ino, changes, then, later) {
            Ok(()) => Ok(()),
            Err(then) => {
                // Appended at once: its bytes go first.
                if let Some(now) = now {
                    now();
                }
                self.record(changes, table)?;
                then();
                Ok(())
            }
        }
    }
}

impl State {
    /// Appends change `out`, checking the birth of each server a chunk copy of its changes is
    /// on; a copy on a server born again since is left out and the change appended again.
    pub(super) fn append_changes(&self, out: Outgoing<'_>) -> Result<()> {
        self.offer_changes(out).map_err(|n| n.error)
    }

    /// [`State::append_changes`], saying when the engine may have taken what it failed.
    pub(super) fn offer_changes(&self, out: Outgoing<'_>) -> std::result::Result<(), NotTaken> {
        let Outgoing {
            changes,
            keys,
            claim,
            opened,
            dropped,
        } = out;

        // Each server a chunk copy of the change is on: its birth is checked.
        let mut checked: Vec<(Ino, u64)> = touch::servers_named(changes)
            .into_iter()
            .map(|key| (key, 0))
            .collect();
        let mut changes = std::borrow::Cow::Borrowed(changes);
        let keys = &touch::Touched {
            under_turn: self.under_turn(&keys.shared),
            ..keys.clone()
        };
        let mut tries = 0;
        let mut record;
        let sent = loop {
            // The engine numbers the change: the frame's own LSN is left 0.
            record = record::encode(0, &changes);
            let ops = state::ops_of(&changes, false);
            let marks = Marks {
                opened,
                dropped,
                checked: &[],
                state: &ops,
            };
            let sent = self
                .appender()
                .append(&record, keys, claim, marks, &checked, true);
            match &sent.answer {
                Err(EngineError::Conflict { key, lsn }) if tries < BORN_RETRIES => {
                    let Some(server) = touch::server_of_key(*key) else {
                        break sent;
                    };
                    // The server was born again after this table's view (it restarted
                    // empty, and another client put that in the log): the copies this
                    // change names there were written to its earlier birth and are gone.
                    // Left out, the change goes after the birth.
                    changes = std::borrow::Cow::Owned(
                        touch::without_copies_on(&changes, server).map_err(NotTaken::from)?,
                    );
                    if let Some(c) = checked.iter_mut().find(|(k, _)| k == key) {
                        c.1 = *lsn;
                    }
                    tries += 1;
                }
                _ => break sent,
            }
        };
        let done = match sent.answer {
            Ok(done) => done,
            Err(e @ EngineError::Unavailable(_)) => {
                return Err(NotTaken {
                    error: refused(e, keys),
                    unanswered: Some(record),
                })
            }
            Err(e) => {
                if let EngineError::Conflict { key, .. } | EngineError::Busy { key, .. } = &e {
                    self.contested(*key);
                }
                return Err(refused(e, keys).into());
            }
        };
        self.marked_by_append(opened);
        // A place the engine gave before: its log went back past this table.
        self.check_place(done.lsn, sent.applied)?;
        // Frees of what this change let go wait for it to be applied everywhere.
        self.gate.assigned.fetch_max(done.lsn, Ordering::SeqCst);
        self.appended(sent.at, &keys.all(), claim, &done.wanted);
        Ok(())
    }
}
