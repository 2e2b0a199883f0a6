//! Keeping a shared client's table up to the engine's log: catching up (skipping this
//! client's own changes, already in the table), loading a checkpoint when the log was
//! trimmed past this client, writing one, and the poller that applies other clients'
//! changes between this client's own.

use super::*;

/// The first pause before a catch-up that failed is tried again ([`State::catch_up_within`]; an
/// engine that refused a connection answers at once), doubled each time up to
/// [`CATCH_UP_RETRY_MOST`].
const CATCH_UP_RETRY_FIRST: Duration = Duration::from_millis(10);
/// The longest pause between catch-ups tried again: one second, a fifth of the engine's
/// request timeout, so what waits for one goes on soon after the engine is back.
const CATCH_UP_RETRY_MOST: Duration = Duration::from_secs(1);

/// One entry of the engine's log: its LSN and its record's bytes.
type Entry = (u64, Vec<u8>);

/// The changes of one engine log entry. An entry holds one record whose frame says LSN 0
/// (the engine numbers changes: format 2) or the entry's own (format 1).
pub(super) fn entry_changes(lsn: u64, bytes: &[u8]) -> Result<Vec<Change>> {
    let framed = bytes
        .get(8..16)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes);
    let read = record::read(bytes, if framed == lsn { lsn } else { 0 });
    if let Some(why) = read::stop_reason(&read.stop) {
        return Err(Error::new(
            libc::EIO,
            format!("the engine's change {lsn}: {why}"),
        ));
    }
    match read.records.into_iter().next() {
        Some((_, changes)) => Ok(changes),
        None => Err(Error::new(
            libc::EIO,
            format!("the engine's change {lsn} is no record"),
        )),
    }
}

/// The changes of `got` (read from the engine's log) that are not this client's own (which
/// its table holds already), parsed. The model tests apply them the same way.
/// Of a change whose first changes are its own (see [`Ahead::noted_prefix`]), the rest.
pub(super) fn foreign(ahead: &Ahead, got: &[(u64, Vec<u8>)]) -> Result<Vec<(u64, Vec<Change>)>> {
    got.iter()
        .filter(|(lsn, _)| !ahead.is_own(*lsn))
        .map(|(lsn, bytes)| {
            let mut changes = entry_changes(*lsn, bytes)?;
            let own = ahead.own_prefix(*lsn).min(changes.len());
            changes.drain(..own);
            Ok((*lsn, changes))
        })
        .collect()
}

impl State {
    /// [`State::catch_up`] in a request, tried again for up to `patience` while the engine
    /// cannot be read; at once the failure if this client stopped.
    pub(super) fn catch_up_within(&self, fs: &Fs, patience: Duration) -> Result<()> {
        let deadline = Instant::now() + patience;
        let mut pause = crate::sync::Backoff::new(CATCH_UP_RETRY_FIRST, CATCH_UP_RETRY_MOST);
        loop {
            let e = match self.catch_up(fs, true) {
                Ok(_) => return Ok(()),
                Err(e) => e,
            };
            self.still_whole()?;
            if Instant::now() + pause.current() >= deadline {
                return Err(e);
            }
            log::warn!("catching up with the engine (trying again): {}", e.message);
            pause.sleep();
        }
    }

    /// Applies what others appended since this table's last applied change. With
    /// `in_request` (whenever the file system is mounted), the kernel is told by the notifier
    /// thread: never from here, as a request waiting for the table may hold the directory
    /// lock that the kernel's invalidation of a name waits for.
    pub(super) fn catch_up(&self, fs: &Fs, in_request: bool) -> Result<usize> {
        let _one = self.catching.lock();
        self.catch_up_alone(fs, in_request)
    }

    /// [`State::catch_up`], the caller holding `catching`.
    fn catch_up_alone(&self, fs: &Fs, in_request: bool) -> Result<usize> {
        self.catch_up_through(fs, in_request, u64::MAX)
    }

