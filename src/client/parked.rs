//! Frees kept for a server that is not up: sent when it resumes this pool's session,
//! forgotten when it comes back without it (see [`Parked`]).

use super::health::Health;
use super::*;

/// Frees kept for a server's session (address, key), and which session that is: a free
/// parked by a late answer after the server came back without the session is dropped, so it
/// can never free an extent of the new session that happens to have the same address and
/// key (as verbs keys may, after a server restart).
#[derive(Default)]
pub(super) struct Parked {
    /// Bumped each time the server comes back without this pool's session.
    pub(super) session: u64,
    pub(super) frees: Vec<(u64, u64)>,
}

impl Parked {
    /// Keeps a free sent in `session`, unless that session is gone.
    pub(super) fn keep(&mut self, session: u64, addr: u64, rkey: u64) {
        if session == self.session {
            self.frees.push((addr, rkey));
        }
    }

    /// Keeps frees of extents of the current session.
    pub(super) fn keep_current(&mut self, extents: impl IntoIterator<Item = (u64, u64)>) {
        self.frees.extend(extents);
    }
}

/// The free of an extent on a server that is not up ([`Pool::free`]), asked while the frees
/// kept for it were `session`'s: kept for that session (sent if the server resumes it, or
/// with the next free if it resumed meanwhile), dropped if the server came back without it
/// (the memory went with the old process or lease, and a free kept would reach the new
/// session, where an extent may have the same address and key).
pub(super) fn park_free(
    health: &Mutex<Health>,
    unfreed: &Mutex<Parked>,
    session: u64,
    addr: u64,
    rkey: u64,
) {
    if health.lock().state != ServerState::Rejoining {
        unfreed.lock().keep(session, addr, rkey);
    }
}

/// A server came back without this pool's session ([`Rejoin::Empty`]): the frees kept for the
/// old session are forgotten, and the server waits (`Rejoining`) for [`Pool::admit`]. In one
/// step under the health lock: a free that sees the server down still has the old session's
/// number, and one that sees the new number sees it rejoining ([`park_free`]).
pub(super) fn forget_session(health: &Mutex<Health>, unfreed: &Mutex<Parked>) {
    let mut h = health.lock();
    {
        let mut parked = unfreed.lock();
        parked.session += 1;
        parked.frees.clear();
    }
    h.rejoining();
}

/// A server resumed this pool's session ([`Rejoin::Resumed`]): the frees kept while it was
/// down, taken out to be sent on the new link before it is up again.
pub(super) fn take_parked(health: &Mutex<Health>, unfreed: &Mutex<Parked>) -> Vec<(u64, u64)> {
    let _h = health.lock();
    std::mem::take(&mut unfreed.lock().frees)
}
