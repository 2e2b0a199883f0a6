//! The in-process fabric, for tests: same semantics as the others (keys, bounds and access
//! checks, asynchronous completions), plus what tests need and a real network cannot give on
//! demand: op counters, and fault injection (fail the Nth operation a node serves, delay every
//! operation, drop the peer).
//!
//! A [`LocalNetwork`] joins nodes; each node is a [`LocalFabric`] with its own key registry. A
//! server's node answers the control-channel `Connect` with its node id, and a client's queue
//! pair then executes operations by copying between the two nodes' registered memory on a
//! worker thread (so completions arrive asynchronously, as from a NIC).

use super::{
    CompletionQueue, Exchange, Fabric, FabricError, InFlight, PeerGuard, QueuePair, Registry,
    SessionKey, Token, WcStatus, WorkRequest,
};
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{Arc, Mutex, Weak};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::thread;
use std::time::Duration;

/// Nodes that can reach each other.
#[derive(Default)]
pub struct LocalNetwork {
    nodes: Mutex<HashMap<u64, Weak<Node>>>,
    next_id: AtomicU64,
}

/// Faults a node injects into the operations it serves.
#[derive(Debug, Default)]
pub struct Faults {
    /// 1-based index of the served operation that fails (0: none).
    fail_nth: AtomicU64,
    fail_status_remote: AtomicBool,
    /// Delay before executing each operation, in microseconds.
    delay_us: AtomicU64,
    /// The node is gone: every operation against it is a transport error.
    dead: AtomicBool,
    served: AtomicU64,
    /// Behave as a device that issues its own keys (verbs): a backed server's restart cannot
    /// bring old keys back ([`Fabric::chooses_keys`]).
    issues_keys: AtomicBool,
}

struct Node {
    id: u64,
    registry: Arc<Registry>,
    faults: Faults,
}

/// One node of a [`LocalNetwork`]: a fabric instance with its own protection domain.
pub struct LocalFabric {
    node: Arc<Node>,
    network: Arc<LocalNetwork>,
}

impl LocalNetwork {
    pub fn new() -> Arc<LocalNetwork> {
        Arc::new(LocalNetwork::default())
    }

    /// Adds a node.
    pub fn node(self: &Arc<Self>) -> Arc<LocalFabric> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let node = Arc::new(Node {
            id,
            registry: Arc::new(Registry::new()),
            faults: Faults::default(),
        });
        self.nodes.lock().insert(id, Arc::downgrade(&node));
        Arc::new(LocalFabric {
            node,
            network: self.clone(),
        })
    }

    fn find(&self, id: u64) -> Option<Arc<Node>> {
        self.nodes.lock().get(&id).and_then(Weak::upgrade)
    }
}

impl LocalFabric {
    /// Operations this node has served as a target.
    pub fn served(&self) -> u64 {
        self.node.faults.served.load(Ordering::SeqCst)
    }

    /// Makes the `n`th operation served from now on fail (remote access or transport error).
    pub fn fail_nth(&self, n: u64, remote_access: bool) {
        let base = self.node.faults.served.load(Ordering::SeqCst);
        self.node
            .faults
            .fail_status_remote
            .store(remote_access, Ordering::SeqCst);
        self.node.faults.fail_nth.store(base + n, Ordering::SeqCst);
    }

    /// Delays every operation this node serves.
    pub fn set_delay(&self, delay: Duration) {
        self.node
            .faults
            .delay_us
            .store(delay.as_micros() as u64, Ordering::SeqCst);
    }

    /// From now on the node's keys are its "device's" choice, as on verbs
    /// ([`Fabric::chooses_keys`] false).
    pub fn issue_own_keys(&self) {
        self.node.faults.issues_keys.store(true, Ordering::SeqCst);
    }

    /// Drops the node off the network (a crashed server): every operation against it fails with
    /// a transport error from now on.
    pub fn kill(&self) {
        self.node.faults.dead.store(true, Ordering::SeqCst);
    }

    pub fn is_dead(&self) -> bool {
        self.node.faults.dead.load(Ordering::SeqCst)
    }
}

impl Fabric for LocalFabric {
    fn registry(&self) -> &Arc<Registry> {
        &self.node.registry
    }

