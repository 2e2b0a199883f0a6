//! FRRWP (Fast RDMA Read and Write Process, Ou/He/Han JNCA 2009, §6): writes to fresh remote
//! memory without the serial sequence of Fig. 5.
//!
//! Serially, a client asks for space, waits while the server allocates and registers it, gets
//! the rkey back, registers its own buffer, and only then posts the write. With FRRWP the
//! tagged allocation request goes out first ([`Pool::begin_alloc`]); the client registers its
//! buffer while the server allocates and registers the extent; the client then submits a
//! *Conditional RDMA Write* (CRW) keyed by the tag ([`Pool::execute_frrwp`]) and only waits for
//! the write's completion. When the server's reply carrying the tag and rkey arrives (the
//! STCRW), the reply thread posts the real write at once, without a trip through the caller.
//! Whichever comes second, the CRW or the reply, fires the write; a refusal or a lost server
//! completes the CRW with an error.

use super::{Dispatch, Pool, PoolError, RemoteOp, Server, BATCH_INDEX_BITS};
use crate::fabric::{Opcode, QueuePair, RemoteRegion, ServerId, Sge, WorkRequest};
use crate::proto::Message;
use crate::sync::{Arc, Mutex};
use std::net::SocketAddr;

/// An allocation requested with [`Pool::begin_alloc`] whose reply may not have arrived yet.
pub struct Ticket {
    crw: Arc<Crw>,
}

struct Crw {
    server: ServerId,
    addr: SocketAddr,
    len: u64,
    state: Mutex<CrwState>,
}

#[derive(Default)]
struct CrwState {
    /// The server's answer: the extent, or why not.
    reply: Option<Result<RemoteRegion, PoolError>>,
    /// Conditional writes submitted and not yet posted (a large write may submit its parts
    /// one by one, as each part's local registration completes).
    waiting: Vec<Submitted>,
}

struct Submitted {
    batch: u64,
    base: usize,
    writes: Vec<(Sge, u64)>,
    qp: Arc<dyn QueuePair>,
    dispatch: Arc<Dispatch>,
}

impl Crw {
    /// Once the reply is in, takes every submitted write out with what to do about it: the
    /// extent to write into, or the error to fail it with. Called under the state lock; the
    /// posting happens in [`Crw::fire`], after the lock is released.
    fn take_ready(&self, st: &mut CrwState) -> Vec<(Submitted, Result<RemoteRegion, PoolError>)> {
        let Some(reply) = &st.reply else {
            return Vec::new();
        };
        st.waiting
            .drain(..)
            .map(|sub| {
                let what = match reply {
                    Ok(region) => Ok(*region),
                    Err(PoolError::Refused {
                        addr,
                        code,
                        message,
                    }) => Err(PoolError::Refused {
                        addr: *addr,
                        code: *code,
                        message: message.clone(),
                    }),
                    Err(other) => Err(PoolError::ControlLost {
                        addr: self.addr,
                        reason: other.to_string(),
                    }),
                };
                (sub, what)
            })
            .collect()
    }

    /// Posts (or fails) what [`Crw::take_ready`] took out. `deferred` (on the reply thread)
    /// leaves the sending to the queue pair's sender thread, so a slow data path never holds
    /// up the routing of control replies.
    fn fire(ready: Vec<(Submitted, Result<RemoteRegion, PoolError>)>, deferred: bool) {
        for (sub, what) in ready {
            match what {
                Ok(region) => {
                    let wrs: Vec<WorkRequest> = sub
                        .writes
                        .iter()
                        .enumerate()
                        .map(|(k, (local, offset))| WorkRequest {
                            wr_id: (sub.batch << BATCH_INDEX_BITS) | (sub.base + k) as u64,
                            opcode: Opcode::Write,
                            local: *local,
                            remote_addr: region.addr + offset,
                            rkey: region.rkey,
                        })
                        .collect();
                    if deferred {
                        sub.qp.post_deferred(&wrs);
                    } else {
                        sub.qp.post(&wrs);
                    }
                }
                Err(why) => sub.dispatch.fail(sub.batch, sub.writes.len(), why),
            }
        }
    }

    /// The CRW side: queues conditional writes, posted at once if the reply is in, else by
    /// the reply thread when it arrives. Whichever of the two comes second fires the writes.
    fn submit(&self, sub: Submitted) {
        let ready = {
            let mut st = self.state.lock();
            st.waiting.push(sub);
            self.take_ready(&mut st)
        };
        Self::fire(ready, false);
    }

