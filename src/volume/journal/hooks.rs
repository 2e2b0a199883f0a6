//! Test hooks of the journal (compiled only with the `testing` feature): commits held back,
//! a group torn between its copies, a checkpoint on demand, the committer stopped after a
//! commit.

use super::*;

/// Where a test holds the committer ([`VolumeJournal::stop_after_next_commit`]).
#[derive(PartialEq)]
pub(super) enum StopAfter {
    Run,
    Next,
    Stopped,
}

impl Shared {
    /// The test hook of [`VolumeJournal::stop_after_next_commit`].
    pub(super) fn stop_here_if_asked(&self) {
        let mut s = self.stop_after.lock();
        if *s == StopAfter::Next {
            *s = StopAfter::Stopped;
            while *s == StopAfter::Stopped {
                s = self.stop_after_cv.wait(s);
            }
        }
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
        *self.shared.stop_after.lock() = StopAfter::Next;
    }

    /// Test hook: ends [`VolumeJournal::stop_after_next_commit`].
    pub fn go_on(&self) {
        *self.shared.stop_after.lock() = StopAfter::Run;
        self.shared.stop_after_cv.notify_all();
    }

    /// Test hook: the next group is written whole to the first ring copy and only its first
    /// `bytes` to the others, then the journal stops, as a crash between the copies' writes.
    pub fn tear_next_group(&self, bytes: usize) {
        self.shared.pending.lock().tear = Some(bytes);
    }
}
