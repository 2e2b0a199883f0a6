//! The client side of the memory pool: connections to a list of memory servers, placement of
//! allocations across them by free capacity, and one-sided reads and writes of remote extents.
//!
//! Each server has a control connection (allocation, free, capacity) and a fabric queue pair
//! (data). All queue pairs share one completion queue whose completions are handed, in the
//! fabric's completion context, to the batch they belong to, which wakes its waiter: no
//! reaping thread sits between the network and the caller. Failures name the server: a transport error marks that
//! server failed, and later operations on its extents fail at once instead of waiting again.
//!
//! A failed server is not given up for good: [`Pool::try_reconnect`] (called with backoff by
//! the mount's upkeep thread) opens new connections and asks the server to resume the old
//! session. A server that still holds it (a link flap, a pause, within its lease) is up again
//! with every extent intact, and the extents this pool let go of meanwhile are freed there;
//! a server that does not (a new process, an expired lease) comes back empty and is only
//! admitted once the caller has forgotten every copy it listed on it ([`Pool::admit`]).

mod alloc;
mod batch;
pub mod control;
mod error;
pub mod follow;
pub mod frrwp;
mod health;
mod members;
mod parked;
mod stock;
pub mod volume;

use crate::auth::Secret;
use crate::fabric::{
    Completion, CompletionQueue, Fabric, FabricError, Opcode, QueuePair, RemoteRegion, ServerId,
    Sge, WcStatus, WorkRequest,
};
use crate::proto::{Capacity, Message, RefusalCode};
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{Arc, Condvar, Mutex};
use alloc::FreesOut;
use batch::{Batch, Dispatch, BATCH_INDEX_BITS};
use control::ControlConn;
pub use error::PoolError;
use health::{open_link, Server};
use members::{new_server, Members};
pub use members::{Held, MAX_SERVERS};
use parked::park_free;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

/// Client settings.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Shown in server logs.
    pub client_name: String,
    /// Connect and control-reply timeout.
    pub timeout: Duration,
    /// The shared secret the servers hold (none: servers without one).
    pub secret: Secret,
    /// On a fabric that delivers completions from its own threads (tcp), a small batch's
    /// waiter spins up to [`SPIN_WAIT`] for them before it sleeps (`mount --busy-poll`): one
    /// thread wake-up fewer per small op, for a core spent spinning.
    pub busy_poll: bool,
    /// The volume this pool holds (none: a private pool whose extents die with it).
    pub volume: Option<volume::VolumeSpec>,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            client_name: format!("rmemfs-{}", std::process::id()),
            timeout: crate::config::OP_TIMEOUT,
            secret: Secret::none(),
            busy_poll: false,
            volume: None,
        }
    }
}

/// Where a server stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerState {
    /// Serving.
    Up,
    /// Failed (dead, frozen, cut off, or it broke a connection); the pool keeps trying to
    /// reconnect.
    Down,
    /// Reconnected, but it did not hold this pool's session any more (a new process, or the
    /// lease ran out): not used until every copy listed on it is forgotten ([`Pool::admit`]).
    Rejoining,
    /// Drained and removed by an admin (`rmemfs admin remove`): never used again.
    Removed,
}

/// One live server's room for new extents as last heard ([`Pool::room`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    /// Free bytes, with this pool's stock there.
    pub free: u64,
    /// No extent longer than this fits (the largest free extent, with the stock that may
    /// join it when given back).
    pub largest_free: u64,
}

/// What the pool knows of one server.
#[derive(Debug, Clone)]
pub struct ServerStatus {
    pub id: ServerId,
    pub addr: SocketAddr,
    pub capacity: Capacity,
    /// Not up (down or rejoining).
    pub failed: bool,
    pub state: ServerState,
    /// When it entered that state.
    pub since: SystemTime,
    /// Times it went down since the pool connected.
    pub downs: u64,
    /// Out of placement (`rmemfs admin drain`): what it holds is being moved off.
    pub draining: bool,
}

/// How a failed server came back ([`Pool::try_reconnect`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejoin {
    /// It still held this pool's session: up again, every extent intact.
    Resumed { extents: u64, bytes: u64 },
    /// It holds nothing of ours: the caller forgets every copy on it, then [`Pool::admit`]s it.
    Empty,
    /// It still held this pool's session, restarted from its backing file on a fabric whose
    /// device issues keys: every extent has a new key (by address). The caller gives its
    /// copies and places there the new keys, then [`Pool::admit`]s it.
    Rekeyed {
        keys: std::collections::HashMap<u64, u64>,
    },
    /// It still held this pool's session, restored from a backing file that may hold less
    /// than was written to it (a restart after a power loss): a copy there may be older than
    /// the chunk's others. The caller lets go of every copy there that a chunk has others for
    /// (the rebuild makes new ones), keeps the rest (the best there is; under their new keys
    /// if `keys`), then [`Pool::admit`]s it.
    Behind {
        keys: Option<std::collections::HashMap<u64, u64>>,
    },
}