    /// The STCRW side: the server's reply to the tagged allocation (None: connection lost).
    fn on_reply(&self, msg: Option<Message>) {
        let reply = match msg {
            Some(Message::Allocated {
                addr, len, rkey, ..
            }) => Ok(RemoteRegion {
                server: self.server,
                addr,
                len,
                rkey,
            }),
            Some(Message::Refused { code, message, .. }) => Err(PoolError::Refused {
                addr: self.addr,
                code,
                message,
            }),
            Some(other) => Err(PoolError::Invalid(format!("unexpected reply {other:?}"))),
            None => Err(PoolError::ControlLost {
                addr: self.addr,
                reason: "connection lost before the allocation was answered".into(),
            }),
        };
        let ready = {
            let mut st = self.state.lock();
            st.reply = Some(reply);
            self.take_ready(&mut st)
        };
        Self::fire(ready, true);
    }
}

impl Ticket {
    /// The server the extent was asked of.
    pub fn server(&self) -> ServerId {
        self.crw.server
    }
    /// The requested length.
    pub fn len(&self) -> u64 {
        self.crw.len
    }
    pub fn is_empty(&self) -> bool {
        self.crw.len == 0
    }
    /// The allocated extent, once the server has answered yes.
    pub fn region(&self) -> Option<RemoteRegion> {
        match &self.crw.state.lock().reply {
            Some(Ok(r)) => Some(*r),
            _ => None,
        }
    }
    /// Waits (up to `timeout`) for the server's answer; returns the extent if granted. Used on
    /// error paths, so an extent granted after its write was abandoned is still accounted.
    pub fn wait_region(&self, timeout: std::time::Duration) -> Option<RemoteRegion> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(reply) = &self.crw.state.lock().reply {
                return reply.as_ref().ok().copied();
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Whether the server refused for lack of space.
    pub fn refused_for_space(&self) -> bool {
        matches!(
            &self.crw.state.lock().reply,
            Some(Err(PoolError::Refused {
                code: crate::proto::RefusalCode::NoSpace,
                ..
            }))
        )
    }
}

impl Pool {
    /// Sends a tagged allocation of `len` bytes to the server placement picks, without waiting
    /// for the answer.
    pub fn begin_alloc(&self, len: u64) -> Result<Ticket, PoolError> {
        let Some(&i) = self.placement(len).first() else {
            return Err(self.nothing_placed(len, None));
        };
        self.begin_alloc_on(ServerId(i as u32), len)
    }

    /// Tagged allocations of `len` bytes on `n` distinct servers (fewer if fewer are up), in
    /// placement order: one ticket per copy of a replicated chunk.
    pub fn begin_alloc_replicas(&self, len: u64, n: usize) -> Result<Vec<Ticket>, PoolError> {
        let mut tickets = Vec::with_capacity(n);
        let mut last_error = None;
        for i in self.placement(len) {
            if tickets.len() == n {
                break;
            }
            match self.begin_alloc_on(ServerId(i as u32), len) {
                Ok(t) => tickets.push(t),
                Err(e) => last_error = Some(e),
            }
        }
        if tickets.is_empty() {
            return Err(match last_error {
                Some(e) => e,
                None => self.nothing_placed(len, None),
            });
        }
        Ok(tickets)
    }

    /// As [`Pool::begin_alloc`], on a given server.
    pub fn begin_alloc_on(&self, id: ServerId, len: u64) -> Result<Ticket, PoolError> {
        let s: &Server = self.server(id)?;
        if s.is_failed() {
            return Err(s.failed_error());
        }
        let crw = Arc::new(Crw {
            server: id,
            addr: s.addr,
            len,
            state: Mutex::new(CrwState::default()),
        });
        let c = crw.clone();
        s.link()
            .control
            .send_with_handler(
                |tag| Message::Alloc { tag, len },
                Box::new(move |msg| c.on_reply(msg)),
            )
            .inspect_err(|_| s.mark_failed())?;
        Ok(Ticket { crw })
    }

