//! A running client's levers: what the mount and tests ask of it now (a poll, a checkpoint,
//! the digest of the engine's state) and what tests hold still (its poller, its lingering
//! thread, its held writes). Each runs what the client's own threads run, at once.

use super::*;

impl SharedClient {
    /// The digest of the table the engine's state holds beside its log
    /// ([`crate::meta::Meta::digest_by_names`]): once this client is caught up with a volume
    /// no client changes, its own ([`Fs::namespace_digest`]).
    pub fn engine_state_digest(&self) -> std::result::Result<crate::meta::Digest, String> {
        self.state.state_digest().map_err(|e| e.message)
    }

    /// One round of the poller now (tests): it catches up unless a change is under way.
    pub fn poll_now(&self) -> std::result::Result<(), String> {
        let fs = self.fs.upgrade().ok_or("the file system is gone")?;
        poll_once(&self.state, &fs, true)
    }

    /// Stops (or resumes) the poller's own rounds: no catch-up, no heartbeat (a test freezing
    /// a client).
    #[cfg(feature = "testing")]
    pub fn pause(&self, paused: bool) {
        self.state.paused.store(paused, Ordering::SeqCst);
    }

    /// Whether writes may be held back ([`behind`]): off, each is appended at once (tests).
    #[cfg(feature = "testing")]
    pub fn hold_writes(&self, on: bool) {
        self.state.hold_writes.store(on, Ordering::SeqCst);
    }

    /// Stops (or resumes) the lingering thread's give-backs and sends of held writes: what a
    /// test holds back stays held until a request of its own sends it, however slow the
    /// test runs.
    #[cfg(feature = "testing")]
    pub fn pause_linger(&self, paused: bool) {
        self.state.linger_paused.store(paused, Ordering::SeqCst);
    }

    /// Rounds the lingering thread has ended (a round ends after handling what it heard: two
    /// rounds ended after a turn was asked for have handled the ask).
    #[cfg(feature = "testing")]
    pub fn linger_rounds(&self) -> u64 {
        self.state.linger_rounds.load(Ordering::SeqCst)
    }

    /// How long an append whose answer was lost waits for the engine's log to say whether it
    /// was taken ([`LOST_ANSWER_WAIT`]; zero: one read, tests of what follows when it cannot).
    #[cfg(feature = "testing")]
    pub fn lost_answer_wait(&self, wait: Duration) {
        self.state
            .lost_answer_wait_ms
            .store(wait.as_millis() as u64, Ordering::SeqCst);
    }

    /// A checkpoint of this client's table now, the log trimmed up to it whoever lags
    /// (tests; the poller writes them on its own).
    pub fn checkpoint_now(&self) -> std::result::Result<(), String> {
        let fs = self.fs.upgrade().ok_or("the file system is gone")?;
        self.load_whole(&fs)?;
        self.state
            .checkpoint(&fs, catchup::Checkpointing::Forced)
            .map(|_| ())
    }

    /// A checkpoint of this client's table now, the log trimmed as the poller's would be (up
    /// to what every member has applied); whether one was written (tests).
    pub fn checkpoint_as_due(&self) -> std::result::Result<bool, String> {
        let fs = self.fs.upgrade().ok_or("the file system is gone")?;
        self.load_whole(&fs)?;
        self.state.checkpoint(&fs, catchup::Checkpointing::Due)
    }

    /// Loads the rest of the namespace now, as the poller does over its rounds (a checkpoint
    /// is of the whole table).
    fn load_whole(&self, fs: &Fs) -> std::result::Result<(), String> {
        self.state.load_whole(fs).map_err(|e| e.message)
    }

    /// Whether this client's table holds the whole namespace (a client that joined loads it
    /// as it is used, and the rest in the background unless the volume is large and
    /// another client keeps it: [`keeper`]).
    pub fn is_whole(&self) -> bool {
        self.state.is_whole()
    }

    /// Appends a birth of server `server` as a client that found it restarted would (tests:
    /// a restart this client's own changes have not seen yet); its place in the log.
    #[cfg(feature = "testing")]
    pub fn append_birth(&self, server: u32, birth: &[u8]) -> std::result::Result<u64, String> {
        self.state
            .append_birth(server, birth, false)
            .map_err(|e| e.to_string())
    }

    /// This client's session name.
    pub fn who(&self) -> &str {
        &self.state.who
    }

    /// The last change this client's table holds.
    pub fn applied(&self) -> u64 {
        self.state.applied.load(Ordering::SeqCst)
    }
}