    /// [`State::catch_up_alone`], applying no change past `through` (a load, whose state is
    /// of that change).
    pub(super) fn catch_up_through(
        &self,
        fs: &Fs,
        in_request: bool,
        through: u64,
    ) -> Result<usize> {
        let mut n = 0;
        // Appends of writes held back whose answer was lost before this read: a read to the
        // log's head that did not find them shows the engine never took them.
        let unanswered = self.behind.lock().last_unanswered();
        let at_head = |n| {
            if unanswered > 0 {
                self.behind.lock().forget_unanswered_through(unanswered);
            }
            Ok(n)
        };
        loop {
            self.still_whole()?;
            let after = self.applied.load(Ordering::SeqCst);
            if after >= through {
                return Ok(n);
            }
            let (mut got, head) = self.read_past_tip(after)?;
            let read = got.len();
            if got.first().is_some_and(|(first, _)| *first > through) {
                // A checkpoint trimmed changes this table lacks (and past `through`).
                self.reload(fs, in_request, got[0].0)?;
                continue;
            }
            got.retain(|(lsn, _)| *lsn <= through);
            // Appends sent before the read ended are answered, so those of its changes that
            // are this client's own are known as such (later ones come after what it read).
            // Counted after the read: an append sent while it waited for the engine may be
            // in it (and one whose answer was lost looks for itself in the log before it
            // counts as answered).
            let sent = self.ahead.lock().sent;
            {
                let mut a = self.ahead.lock();
                while a.answered < sent {
                    a = self.answered.wait(a);
                }
            }
            if got.is_empty() {
                // Nothing after this table's change, though the log's head is past it: a
                // checkpoint trimmed the changes between, and none came after it (a client
                // that joined while another wrote one). Else the table is up to date.
                if head.is_some_and(|h| h > after) {
                    // An append after the read, or a trim past this table with nothing
                    // after it: the log's next change says which (a checkpoint may be past
                    // this table while the log is not trimmed past it).
                    let next = self.engine.read_after(after, 1).map_err(engine_err)?;
                    if next.first().is_some_and(|(lsn, _)| *lsn == after + 1)
                        || self.reload_if_newer(fs, in_request, after)?
                    {
                        continue;
                    }
                }
                return at_head(n);
            }
            if got[0].0 != after + 1 {
                // A checkpoint trimmed changes this table lacks.
                self.reload(fs, in_request, got[0].0)?;
                continue;
            }
            self.apply(fs, &got, in_request)?;
            n += got.len();
            if read < READ_BATCH - 1 && read == got.len() {
                return at_head(n);
            }
        }
    }

    /// The log's entries after `after` (at most `READ_BATCH - 1`), once the entry at `after`
    /// (read with them) is found to be the one this table applied: a log that lost changes
    /// this table holds stops the client ([`State::lose`]), whether others appended past
    /// them since or not. With them, the log's head when it was read (where the entry at
    /// `after` is not known or gone).
    fn read_past_tip(&self, after: u64) -> Result<(Vec<Entry>, Option<u64>)> {
        let tip = self.tip.lock().clone().filter(|(lsn, _)| *lsn == after);
        let Some((_, applied_bytes)) = tip else {
            // Just joined or reloaded (the tip's bytes are not known): only the head tells.
            let got = self
                .engine
                .read_after(after, READ_BATCH - 1)
                .map_err(engine_err)?;
            let head = match got.is_empty() {
                true => Some(self.check_head(after)?),
                false => None,
            };
            return Ok((got, head));
        };
        let mut got = self
            .engine
            .read_after(after - 1, READ_BATCH)
            .map_err(engine_err)?;
        let head = match got.first() {
            Some((lsn, bytes)) if *lsn == after => {
                if *bytes != applied_bytes {
                    return Err(self.lose(format!(
                        "its change {after} is not the one this client applied"
                    )));
                }
                got.remove(0);
                None
            }
            // Gone: trimmed by a checkpoint (which never passes what every client applied
            // but one that joined as it was written), or lost.
            _ => Some(self.check_head(after)?),
        };
        Ok((got, head))
    }