    fn name(&self) -> &'static str {
        "local"
    }

    fn chooses_keys(&self) -> bool {
        !self.node.faults.issues_keys.load(Ordering::SeqCst)
    }

    fn connect(
        &self,
        server: SocketAddr,
        exchange: &mut Exchange<'_>,
        cq: Arc<CompletionQueue>,
        token: &Token,
    ) -> Result<Arc<dyn QueuePair>, FabricError> {
        let blob = exchange(Vec::new())?;
        let id = <[u8; 8]>::try_from(blob.as_slice())
            .map(u64::from_le_bytes)
            .map_err(|_| FabricError::Handshake {
                addr: server,
                reason: "expected an 8-byte node id".into(),
            })?;
        let target = self
            .network
            .find(id)
            .ok_or_else(|| FabricError::Handshake {
                addr: server,
                reason: format!("node {id} is not on this local network"),
            })?;
        // All zeros: no session (tests that skip the control handshake); anything else must be
        // a live session of the target, whose fence ends this QP's service.
        let live = if token.iter().all(|&b| b == 0) {
            None
        } else {
            Some(
                target
                    .registry
                    .live_session(token)
                    .ok_or_else(|| FabricError::Handshake {
                        addr: server,
                        reason: "no live session has this token".into(),
                    })?,
            )
        };
        let session = live
            .as_ref()
            .map_or(super::registry::SessionAccess::full(0), |l| l.access);
        let (tx, rx) = crossbeam_channel::unbounded::<(WorkRequest, InFlight)>();
        let shared = Arc::new(LocalQpShared {
            initiator: self.node.clone(),
            target,
            session,
            live,
            cq,
            disconnected: AtomicBool::new(false),
        });
        let s = shared.clone();
        thread::Builder::new()
            .name("local-qp".into())
            .spawn(move || {
                while let Ok((wr, hold)) = rx.recv() {
                    s.execute(wr, hold);
                }
            })
            .map_err(|e| FabricError::Register(format!("spawn QP thread: {e}")))?;
        Ok(Arc::new(LocalQp {
            shared,
            tx: Mutex::new(Some(tx)),
        }))
    }

    fn accept(
        &self,
        _blob: &[u8],
        _listen: SocketAddr,
        session: SessionKey,
    ) -> Result<(Vec<u8>, PeerGuard), FabricError> {
        let guard = self.node.registry.open_session(session);
        Ok((self.node.id.to_le_bytes().to_vec(), Box::new(guard)))
    }
}

struct LocalQpShared {
    initiator: Arc<Node>,
    target: Arc<Node>,
    /// The session this QP's requests are served as on the target, and (unless it is the
    /// no-session of tests) its live state: each request is served under it.
    session: super::registry::SessionAccess,
    live: Option<Arc<super::LiveSession>>,
    cq: Arc<CompletionQueue>,
    disconnected: AtomicBool,
}

impl LocalQpShared {
    fn complete(&self, wr: &WorkRequest, status: WcStatus, hold: Option<InFlight>) {
        self.initiator.registry.complete(&self.cq, wr, status, hold);
    }

    fn execute(&self, wr: WorkRequest, hold: InFlight) {
        let faults = &self.target.faults;
        let delay = faults.delay_us.load(Ordering::SeqCst);
        if delay > 0 {
            thread::sleep(Duration::from_micros(delay));
        }
        if faults.dead.load(Ordering::SeqCst) || self.disconnected.load(Ordering::SeqCst) {
            self.complete(&wr, WcStatus::TransportError, Some(hold));
            return;
        }
        let n = faults.served.fetch_add(1, Ordering::SeqCst) + 1;
        if n == faults.fail_nth.load(Ordering::SeqCst) {
            let status = if faults.fail_status_remote.load(Ordering::SeqCst) {
                WcStatus::RemoteAccessError
            } else {
                WcStatus::TransportError
            };
            self.complete(&wr, status, Some(hold));
            return;
        }
        // A fenced session serves nothing more; its fence waits for a copy already begun.
        let serving = match &self.live {
            Some(live) => match live.serve() {
                Some(s) => Some(s),
                None => {
                    self.disconnected.store(true, Ordering::SeqCst);
                    self.complete(&wr, WcStatus::TransportError, Some(hold));
                    return;
                }
            },
            None => None,
        };
        let Some(remote) = self.target.registry.admit_remote(
            self.session,
            wr.opcode,
            wr.rkey,
            wr.remote_addr,
            wr.local.len,
        ) else {
            self.complete(&wr, WcStatus::RemoteAccessError, Some(hold));
            return;
        };
        let (src, dst) = match wr.opcode {
            super::Opcode::Read => (wr.remote_addr, wr.local.addr),
            super::Opcode::Write => (wr.local.addr, wr.remote_addr),
        };
        // SAFETY: both ranges were checked against live registrations (`hold` locally with the
        // access the opcode needs, `remote` on the target), and both holds keep them registered
        // and their memory alive during the copy. `ptr::copy` tolerates overlap (a node may
        // target its own memory).
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, wr.local.len as usize) };
        drop(remote);
        drop(serving);
        self.complete(&wr, WcStatus::Success, Some(hold));
    }
}

/// A queue pair of the in-process fabric.
pub struct LocalQp {
    shared: Arc<LocalQpShared>,
    tx: Mutex<Option<crossbeam_channel::Sender<(WorkRequest, InFlight)>>>,
}

impl QueuePair for LocalQp {
    fn post(&self, wrs: &[WorkRequest]) {
        let tx = self.tx.lock().clone();
        for wr in wrs {
            let s = &self.shared;
            let Some(hold) = s.initiator.registry.admit(&s.cq, wr) else {
                continue;
            };
            match &tx {
                Some(tx) => {
                    if let Err(crossbeam_channel::SendError((wr, hold))) = tx.send((*wr, hold)) {
                        self.shared
                            .complete(&wr, WcStatus::TransportError, Some(hold));
                    }
                }
                None => self
                    .shared
                    .complete(wr, WcStatus::TransportError, Some(hold)),
            }
        }
    }

    fn is_connected(&self) -> bool {
        !self.shared.disconnected.load(Ordering::SeqCst)
            && !self.shared.target.faults.dead.load(Ordering::SeqCst)
    }

    fn disconnect(&self) {
        self.shared.disconnected.store(true, Ordering::SeqCst);
        self.tx.lock().take();
    }
}

impl Drop for LocalQp {
    fn drop(&mut self) {
        self.disconnect();
    }
}
