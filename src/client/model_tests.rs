//! Model-checked races of the pool (shuttle): batch completion across servers, a server
//! rejoining while rebuild and heal run, frees and their cap.

use super::health::{back_up, Health};
use super::parked::{forget_session, take_parked, Parked};
use super::*;
use crate::meta::{Chunk, Replica};
use crate::sync::thread;

fn completion(batch: u64, index: usize, status: WcStatus) -> Completion {
    let wr = WorkRequest {
        wr_id: (batch << BATCH_INDEX_BITS) | index as u64,
        opcode: Opcode::Read,
        local: Sge {
            addr: 0,
            len: 8,
            lkey: 1,
        },
        remote_addr: 0,
        rkey: 1,
    };
    Completion::new(&wr, status, None)
}

/// A batch spread over two servers: each server's completion context delivers its
/// members (one of them a refusal) while the waiter waits. The waiter wakes exactly when
/// the last member is in, never before (no lost or early wake-up in any interleaving), and
/// sees the first failure by op index whatever order they arrived in.
#[test]
fn model_batch_completion_across_servers() {
    shuttle::check_random(
        || {
            let dispatch = Arc::new(Dispatch {
                batches: Mutex::new(HashMap::new()),
            });
            let batch = Arc::new(Batch::new(4));
            dispatch.batches.lock().insert(7, batch.clone());
            let server_a = {
                let d = dispatch.clone();
                thread::spawn(move || {
                    d.deliver(completion(7, 0, WcStatus::Success));
                    d.deliver(completion(7, 3, WcStatus::RemoteAccessError));
                })
            };
            let server_b = {
                let d = dispatch.clone();
                thread::spawn(move || {
                    d.deliver(completion(7, 2, WcStatus::TransportError));
                    d.fail(7, 1, PoolError::Invalid("allocation refused".into()));
                })
            };
            let (failure, refused) = batch.wait(Duration::from_secs(3600), &|| {});
            assert_eq!(
                batch.state.lock().remaining,
                0,
                "woke before the last member"
            );
            assert_eq!(failure, Some((2, WcStatus::TransportError)));
            assert!(matches!(refused, Some(PoolError::Invalid(_))));
            server_a.join().unwrap();
            server_b.join().unwrap();
        },
        3000,
    );
}

/// The server that went down, in the rejoin models: chunk copies are on servers 0 and
/// this one; rebuild and heal place new copies on server 2.
const GONE: u32 = 1;
const REPLICAS: usize = 2;
/// An extent let go of on [`GONE`] before the models start (parked for its session).
const EARLIER: (u64, u64) = (0xe000, 0xe0);

/// File `f`'s copy on [`GONE`] (of the session it went down with).
fn old_copy(f: u64) -> Replica {
    Replica {
        server: GONE,
        addr: 0x10_000 * (f + 1),
        rkey: 0x10 + f,
    }
}

/// A server that went down holding a copy of each of two files' chunk, as the pool's
/// standing of it (the real [`Health`] and [`Parked`], changed by the real
/// [`park_free`], [`forget_session`], [`take_parked`] and [`back_up`]) and the files'
/// chunk maps (the real lock and [`Chunk`]); the steps of the data path that use them
/// mirror [`crate::data::DataStore`]'s (a [`Pool`] needs TCP control connections, which
/// cannot run under the model checker).
struct RejoinModel {
    health: Mutex<Health>,
    unfreed: Mutex<Parked>,
    failed: AtomicBool,
    transitions: AtomicU64,
    /// Frees sent to [`GONE`] on its new link (address, key).
    wire: Mutex<Vec<(u64, u64)>>,
    /// Copies on [`GONE`] that rebuild or heal took out of their chunk.
    let_go: Mutex<Vec<(u64, u64)>>,
    files: [crate::sync::RwLock<std::collections::BTreeMap<u64, Chunk>>; 2],
    next_addr: AtomicU64,
}

impl RejoinModel {
    fn new() -> RejoinModel {
        let file = |f: u64| {
            let here = Replica {
                server: 0,
                addr: 0x1000 * (f + 1),
                rkey: 1 + f,
            };
            let c = Chunk::with_replicas(4096, &[here, old_copy(f)]);
            crate::sync::RwLock::new([(0, c)].into_iter().collect())
        };
        RejoinModel {
            health: Mutex::new(Health {
                state: ServerState::Down,
                since: SystemTime::now(),
                next_attempt: Instant::now(),
                backoff: crate::sync::Backoff::new(
                    Duration::from_millis(100),
                    Duration::from_millis(100),
                ),
            }),
            unfreed: Mutex::new(Parked {
                session: 0,
                frees: vec![EARLIER],
            }),
            failed: AtomicBool::new(true),
            transitions: AtomicU64::new(1),
            wire: Mutex::new(Vec::new()),
            let_go: Mutex::new(Vec::new()),
            files: [file(0), file(1)],
            next_addr: AtomicU64::new(0x100_000),
        }
    }