    /// The engine's head; fails if its log ends before `applied`.
    fn check_head(&self, applied: u64) -> Result<u64> {
        let head = self.engine.head().map_err(engine_err)?;
        match head < applied {
            true => Err(self.lose(format!(
                "its log ends at change {head}, this client applied {applied}"
            ))),
            false => Ok(head),
        }
    }

    /// Loads the engine's checkpoint if it is past `applied` (the log was trimmed past this
    /// table); whether it did. A checkpoint not past it: the head moved with an append this
    /// read missed, which the next read finds.
    fn reload_if_newer(&self, fs: &Fs, in_request: bool, applied: u64) -> Result<bool> {
        match self.engine.checkpoint().map_err(engine_err)? {
            Some(c) if c.lsn > applied => {
                self.load_checkpoint(fs, in_request, c)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Fails (for good) if the engine lost changes this table holds.
    pub(super) fn still_whole(&self) -> Result<()> {
        match &*self.lost.lock() {
            Some(why) => Err(Error::new(libc::EIO, why.clone())),
            None => Ok(()),
        }
    }

    /// Fails if the engine gave a change of this client's place `lsn`, which this table had
    /// applied already when the change was sent (`applied`): its log went back.
    pub(super) fn check_place(&self, lsn: u64, applied: u64) -> Result<()> {
        match lsn <= applied {
            true => Err(self.lose(format!(
                "it gave this client's change place {lsn}, which this client applied already \
                 ({applied})"
            ))),
            false => Ok(()),
        }
    }

    /// Stops this client: the engine lost changes its table holds (Redis restarted from an
    /// AOF written every second or without one, or a replica was promoted before it had
    /// them). Going on would apply others' changes over ones the log no longer holds, and
    /// reuse inode numbers and versions; the error names what happened and what to do.
    fn lose(&self, what: String) -> Error {
        let why = format!(
            "the metadata engine lost changes this client had applied ({what}): {} restarted \
             without them or failed over to a replica that lacked them. This client stops \
             changing the volume; unmount it and mount again to go on from the engine's \
             history as it is now",
            self.engine.describe()
        );
        self.stop_for_good(why)
    }

    /// Stops this client for good (every change and catch-up fails with EIO naming `why`):
    /// its table holds what the engine does not, and going on would build on it.
    pub(super) fn stop_for_good(&self, why: String) -> Error {
        log::error!("shared volume: {why}");
        let why = self.lost.lock().get_or_insert(why).clone();
        Error::new(libc::EIO, why)
    }

    /// Replaces the table with the engine's checkpoint (under `catching`): this client fell
    /// behind the log's trim (its first change now is `first`).
    fn reload(&self, fs: &Fs, in_request: bool, first: u64) -> Result<()> {
        let c = self
            .engine
            .checkpoint()
            .map_err(engine_err)?
            .ok_or_else(|| {
                Error::new(
                    libc::EIO,
                    "the engine's log was trimmed, but it holds no checkpoint",
                )
            })?;
        if c.lsn + 1 < first {
            return Err(Error::new(
                libc::EIO,
                format!(
                    "the engine's log starts at change {first}, after its checkpoint ({})",
                    c.lsn
                ),
            ));
        }
        self.load_checkpoint(fs, in_request, c)
    }

    /// Replaces the table with checkpoint `c` (under `catching`).
    fn load_checkpoint(
        &self,
        fs: &Fs,
        in_request: bool,
        c: crate::engine::Checkpoint,
    ) -> Result<()> {
        let meta =
            engine_image::decode(&c.image, &self.config).map_err(|e| Error::new(libc::EIO, e))?;
        log::warn!(
            "shared volume: behind the engine's checkpoint (applied {}, checkpoint {}): \
             loading it",
            self.applied.load(Ordering::SeqCst),
            c.lsn
        );
        // Under the table's lock, with the table: this client's changes past the checkpoint
        // are read from the log again, as the new table lacks them.
        let told = fs.replace_followed_quietly_then(meta, || {
            // Writes held back go into the log first (read back from it below): the new
            // table lacks them too. No write is answered meanwhile (the table's lock).
            if let Err(e) = self.send_behind() {
                self.stop_for_good(format!(
                    "writes held back could not be appended before a checkpoint's load: {}",
                    e.message
                ));
            }
            self.ahead.lock().forget();
            *self.tip.lock() = None;
            self.applied.store(c.lsn, Ordering::SeqCst);
        });
        if in_request {
            let _ = self.notify.send(Notice::Tell(told));
        } else {
            fs.tell_followed(&told);
        }
        self.checkpointed.fetch_max(c.lsn, Ordering::SeqCst);
        // The image is the whole table (a partial one is whole from now on).
        self.whole.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Writes a checkpoint of this client's table to the engine once
    /// [`crate::config::SHARED_CHECKPOINT_EVERY`] changes were made since the last one; the
    /// engine trims its log, and the versions ([`MetaEngine::trim_versions`]), up to what
    /// every member has applied (the servers' floor; none is sent to the checkpoint by the
    /// trim) or the checkpoint's change if that is older; `when` says whether it is due
    /// (see [`Checkpointing`]). One client at a time writes one (the checkpoint's role, a
    /// turn: [`turns::CHECKPOINT_ROLE`]). Whether one was written.
    ///
    /// A due one waits for a quiet volume (every member has applied this client's last
    /// change, and none of its changes is under way: a pause between bursts, where its work
    /// slows no change), as it always did; once twice the changes are due it is written
    /// under steady changes too: it looks harder for a moment with none of this client's
    /// under way, and at last waits for those under way, holding new ones back while the
    /// image is taken ([`freeze_overdue`]). Before, it waited for a quiet volume whatever
    /// the changes since, which steady changes from two clients (each a poll behind the
    /// other) never gave: the log and the versions grew until the changes stopped.
    pub(super) fn checkpoint(
        &self,
        fs: &Fs,
        when: Checkpointing,
    ) -> std::result::Result<bool, String> {
        let applied = self.applied.load(Ordering::SeqCst);
        // Of the whole table only.
        if !self.is_whole() {
            return Ok(false);
        }
        let mut last = self.checkpointed.load(Ordering::SeqCst);
        if when == Checkpointing::IfDue && applied < last + self.checkpoint_every {
            return Ok(false);
        }
        let overdue = |last: u64| applied >= last + 2 * self.checkpoint_every;
        // Read before the table's change is: a floor lower than it may be, never higher.
        let floor = match when {
            Checkpointing::Forced => u64::MAX,
            _ => fs.data().pool().follower_floor(),
        };
        // A due checkpoint waits for a quiet volume (every member has applied this table: a
        // pause between bursts, when its work slows no change) until it is overdue.
        if when == Checkpointing::IfDue && !overdue(last) && applied > floor {
            return Ok(false);
        }
        // One client writes it; the others count from the one it wrote.
        let _role = match when {
            Checkpointing::Forced => None,
            _ => match CheckpointRole::take(self)? {
                Some(role) => Some(role),
                None => return Ok(false),
            },
        };
        if when == Checkpointing::IfDue {
            // Another client may have written one since (every client counts its own).
            if let Some(newest) = self.engine.checkpoint_lsn().map_err(|e| e.to_string())? {
                last = self
                    .checkpointed
                    .fetch_max(newest, Ordering::SeqCst)
                    .max(newest);
            }
            if applied < last + self.checkpoint_every {
                return Ok(false);
            }
        }
        let overdue = overdue(last);
        let frozen = match (when, overdue) {
            (Checkpointing::IfDue, false) => fs.try_freeze(),
            (Checkpointing::IfDue, true) => Some(freeze_overdue(fs)),
            _ => Some(fs.freeze()),
        };
        let Some(frozen) = frozen else {
            return Ok(false);
        };
        let one = self.catching.lock();
        // The image must not hold writes the log lacks (none is answered while frozen).
        self.send_behind().map_err(|e| e.message)?;
        if !self.ahead.lock().is_empty() {
            self.catch_up_alone(fs, true).map_err(|e| e.message)?;
        }
        let lsn = self.applied.load(Ordering::SeqCst);
        if !self.ahead.lock().is_empty()
            || (when == Checkpointing::IfDue && !overdue && lsn > floor)
        {
            return Ok(false); // another poll tries again
        }
        let trim = lsn.min(floor);
        let image = engine_image::encode(fs);
        drop(one);
        let bytes = image.len();
        self.engine
            .put_checkpoint(&crate::engine::Checkpoint { lsn, image }, trim)
            .map_err(|e| e.to_string())?;
        self.checkpointed.fetch_max(lsn, Ordering::SeqCst);
        drop(frozen);
        log::info!(
            "shared volume: checkpoint of change {lsn} written ({bytes} bytes), the log \
             trimmed up to change {trim}"
        );
        // The versions of keys no change after the trim touched go too: a client that
        // lags behind it is sent to catch up by the floor they leave.
        match self.engine.trim_versions(trim, touch::BIRTH_KEYS) {
            Ok(n) => log::info!("shared volume: {n} versions up to change {trim} trimmed"),
            Err(e) => log::warn!("shared volume: versions not trimmed (next checkpoint): {e}"),
        }
        Ok(true)
    }

    /// Applies changes read from the engine, but this client's own (under `catching`).
    fn apply(&self, fs: &Fs, got: &[(u64, Vec<u8>)], in_request: bool) -> Result<()> {
        let after = self.applied.load(Ordering::SeqCst);
        // Never past a gap: the changes between would be lost to this table.
        if let Some((first, _)) = got.first().filter(|(first, _)| *first != after + 1) {
            return Err(Error::new(
                libc::EIO,
                format!("the engine's change {first} follows this table's {after}"),
            ));
        }
        // Behind's lock before the ahead's, as an append takes them.
        self.settle_unanswered(&mut self.behind.lock(), got);
        let records = foreign(&self.ahead.lock(), got)?;
        // Directories other clients add names to or remove names from: not claimed unasked.
        for (_, changes) in &records {
            for dir in touch::dirs_named(changes) {
                self.contested(dir);
            }
        }
        let last = got.last().map_or(after, |(lsn, _)| *lsn);
        if in_request {
            let told = fs.apply_followed_quietly(&records)?;
            let _ = self.notify.send(Notice::Tell(told));
        } else {
            fs.apply_followed(&records)?;
        }
        if let Some((lsn, bytes)) = got.last() {
            *self.tip.lock() = Some((*lsn, bytes.clone()));
        }
        self.applied.store(last, Ordering::SeqCst);
        self.ahead.lock().applied(last);
        Ok(())
    }
}

/// How long an overdue checkpoint looks for a moment with no change under way before it
/// waits for those under way, holding new ones back: between one process's changes there is
/// such a moment every round trip, and holding changes back is for clients that never pause
/// (a change under way may wait seconds for a turn a frozen client holds, and every new one
/// would wait behind it).
const OVERDUE_LOOK: Duration = Duration::from_millis(100);

/// [`Fs::freeze`] for an overdue checkpoint: at the first moment no change is under way within
/// [`OVERDUE_LOOK`], else once those under way end.
fn freeze_overdue(fs: &Fs) -> crate::fs::Frozen<'_> {
    let until = Instant::now() + OVERDUE_LOOK;
    let mut pause = crate::sync::Backoff::new(Duration::from_micros(50), Duration::from_millis(2));
    while Instant::now() < until {
        if let Some(frozen) = fs.try_freeze() {
            return frozen;
        }
        pause.sleep();
    }
    fs.freeze()
}

/// The checkpoint's role held ([`turns::CHECKPOINT_ROLE`]): given back when dropped.
struct CheckpointRole<'a>(&'a State);

impl<'a> CheckpointRole<'a> {
    /// The role, unless another client holds it.
    fn take(s: &'a State) -> std::result::Result<Option<CheckpointRole<'a>>, String> {
        let lease = turns::CHECKPOINT_ROLE_LEASE;
        match s
            .engine
            .take_turn(&s.who, turns::CHECKPOINT_ROLE, lease, Duration::ZERO)
        {
            Ok(_) => Ok(Some(CheckpointRole(s))),
            Err(EngineError::TurnBusy { .. }) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }
}

impl Drop for CheckpointRole<'_> {
    fn drop(&mut self) {
        let s = self.0;
        if let Err(e) = s.engine.give_turns(&s.who, &[turns::CHECKPOINT_ROLE]) {
            // Its lease hands it on.
            log::warn!("shared volume: the checkpoint's role not given back: {e}");
        }
    }
}

/// When [`State::checkpoint`] writes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Checkpointing {
    /// The poller's: once due, at a quiet moment (or, once overdue, waiting for changes
    /// under way); the log trimmed up to what every member applied.
    IfDue,
    /// Now, as if overdue (tests): waiting for changes under way; trimmed as `IfDue`; none
    /// if another client holds the checkpoint's role.
    Due,
    /// Now, the log trimmed up to the checkpoint whoever lags (tests: clients sent to it).
    Forced,
}

pub(super) fn poll_loop(s: &State, fs: &Weak<Fs>) {
    while !s.stop.load(Ordering::SeqCst) {
        std::thread::park_timeout(crate::config::FOLLOW_POLL);
        if s.stop.load(Ordering::SeqCst) {
            return;
        }
        if s.paused.load(Ordering::SeqCst) {
            continue;
        }
        let Some(fs) = fs.upgrade() else {
            return;
        };
        if let Err(e) = poll_once(s, &fs, false) {
            log::warn!("shared volume: {e}");
        }
    }
}

/// One round of the poller (see the module doc). `wait`: a catch-up under way is waited for
/// rather than left to catch up alone (tests, which expect a round to catch up).
pub(super) fn poll_once(s: &State, fs: &Fs, wait: bool) -> std::result::Result<(), String> {
    if wait {
        // Tests pause the heartbeats' thread with the poller: a round they ask for beats.
        s.beat()?;
    }
    // Before the catch-up: what it brings (another client's refused drop) is settled after,
    // and the evicted clients' memory owed to the keeper is collected after.
    s.let_go_marks(fs);
    s.take_owed();
    let r = match wait {
        true => s.catch_up(fs, true).map(|_| ()),
        // Another catch-up under way does the work.
        false => match s.catching.try_lock() {
            Some(_one) => s.catch_up_alone(fs, true).map(|_| ()),
            None => Ok(()),
        },
    };
    r.map_err(|e| e.message)?;
    // A large volume's client other than its keeper holds what it uses (`keeper`).
    s.keeper_round(fs);
    if !s.wants_whole() {
        s.forget_let_go(fs);
    } else if let Err(e) = s.load_more(fs) {
        log::warn!(
            "shared volume: loading the namespace (again next round): {}",
            e.message
        );
    }
    s.settle_let_go(fs);
    s.collect_evicted(fs);
    let pool = fs.data().pool();
    let applied = s.applied.load(Ordering::SeqCst);
    pool.follow_at(applied);
    pool.release_frees(&s.gate, applied);
    // A checkpoint not written now is tried again at the next round; the rest of this one
    // goes on.
    if let Err(e) = s.checkpoint(fs, Checkpointing::IfDue) {
        log::warn!("shared volume: no checkpoint this round: {e}");
    }
    s.locks.retry_releases();
    s.evict_expired(pool)
}