    /// Runs `ops` on existing extents plus, for each ticket, conditional writes of
    /// `(local, offset in the new extent)` that go out as soon as that extent's rkey is known;
    /// waits for all of them. The tickets then tell which extents were allocated (also when
    /// the writes failed: the caller owns those extents either way).
    pub fn execute_frrwp(
        &self,
        ops: &[RemoteOp],
        crws: &[(&Ticket, Vec<(Sge, u64)>)],
    ) -> Result<(), PoolError> {
        self.check_ops(ops)?;
        let total = ops.len() + crws.iter().map(|(_, w)| w.len()).sum::<usize>();
        if total == 0 {
            return Ok(());
        }
        let (batch_id, batch) = self.begin_batch(total)?;
        self.post_ops(batch_id, 0, ops);
        let mut base = ops.len();
        let mut owners = Vec::with_capacity(total);
        owners.extend(ops.iter().map(|op| (op.remote.server, op.opcode)));
        for (ticket, writes) in crws {
            owners.extend(writes.iter().map(|_| (ticket.crw.server, Opcode::Write)));
            if let Err(e) = self.queue_crw(ticket, batch_id, base, writes.clone()) {
                // Never leave the batch unfinished: its plain ops may be in flight.
                self.dispatch.fail(batch_id, writes.len(), e);
            }
            base += writes.len();
        }
        let tickets: Vec<&Ticket> = crws.iter().map(|(t, _)| *t).collect();
        self.finish_batch(batch_id, batch, "write_fresh", |i| owners[i], &|| {
            self.give_up_unanswered(&tickets)
        })
    }

    /// A server that keeps its connection open but does not answer an allocation would hold
    /// its conditional writes forever: drop its control connection, which fails them (and
    /// marks the server failed, as a dead one would be).
    fn give_up_unanswered(&self, tickets: &[&Ticket]) {
        for t in tickets {
            if t.crw.state.lock().reply.is_none() {
                if let Ok(s) = self.server(t.crw.server) {
                    log::error!(
                        "memory server {} did not answer an allocation within {:?}",
                        s.addr,
                        self.timeout
                    );
                    s.mark_failed();
                    s.link().control.kill();
                }
            }
        }
    }

    /// Queues conditional writes on a ticket: posted at once if the rkey is known, else by
    /// the reply thread when it arrives.
    fn queue_crw(
        &self,
        ticket: &Ticket,
        batch: u64,
        base: usize,
        writes: Vec<(Sge, u64)>,
    ) -> Result<(), PoolError> {
        let crw = &ticket.crw;
        if writes.iter().any(|(l, off)| off + l.len > crw.len) {
            return Err(PoolError::Invalid(
                "conditional write past its extent".into(),
            ));
        }
        let sub = Submitted {
            batch,
            base,
            writes,
            qp: self.server(crw.server)?.link().qp.clone(),
            dispatch: self.dispatch.clone(),
        };
        crw.submit(sub);
        Ok(())
    }

    /// Submits conditional writes into a ticket's extent without waiting: a large write
    /// submits part after part as each part's local registration completes, so registering
    /// one part overlaps the transfer of the one before. Wait with [`Pool::wait_crw`].
    pub fn submit_crw(
        &self,
        ticket: &Ticket,
        writes: Vec<(Sge, u64)>,
    ) -> Result<CrwSubmission, PoolError> {
        let n = writes.len();
        let (batch_id, batch) = self.begin_batch(n.max(1))?;
        if n == 0 {
            self.dispatch
                .fail(batch_id, 1, PoolError::Invalid("empty submission".into()));
        } else if let Err(e) = self.queue_crw(ticket, batch_id, 0, writes) {
            self.dispatch.fail(batch_id, n, e);
        }
        Ok(CrwSubmission {
            batch_id,
            batch,
            server: ticket.crw.server,
        })
    }

    /// Waits for a submission from [`Pool::submit_crw`].
    pub fn wait_crw(&self, ticket: &Ticket, s: CrwSubmission) -> Result<(), PoolError> {
        let server = s.server;
        let who = |_| (server, Opcode::Write);
        self.finish_batch(s.batch_id, s.batch, "write_fresh", who, &|| {
            self.give_up_unanswered(&[ticket])
        })
    }
}

/// Conditional writes in flight (see [`Pool::submit_crw`]).
#[must_use = "wait for the writes with Pool::wait_crw"]
pub struct CrwSubmission {
    batch_id: u64,
    batch: Arc<super::Batch>,
    server: ServerId,
}

#[cfg(all(test, feature = "shuttle"))]
mod model_tests {
    use super::*;
    use crate::client::Batch;
    use crate::fabric::WcStatus;
    use crate::proto::RefusalCode;
    use crate::sync::thread;
    use std::collections::HashMap;
    use std::time::Duration;