    fn is_live(&self, server: u32) -> bool {
        server != GONE || !self.failed.load(Ordering::SeqCst)
    }

    /// [`Pool::free`] of an extent on [`GONE`].
    fn free(&self, addr: u64, rkey: u64) {
        let session = self.unfreed.lock().session;
        if self.failed.load(Ordering::SeqCst) {
            park_free(&self.health, &self.unfreed, session, addr, rkey);
            return;
        }
        let parked = std::mem::take(&mut self.unfreed.lock().frees);
        let mut wire = self.wire.lock();
        wire.extend(parked);
        wire.push((addr, rkey));
    }

    /// `heal` before a write of file `f`'s chunk (under its chunk map's write lock), or
    /// `DataStore::rebuild_chunk` where it can place the missing copy, which ends the same:
    /// copies on dead servers leave it (`let_go`: taken out, then freed), and a chunk short
    /// of copies gets one on server 2.
    fn upkeep(&self, f: usize) {
        let mut chunks = self.files[f].write();
        let Some(c) = chunks.get_mut(&0) else { return };
        let dead: Vec<u32> = c
            .replicas()
            .iter()
            .filter(|r| !self.is_live(r.server))
            .map(|r| r.server)
            .collect();
        if dead.len() == c.replicas().len() {
            return;
        }
        for server in dead {
            if let Some(gone) = c.remove(server) {
                self.let_go.lock().push((gone.addr, gone.rkey));
                self.free(gone.addr, gone.rkey);
            }
        }
        if c.replicas().len() < REPLICAS && c.on(2).is_none() {
            let addr = self.next_addr.fetch_add(0x1000, Ordering::SeqCst);
            let new = Replica {
                server: 2,
                addr,
                rkey: addr,
            };
            assert!(c.add(new), "a new copy's extent leaked");
        }
    }

    /// `rebuild::pass`: each file's degraded chunks found under the read lock, then
    /// rebuilt under the write lock.
    fn rebuild_pass(&self) {
        for f in 0..self.files.len() {
            let degraded = self.files[f].read().values().any(|c| {
                c.replicas()
                    .iter()
                    .filter(|r| self.is_live(r.server))
                    .count()
                    < REPLICAS
            });
            if degraded {
                self.upkeep(f);
            }
        }
    }

    /// `rebuild::forget_server`: every copy on [`GONE`] leaves every file; how many.
    fn forget_server(&self) -> usize {
        self.files
            .iter()
            .map(|f| {
                f.write()
                    .values_mut()
                    .filter_map(|c| c.remove(GONE))
                    .count()
            })
            .sum()
    }

    /// Runs the rebuild (both files) and a write to file 0 (healing its chunk) against
    /// `reconnect`; returns what `reconnect` returned.
    fn race<T: Send + 'static>(
        self: &Arc<Self>,
        reconnect: impl FnOnce(&RejoinModel) -> T + Send + 'static,
    ) -> T {
        let rebuild = {
            let w = self.clone();
            thread::spawn(move || w.rebuild_pass())
        };
        let write = {
            let w = self.clone();
            thread::spawn(move || w.upkeep(0))
        };
        let r = {
            let w = self.clone();
            thread::spawn(move || reconnect(&w))
        };
        rebuild.join().unwrap();
        write.join().unwrap();
        r.join().unwrap()
    }

    /// Every chunk keeps its copy on server 0, has at most [`REPLICAS`] copies and none
    /// twice on a server.
    fn check_chunks(&self) {
        for (f, file) in self.files.iter().enumerate() {
            let c = file.read()[&0].clone();
            let servers: Vec<u32> = c.replicas().iter().map(|r| r.server).collect();
            assert!(
                servers.contains(&0),
                "file {f} lost a live copy: {servers:?}"
            );
            assert!(servers.len() <= REPLICAS, "file {f}: {servers:?}");
            let mut distinct = servers.clone();
            distinct.sort();
            distinct.dedup();
            assert_eq!(distinct.len(), servers.len(), "file {f}: {servers:?}");
        }
    }
}