/// One one-sided operation on a remote extent: `local.len` bytes at `offset` into `remote`.
#[derive(Debug, Clone, Copy)]
pub struct RemoteOp {
    pub opcode: Opcode,
    pub local: Sge,
    pub remote: RemoteRegion,
    pub offset: u64,
}

/// A connected pool of memory servers.
/// The kinds of fabric batch whose latency (post to last completion) the pool keeps:
/// reads, writes to allocated memory, writes that include conditional writes to fresh
/// memory (FRRWP), and batches of both reads and writes.
pub const BATCH_KINDS: [&str; 4] = ["read", "write", "write_fresh", "mixed"];

pub struct Pool {
    fabric: Arc<dyn Fabric>,
    /// Latencies of finished batches by [`BATCH_KINDS`] (`stats`, metrics).
    batch_latency: crate::requests::RequestStats,
    servers: Members,
    /// Bumped when a server joins, is drained or removed (see [`Pool::generation`]).
    membership: AtomicU64,
    /// Shared by every queue pair, reconnected ones included.
    cq: Arc<CompletionQueue>,
    config: PoolConfig,
    dispatch: Arc<Dispatch>,
    next_batch: AtomicU64,
    /// How long a batch may make no progress before its unanswered allocations are given up.
    timeout: Duration,
    /// The volume's claims, by server (empty without a volume).
    claims: Mutex<Vec<volume::Claim>>,
    /// Why this pool's volume is no longer its own (another daemon took it over).
    fenced: Mutex<Option<String>>,
    /// Frees held back until the journal commits ([`volume::FreeGate`]).
    free_gate: Mutex<Option<Arc<volume::FreeGate>>>,
}

impl Pool {
    /// Connects to every server (control connection and fabric queue pair). Any server that
    /// cannot be reached fails the whole connect with an error naming it.
    pub fn connect(
        fabric: Arc<dyn Fabric>,
        addrs: &[SocketAddr],
        config: &PoolConfig,
    ) -> Result<Pool, PoolError> {
        if addrs.is_empty() {
            return Err(PoolError::Invalid("no memory servers given".into()));
        }
        let dispatch = Arc::new(Dispatch {
            batches: Mutex::new(HashMap::new()),
        });
        let d = dispatch.clone();
        let cq = fabric.create_cq_with_handler(Arc::new(move |c| d.deliver(c)));
        let mut servers = Vec::with_capacity(addrs.len());
        let mut claims = Vec::new();
        let mut plan = match &config.volume {
            Some(spec) => Some(volume::plan_claims(addrs, config, spec)?),
            None => None,
        };
        for (i, &addr) in addrs.iter().enumerate() {
            let claim = plan.as_ref().map(|(modes, epoch)| (modes[i], *epoch));
            let health::Opened { link, claimed, .. } =
                open_link(&fabric, &cq, config, addr, None, claim)?;
            if let (Some(c), Some((_, epoch))) = (claimed, plan.as_mut()) {
                *epoch = (*epoch).max(c.epoch);
                claims.push(c);
            }
            servers.push(new_server(ServerId(i as u32), addr, link));
        }
        Ok(Pool {
            fabric,
            batch_latency: crate::requests::RequestStats::with_ops(&BATCH_KINDS),
            servers: Members::new(servers),
            membership: AtomicU64::new(0),
            cq,
            config: config.clone(),
            dispatch,
            next_batch: AtomicU64::new(1),
            timeout: config.timeout,
            claims: Mutex::new(claims),
            fenced: Mutex::new(None),
            free_gate: Mutex::new(None),
        })
    }

    /// Latencies of the fabric batches finished so far, by kind ([`BATCH_KINDS`]).
    pub fn batch_latency(&self) -> Vec<crate::requests::OpSummary> {
        self.batch_latency.summary()
    }

    pub fn fabric(&self) -> &Arc<dyn Fabric> {
        &self.fabric
    }

    /// The control timeout (connects, replies, stalled conditional writes).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn server(&self, id: ServerId) -> Result<&Server, PoolError> {
        self.servers
            .get(id.0 as usize)
            .ok_or_else(|| PoolError::Invalid(format!("no {id} in this pool")))
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        for s in self
            .servers
            .iter()
            .filter(|s| s.state() != ServerState::Removed)
        {
            let link = s.link();
            // An unmount: the server frees this pool's extents now rather than keep them
            // for a lease.
            if !s.failed.load(Ordering::SeqCst) {
                link.control.goodbye();
            }
            link.qp.disconnect();
            link.control.kill();
        }
    }
}

#[cfg(all(test, feature = "shuttle"))]
mod model_tests;
