//! What tests do to the in-memory engine besides using it: volumes as older formats made
//! them, faults armed on its calls, claims' answers held back, a step run between a
//! listing and its answer, the log shortened as a Redis
//! that lost its last writes would, and what a test reads of it (log reads, turn holders).

use super::MemEngine;
use std::time::{Duration, Instant};

impl MemEngine {
    /// An engine holding a volume of format 1, as a build before format 2 made it (tests of
    /// the upgrade).
    pub fn format_1(servers: &[String]) -> MemEngine {
        let e = MemEngine::default();
        e.state.0.lock().servers = Some(servers.to_vec());
        e
    }

    /// An engine holding a volume of `format` (2 or later), as the build before the next
    /// format made it.
    pub fn of_format(format: u32, servers: &[String]) -> MemEngine {
        let e = MemEngine::format_1(servers);
        e.state.0.lock().format = Some(format);
        e
    }

    /// The volume as a build of `format` (before format 7) left it: the log kept, no state
    /// beside it (tests of the upgrade that writes it).
    pub fn without_state(&self, format: u32) {
        let mut s = self.state.0.lock();
        s.namespace.clear();
        s.state_writes.clear();
        s.whole = false;
        s.format = Some(format);
    }

    /// A mutant of the engine for the model checker to catch: versions trimmed read as
    /// never touched (0), not as the versions' floor.
    pub fn floorless(&self) {
        self.state.0.lock().floorless = true;
    }

    /// How many versions the engine keeps, exclusive and shared (tests of their trim).
    pub fn versions_kept(&self) -> usize {
        let s = self.state.0.lock();
        s.versions.len() + s.shared_versions.len()
    }

    /// Makes the next `times` calls of operation `op` (`"append"`, `"swap_locks"`,
    /// `"heartbeat"`, `"read_after"`, `"head"`) fail as an unreachable engine's would;
    /// `"append_answer"`: the next appends are taken, but fail as if their answer was lost.
    pub fn fail_next(&self, op: &'static str, times: u32) {
        self.state.0.lock().faults.insert(op, times);
    }

    /// Runs `then` once the next listing of the state's inodes is made, before it is
    /// answered (tests of what lands between a client's listing and what it does with it).
    pub fn after_state_listing(&self, then: impl FnOnce() + Send + 'static) {
        self.state.0.lock().after_listing = Some(Box::new(then));
    }

    /// Runs `then` once the next page of a directory's names is read, before it is answered
    /// (tests of a directory changed while its names are read a page at a time).
    pub fn after_names_page(&self, then: impl FnOnce() + Send + 'static) {
        self.state.0.lock().after_page = Some(Box::new(then));
    }

    /// How many times clients read the log (tests of what needs no catch-up).
    pub fn reads(&self) -> u64 {
        self.state.0.lock().reads
    }

    /// Appends of client `who` that claim a turn are taken, then wait to answer until
    /// [`MemEngine::release_claim_answers`] (tests of what happens while a claim's answer is
    /// on its way back).
    pub fn hold_claim_answers(&self, who: &str) {
        self.state.0.lock().claims_held_for = Some(who.to_string());
    }

    /// Waits until an append held by [`MemEngine::hold_claim_answers`] is waiting.
    pub fn wait_for_held_claim(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut s = self.state.0.lock();
        while s.claims_waiting == 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no append claiming a turn came in 30 s");
            s = self.state.1.wait_timeout(s, left).0;
        }
    }

    /// Lets the held appends answer.
    pub fn release_claim_answers(&self) {
        self.state.0.lock().claims_held_for = None;
        self.state.1.notify_all();
    }

    /// The client holding inode `ino`'s turn now, if any.
    pub fn turn_holder(&self, ino: u64) -> Option<String> {
        let s = self.state.0.lock();
        s.turns
            .get(&ino)
            .filter(|(_, until)| *until > Instant::now())
            .map(|(h, _)| h.clone())
    }

    /// Takes `away` for [`crate::engine::ENGINE_AWAY`] (tests of an engine away, in less time).
    pub fn with_away(self, away: Duration) -> MemEngine {
        self.state.0.lock().away = Some(away);
        self
    }

    /// Loses the last `k` changes of the log, as a Redis that restarted from an AOF written
    /// every second, or a replica promoted before it had them, does: the head goes back, and
    /// so do the versions those changes set.
    pub fn lose_last(&self, k: u64) {
        let mut s = self.state.0.lock();
        let head = s.head.saturating_sub(k);
        s.log.retain(|lsn, _| *lsn <= head);
        s.head = head;
        s.versions.retain(|_, v| *v <= head);
        s.shared_versions.retain(|_, v| *v <= head);
        s.version_floor = s.version_floor.min(head);
        // The state as of the new head: its writes after it are lost with the changes.
        s.state_writes.retain(|(lsn, _)| *lsn <= head);
        let mut namespace = crate::engine::StateDump::new();
        for (lsn, ops) in &s.state_writes {
            crate::engine::state::apply(&mut namespace, *lsn, ops);
        }
        s.namespace = namespace;
    }
}