/// [`GONE`] comes back without the session (a new process) while the rebuild and a
/// write's heal let go of its copies: the reconnect forgets the session, then every copy
/// on it (`forget_server`), then admits it. In every interleaving each old copy leaves its
/// chunk exactly once (let go or forgotten), the other copies stay, and no free of the old
/// session is kept for the new one or sent to it (where an extent with the same address
/// and key would be freed under a live copy).
#[test]
fn model_rejoin_empty_versus_rebuild_and_heal() {
    shuttle::check_random(
        || {
            let w = Arc::new(RejoinModel::new());
            let forgotten = w.race(|w| {
                forget_session(&w.health, &w.unfreed);
                let n = w.forget_server();
                let mut h = w.health.lock();
                if h.state == ServerState::Rejoining {
                    back_up(&mut h, &w.failed, &w.transitions);
                }
                n
            });
            assert_eq!(w.health.lock().state, ServerState::Up);
            assert!(!w.failed.load(Ordering::SeqCst));
            w.check_chunks();
            for file in &w.files {
                assert!(file.read()[&0].on(GONE).is_none(), "an old copy stayed");
            }
            let let_go = w.let_go.lock().clone();
            assert_eq!(
                let_go.len() + forgotten,
                2,
                "let go {let_go:?}, {forgotten} forgotten"
            );
            let parked = w.unfreed.lock();
            assert_eq!(parked.session, 1);
            assert!(
                parked.frees.is_empty(),
                "frees of the old session kept for the new one: {:?}",
                parked.frees
            );
            assert!(
                w.wire.lock().is_empty(),
                "old frees sent: {:?}",
                w.wire.lock()
            );
        },
        3000,
    );
}

/// [`GONE`] comes back holding the session (within its lease) while the rebuild and a
/// write's heal decide about its copies: the reconnect sends the frees kept while it was
/// down, then puts it back up. In every interleaving each copy is either kept (the
/// server is up with it) or let go and rebuilt on another server, never half of each;
/// every extent let go of is freed exactly once, in its session (sent, or still kept for
/// the next free: none leaked, none freed twice), and no listed copy is freed.
#[test]
fn model_rejoin_resumed_versus_rebuild_and_heal() {
    shuttle::check_random(
        || {
            let w = Arc::new(RejoinModel::new());
            w.race(|w| {
                let sent = take_parked(&w.health, &w.unfreed);
                w.wire.lock().extend(sent);
                back_up(&mut w.health.lock(), &w.failed, &w.transitions);
            });
            assert_eq!(w.health.lock().state, ServerState::Up);
            w.check_chunks();
            let parked = w.unfreed.lock();
            assert_eq!(parked.session, 0);
            let mut freed: Vec<(u64, u64)> = w.wire.lock().clone();
            freed.extend(parked.frees.iter().copied());
            freed.sort();
            let mut let_go = w.let_go.lock().clone();
            let_go.push(EARLIER);
            let_go.sort();
            assert_eq!(freed, let_go, "freed (sent or kept) against let go");
            for (f, file) in w.files.iter().enumerate() {
                let c = file.read()[&0].clone();
                assert_eq!(c.replicas().len(), REPLICAS, "file {f} left short");
                let old = old_copy(f as u64);
                let kept = c.on(GONE).is_some();
                assert_ne!(
                    kept,
                    freed.contains(&(old.addr, old.rkey)),
                    "file {f}: its copy on {GONE} kept {kept}, freed {freed:?}"
                );
            }
        },
        3000,
    );
}

/// Two threads free (at most 2 unanswered) while the reply thread answers in order and
/// a `statfs` settles: the cap holds in every interleaving (checked and counted under one
/// lock), no waiter misses the answer that frees it, and a settle returns only once every
/// free sent before it was answered.
#[test]
fn model_frees_keep_their_cap_and_settle_waits_for_what_came_before() {
    const CAP: u64 = 2;
    shuttle::check_random(
        || {
            let frees = Arc::new(FreesOut::default());
            let far = Instant::now() + Duration::from_secs(3600);
            // The wire: frees sent, for the reply thread to answer.
            let wire = Arc::new((Mutex::new(0u64), Condvar::new()));
            let freers: Vec<_> = (0..2)
                .map(|_| {
                    let (f, wire) = (frees.clone(), wire.clone());
                    thread::spawn(move || {
                        for _ in 0..2 {
                            f.reserve(CAP, far);
                            let (sent, answered) = *f.counts.lock();
                            assert!(sent - answered <= CAP, "{sent} sent, {answered} answered");
                            *wire.0.lock() += 1;
                            wire.1.notify_all();
                        }
                    })
                })
                .collect();
            let replier = {
                let (f, wire) = (frees.clone(), wire.clone());
                thread::spawn(move || {
                    // Answers each free once it is on the wire, in order.
                    for k in 1..=4 {
                        let mut on_wire = wire.0.lock();
                        while *on_wire < k {
                            on_wire = wire.1.wait(on_wire);
                        }
                        drop(on_wire);
                        f.answer();
                    }
                })
            };
            let target = frees.counts.lock().0;
            assert!(frees.wait_until(far, |_, answered| answered >= target));
            assert!(
                frees.counts.lock().1 >= target,
                "settled before its frees' answers"
            );
            for t in freers {
                t.join().unwrap();
            }
            replier.join().unwrap();
            assert_eq!(*frees.counts.lock(), (4, 4));
        },
        3000,
    );
}
