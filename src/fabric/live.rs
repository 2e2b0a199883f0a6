//! A client session as the data path serves it, so that a fence stops what it had admitted
//! (see [`LiveSession`]). The registry keeps one per live token; the TCP and in-process
//! fabrics serve each request under it.

use super::registry::SessionAccess;
use crate::sync::{Arc, Condvar, Mutex};
use std::collections::HashMap;

/// A session as its data connections are served: what as, and whether it still stands. A
/// fence (the guard's drop: a takeover, an eviction, the control session's end) must stop
/// what a connection admitted before it, not only what comes after: a request's header is
/// checked once and its payload may trickle in for up to the op timeout, so a stale holder's
/// WRITE admitted before the fence would land over the new holder's bytes. So every request
/// is served under [`LiveSession::serve`], and the fence cuts the session's connections
/// and waits until none is served any more.
pub struct LiveSession {
    pub access: SessionAccess,
    state: Mutex<LiveState>,
    idle: Condvar,
}

#[derive(Default)]
struct LiveState {
    fenced: bool,
    /// Guards that keep the session registered: one per data path the control session set
    /// up; the last one's drop fences it.
    guards: u32,
    /// Requests being served now.
    serving: u32,
    /// How to cut each data connection of the session (by the fabric's connection id).
    cutters: HashMap<u64, Box<dyn Fn() + Send>>,
}

impl std::fmt::Debug for LiveSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveSession")
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

/// One request being served for a session (see [`LiveSession::serve`]).
pub struct Serving(Arc<LiveSession>);

impl Drop for Serving {
    fn drop(&mut self) {
        let mut st = self.0.state.lock();
        st.serving -= 1;
        if st.serving == 0 {
            self.0.idle.notify_all();
        }
    }
}

impl LiveSession {
    /// A session standing, with its first guard.
    pub(super) fn new(access: SessionAccess) -> Arc<LiveSession> {
        Arc::new(LiveSession {
            access,
            state: Mutex::new(LiveState {
                guards: 1,
                ..LiveState::default()
            }),
            idle: Condvar::new(),
        })
    }

    /// Serves one request, unless the session was fenced.
    pub fn serve(self: &Arc<Self>) -> Option<Serving> {
        let mut st = self.state.lock();
        if st.fenced {
            return None;
        }
        st.serving += 1;
        Some(Serving(self.clone()))
    }

    /// One more guard for a standing session; false if its last guard is gone.
    pub(super) fn join(&self) -> bool {
        let mut st = self.state.lock();
        if st.fenced || st.guards == 0 {
            return false;
        }
        st.guards += 1;
        true
    }

    /// One guard fewer; true for the last, after which the session can no longer be joined.
    pub(super) fn leave(&self) -> bool {
        let mut st = self.state.lock();
        st.guards -= 1;
        if st.guards == 0 {
            st.fenced = true;
            return true;
        }
        false
    }

    /// Keeps `cut` to end data connection `id` at the fence; false if fenced already.
    pub fn on_fence(&self, id: u64, cut: Box<dyn Fn() + Send>) -> bool {
        let mut st = self.state.lock();
        if st.fenced {
            return false;
        }
        st.cutters.insert(id, cut);
        true
    }

    /// Connection `id` ended on its own.
    pub fn forget(&self, id: u64) {
        self.state.lock().cutters.remove(&id);
    }

    /// Fences the session: nothing more is served, its connections are cut, and this returns
    /// once no request admitted before is still being served.
    pub(super) fn fence(&self) {
        let cutters = {
            let mut st = self.state.lock();
            st.fenced = true;
            std::mem::take(&mut st.cutters)
        };
        for cut in cutters.values() {
            cut();
        }
        let start = std::time::Instant::now();
        let mut st = self.state.lock();
        while st.serving > 0 {
            // A cut connection fails its request at once; the warning says if one does not.
            st = self
                .idle
                .wait_timeout(st, std::time::Duration::from_secs(1))
                .0;
            if st.serving > 0 && start.elapsed() > crate::config::OP_TIMEOUT {
                log::warn!(
                    "session {}: {} request(s) still served {:?} after its fence",
                    self.access.session,
                    st.serving,
                    start.elapsed()
                );
            }
        }
    }
}
