//! Test hooks of the journal (compiled only with the `testing` feature): commits held back,
//! a group torn between its copies, a checkpoint on demand, the committer stopped after a
//! commit.

use super::*;

/// Where a test holds the committer ([`VolumeJournal::stop_after_next_commit`]).
#[derive(Default)]
pub(super) struct CommitStop {
    state: Mutex<StopAfter>,
    changed: Condvar,
}

#[derive(Default, PartialEq)]
enum StopAfter {
    #[default]
    Run,
    Next,
    Stopped,
}

impl CommitStop {
    /// At the end of a commit: stops here if the next one was asked to, until let go.
    pub(super) fn here(&self) {
        let mut s = self.state.lock();
        if *s == StopAfter::Next {
            *s = StopAfter::Stopped;
            while *s == StopAfter::Stopped {
                s = self.changed.wait(s);
            }
        }
    }

    fn set(&self, to: StopAfter) {
        *self.state.lock() = to;
        self.changed.notify_all();
    }
}

impl VolumeJournal {
    /// Test hook: holds commits back (`true`) until released, so a test can crash the
    /// daemon between an operation and its commit.
    pub fn hold_commits(&self, hold: bool) {
        self.shared.pending.lock().held = hold;
        self.shared.wake.notify_all();
    }

    /// Test hook: a checkpoint and a fresh ring now (tests of followers across a new ring).
    pub fn checkpoint(&self) -> Result<()> {
        let mut w = self.shared.writer.lock();
        self.shared.checkpoint_now(&mut w)
    }

    /// Test hook: whoever makes the next commit stops once it has woken that commit's
    /// waiters (its frees already sent), until [`VolumeJournal::go_on`].
    pub fn stop_after_next_commit(&self) {
        self.shared.stop_after.set(StopAfter::Next);
    }

    /// Test hook: ends [`VolumeJournal::stop_after_next_commit`].
    pub fn go_on(&self) {
        self.shared.stop_after.set(StopAfter::Run);
    }

    /// Test hook: the next group is written whole to the first ring copy and only its first
    /// `bytes` to the others, then the journal stops, as a crash between the copies' writes.
    pub fn tear_next_group(&self, bytes: usize) {
        self.shared.pending.lock().tear = Some(bytes);
    }
}