    /// A queue pair that records what is posted to it.
    #[derive(Default)]
    struct RecordingQp {
        posted: Mutex<Vec<WorkRequest>>,
    }

    impl QueuePair for RecordingQp {
        fn post(&self, wrs: &[WorkRequest]) {
            self.posted.lock().extend_from_slice(wrs);
        }
        fn is_connected(&self) -> bool {
            true
        }
        fn disconnect(&self) {}
    }

    fn part(k: u64) -> (Sge, u64) {
        let local = Sge {
            addr: 0x10_0000 + k * 4096,
            len: 4096,
            lkey: 9,
        };
        (local, k * 4096)
    }

    struct Setup {
        crw: Arc<Crw>,
        qp: Arc<RecordingQp>,
        dispatch: Arc<Dispatch>,
        batch: Arc<Batch>,
    }

    fn setup() -> Setup {
        let dispatch = Arc::new(Dispatch {
            batches: Mutex::new(HashMap::new()),
        });
        let batch = Arc::new(Batch::new(2));
        dispatch.batches.lock().insert(5, batch.clone());
        Setup {
            crw: Arc::new(Crw {
                server: ServerId(0),
                addr: "127.0.0.1:7471".parse().unwrap(),
                len: 2 * 4096,
                state: Mutex::new(CrwState::default()),
            }),
            qp: Arc::new(RecordingQp::default()),
            dispatch,
            batch,
        }
    }

    /// Runs the server's reply and two parts of a large write submitted one by one, in
    /// three threads.
    fn race(s: &Setup, reply: Message) {
        let replier = {
            let crw = s.crw.clone();
            thread::spawn(move || crw.on_reply(Some(reply)))
        };
        let submitters: Vec<_> = (0..2u64)
            .map(|k| {
                let (crw, qp, dispatch) = (s.crw.clone(), s.qp.clone(), s.dispatch.clone());
                thread::spawn(move || {
                    crw.submit(Submitted {
                        batch: 5,
                        base: k as usize,
                        writes: vec![part(k)],
                        qp,
                        dispatch,
                    })
                })
            })
            .collect();
        replier.join().unwrap();
        for t in submitters {
            t.join().unwrap();
        }
    }

    /// Whichever comes second, the reply (STCRW) or a part's submission (CRW), fires that
    /// part: every part is posted exactly once, to the granted extent with its rkey, and none
    /// is left waiting.
    #[test]
    fn model_frrwp_reply_versus_submit() {
        shuttle::check_random(
            || {
                let s = setup();
                race(
                    &s,
                    Message::Allocated {
                        tag: 1,
                        addr: 0x4000,
                        len: 2 * 4096,
                        rkey: 42,
                        capacity: crate::proto::Capacity::default(),
                    },
                );
                let mut posted = s.qp.posted.lock().clone();
                posted.sort_by_key(|w| w.wr_id);
                assert_eq!(posted.len(), 2, "{posted:?}");
                for (k, w) in posted.iter().enumerate() {
                    assert_eq!(w.wr_id, (5 << BATCH_INDEX_BITS) | k as u64);
                    assert_eq!(w.rkey, 42);
                    assert_eq!(w.remote_addr, 0x4000 + k as u64 * 4096);
                    assert_eq!(w.local, part(k as u64).0);
                }
                assert!(s.crw.state.lock().waiting.is_empty());
            },
            3000,
        );
    }

    /// A refused allocation fails every part exactly once (the batch ends, nothing posted).
    #[test]
    fn model_frrwp_refusal_versus_submit() {
        shuttle::check_random(
            || {
                let s = setup();
                race(
                    &s,
                    Message::Refused {
                        tag: 1,
                        code: RefusalCode::NoSpace,
                        message: "full".into(),
                    },
                );
                assert!(s.qp.posted.lock().is_empty());
                let (failure, refused) = s.batch.wait(Duration::from_secs(3600), &|| {});
                assert_eq!(failure, None::<(usize, WcStatus)>);
                assert!(matches!(
                    refused,
                    Some(PoolError::Refused {
                        code: RefusalCode::NoSpace,
                        ..
                    })
                ));
                assert!(s.crw.state.lock().waiting.is_empty());
            },
            3000,
        );
    }
}
