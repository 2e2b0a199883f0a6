//! Fabric conformance: one suite, run against every fabric (`tcp` and `local` everywhere;
//! `rdma_device`, the verbs fabric on a real device: built with the `verbs` feature, run inside
//! the rxe VM by `tools/test-rxe.sh`, and skipped by name on the host, which has none). Each
//! fabric gets a real memory server (in-process) whose extents are the remote memory, and a
//! client fabric instance that connects to it.

mod common;

use common::bytes;
use rmemfs::client::control::ControlConn;
use rmemfs::fabric::local::{LocalFabric, LocalNetwork};
use rmemfs::fabric::tcp::{TcpConfig, TcpFabric};
use rmemfs::fabric::{
    Access, AlignedBuf, Completion, CompletionQueue, DeregisterError, Fabric, FabricError, LocalMr,
    Opcode, QueuePair, Sge, WcStatus, WorkRequest,
};
use rmemfs::proto::{ClaimMode, Message};
use rmemfs::server::{MemoryServer, ServerConfig};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a test needs from a fabric: a client side, a server, and a way to kill the server.
struct Harness {
    client: Arc<dyn Fabric>,
    server: MemoryServer,
    control: ControlConn,
    kill: Box<dyn Fn() + Send + Sync>,
}

/// A remote extent allocated from the harness's server.
#[derive(Clone, Copy, Debug)]
struct Remote {
    addr: u64,
    len: u64,
    rkey: u64,
}

const OP_TIMEOUT: Duration = Duration::from_secs(3);

impl Harness {
    fn tcp() -> Harness {
        let config = TcpConfig {
            op_timeout: OP_TIMEOUT,
            ..TcpConfig::default()
        };
        let server_fabric = TcpFabric::new(config.clone());
        let sf = server_fabric.clone();
        Self::with(
            TcpFabric::new(config),
            server_fabric,
            Box::new(move || sf.shutdown_nic()),
        )
    }

    /// Real RDMA on the device named by RMEMFS_RXE_DEVICE (set by tools/rxe-vm.sh) or the
    /// first active one. Fails on machines without RDMA, with the reason.
    #[cfg(feature = "verbs")]
    fn verbs() -> Harness {
        use rmemfs::fabric::verbs::{VerbsConfig, VerbsFabric};
        let config = VerbsConfig {
            device: std::env::var("RMEMFS_RXE_DEVICE").ok(),
            op_timeout: OP_TIMEOUT,
            ..VerbsConfig::default()
        };
        let open = || {
            VerbsFabric::open(&config).unwrap_or_else(|e| {
                panic!("{e} (the verbs suite runs inside the rxe VM: tools/rxe-vm.sh)")
            })
        };
        let server_fabric = open();
        let sf = server_fabric.clone();
        Self::with(open(), server_fabric, Box::new(move || sf.shutdown_peers()))
    }

    /// The harness, its server's node and its client's node.
    fn local() -> (Harness, Arc<LocalFabric>, Arc<LocalFabric>) {
        let net = LocalNetwork::new();
        let server_node = net.node();
        let client_node = net.node();
        let node = server_node.clone();
        (
            Self::with(
                client_node.clone(),
                server_node.clone(),
                Box::new(move || node.kill()),
            ),
            server_node,
            client_node,
        )
    }

    fn with(
        client: Arc<dyn Fabric>,
        server_fabric: Arc<dyn Fabric>,
        kill: Box<dyn Fn() + Send + Sync>,
    ) -> Harness {
        let server = MemoryServer::start(
            &ServerConfig::new("127.0.0.1:0".parse().unwrap(), 128 << 20),
            server_fabric,
        )
        .expect("start server");
        let control = Self::session(&server);
        Harness {
            client,
            server,
            control,
            kill,
        }
    }

    /// A new client session with `server` (its own control connection).
    fn session(server: &MemoryServer) -> ControlConn {
        ControlConn::connect(
            server.local_addr(),
            "conformance",
            OP_TIMEOUT * 2,
            &rmemfs::auth::Secret::none(),
        )
        .expect("control connection")
    }

    fn qp(&self) -> (Arc<dyn QueuePair>, Arc<CompletionQueue>) {
        self.qp_in(&self.control)
    }

    /// A queue pair of the session `control`.
    fn qp_in(&self, control: &ControlConn) -> (Arc<dyn QueuePair>, Arc<CompletionQueue>) {
        let cq = self.client.create_cq();
        let addr = self.server.local_addr();
        let mut exchange =
            |blob: Vec<u8>| match control.request(|tag| Message::Connect { tag, blob }) {
                Ok(Message::Connected { blob, .. }) => Ok(blob),
                other => Err(FabricError::Handshake {
                    addr,
                    reason: format!("{other:?}"),
                }),
            };
        let qp = self
            .client
            .connect(addr, &mut exchange, cq.clone(), &control.token)
            .expect("connect");
        (qp, cq)
    }

    fn remote(&self, len: u64) -> Remote {
        remote_in(&self.control, len)
    }

    fn free(&self, r: Remote) {
        match self.control.request(|tag| Message::Free {
            tag,
            addr: r.addr,
            rkey: r.rkey,
        }) {
            Ok(Message::Freed { .. }) => {}
            other => panic!("free failed: {other:?}"),
        }
    }

    /// A registered local buffer.
    fn buf(&self, len: usize, access: Access) -> (Arc<AlignedBuf>, LocalMr) {
        let buf = Arc::new(AlignedBuf::new(len).unwrap());
        let mr = self
            .client
            .register_buf(buf.clone(), access)
            .expect("register");
        (buf, mr)
    }
}

fn wr(id: u64, opcode: Opcode, local: Sge, remote: Remote, offset: u64) -> WorkRequest {
    WorkRequest {
        wr_id: id,
        opcode,
        local,
        remote_addr: remote.addr + offset,
        rkey: remote.rkey,
    }
}

/// Waits for `n` completions (bounded: a hang fails the test instead of blocking it).
fn reap(cq: &CompletionQueue, n: usize) -> Vec<Completion> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "only {} of {n} completions arrived",
            out.len()
        );
        if let Some(c) = cq.wait(left) {
            out.push(c);
        }
    }
    assert!(
        cq.wait(Duration::from_millis(20)).is_none(),
        "extra completion"
    );
    out
}

fn run_one(qp: &dyn QueuePair, cq: &CompletionQueue, w: WorkRequest) -> WcStatus {
    qp.post(&[w]);
    let c = reap(cq, 1).pop().unwrap();
    assert_eq!(c.wr_id, w.wr_id);
    c.status
}

fn read_back(
    h: &Harness,
    qp: &dyn QueuePair,
    cq: &CompletionQueue,
    r: Remote,
    off: u64,
    len: usize,
) -> Vec<u8> {
    let (buf, mr) = h.buf(len, Access::LOCAL);
    let st = run_one(
        qp,
        cq,
        wr(9999, Opcode::Read, mr.sge(0, len as u64), r, off),
    );
    assert_eq!(st, WcStatus::Success);
    buf.to_vec(0, len)
}

fn read_after_write_at_every_size(h: &Harness) {
    let (qp, cq) = h.qp();
    let r = h.remote(17 << 20);
    for (i, &len) in [1usize, 7, 4095, 4096, 4097, 65536, (1 << 20) + 3, 16 << 20]
        .iter()
        .enumerate()
    {
        let data = bytes(i as u64 + 1, len);
        let (src, smr) = h.buf(len, Access::LOCAL);
        src.write_at(0, &data);
        let off = (i as u64 * 13) % 4096; // unaligned remote offsets too
        let st = run_one(
            &*qp,
            &cq,
            wr(i as u64, Opcode::Write, smr.sge(0, len as u64), r, off),
        );
        assert_eq!(st, WcStatus::Success, "write of {len}");
        assert_eq!(
            read_back(h, &*qp, &cq, r, off, len),
            data,
            "read back {len} bytes"
        );
    }
}

fn batches_with_many_ops_in_flight(h: &Harness) {
    let (qp, cq) = h.qp();
    const N: usize = 512;
    const SZ: usize = 4096 + 512;
    let r = h.remote((N * SZ) as u64);
    let (src, smr) = h.buf(N * SZ, Access::LOCAL);
    let data = bytes(77, N * SZ);
    src.write_at(0, &data);
    let writes: Vec<_> = (0..N)
        .map(|i| {
            let o = (i * SZ) as u64;
            wr(i as u64, Opcode::Write, smr.sge(o, SZ as u64), r, o)
        })
        .collect();
    qp.post(&writes);
    let done = reap(&cq, N);
    let ids: HashSet<u64> = done.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids.len(), N, "every op completes exactly once");
    assert!(done
        .iter()
        .all(|c| c.status == WcStatus::Success && c.byte_len == SZ as u64));
    drop(done);
    let (dst, dmr) = h.buf(N * SZ, Access::LOCAL);
    // Read back in reverse order, all in flight at once.
    let reads: Vec<_> = (0..N)
        .rev()
        .map(|i| {
            let o = (i * SZ) as u64;
            wr(1000 + i as u64, Opcode::Read, dmr.sge(o, SZ as u64), r, o)
        })
        .collect();
    qp.post(&reads);
    assert!(reap(&cq, N).iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(dst.to_vec(0, N * SZ), data);
}

fn concurrent_threads(h: &Harness) {
    const THREADS: usize = 4;
    const LEN: usize = 256 << 10;
    let r = h.remote((THREADS * LEN) as u64);
    // Two threads share a queue pair; the others have their own.
    let shared = h.qp();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (qp, cq) = if t < 2 {
                (shared.0.clone(), h.client.create_cq())
            } else {
                h.qp()
            };
            let qp = if t < 2 { shared.0.clone() } else { qp };
            let cq = if t < 2 { shared.1.clone() } else { cq };
            s.spawn(move || {
                let (src, smr) = h.buf(LEN, Access::LOCAL);
                let (dst, dmr) = h.buf(LEN, Access::LOCAL);
                for round in 0..8u64 {
                    let data = bytes(t as u64 * 100 + round, LEN);
                    src.write_at(0, &data);
                    let off = (t * LEN) as u64;
                    let id = (t as u64) << 32 | round;
                    qp.post(&[wr(id, Opcode::Write, smr.sge(0, LEN as u64), r, off)]);
                    qp.post(&[wr(
                        id | 1 << 31,
                        Opcode::Read,
                        dmr.sge(0, LEN as u64),
                        r,
                        off,
                    )]);
                    // Completions of a shared QP may be reaped by either thread: count both.
                    let mut mine = 0;
                    let deadline = Instant::now() + Duration::from_secs(30);
                    while mine < 2 {
                        assert!(Instant::now() < deadline, "thread {t} hung");
                        if let Some(c) = cq.wait(Duration::from_millis(50)) {
                            assert_eq!(c.status, WcStatus::Success);
                            mine += 1;
                        }
                    }
                    if t >= 2 {
                        assert_eq!(dst.to_vec(0, LEN), data);
                    }
                }
            });
        }
    });
    // Threads sharing a QP reap each other's completions, so check their data at the end.
    let (qp, cq) = h.qp();
    for t in 0..2 {
        let got = read_back(h, &*qp, &cq, r, (t * LEN) as u64, LEN);
        assert_eq!(
            got,
            bytes(t as u64 * 100 + 7, LEN),
            "thread {t}'s last round"
        );
    }
}

fn remote_access_errors_change_nothing(h: &Harness) {
    let (qp, cq) = h.qp();
    let r = h.remote(8192);
    let before = bytes(5, 8192);
    let (src, smr) = h.buf(8192, Access::LOCAL);
    src.write_at(0, &before);
    assert_eq!(
        run_one(&*qp, &cq, wr(1, Opcode::Write, smr.sge(0, 8192), r, 0)),
        WcStatus::Success
    );
    let (junk, jmr) = h.buf(16384, Access::LOCAL);
    junk.fill(0xee);
    let cases = [
        // One byte past the end.
        wr(2, Opcode::Write, jmr.sge(0, 8193), r, 0),
        wr(3, Opcode::Write, jmr.sge(0, 2), r, r.len - 1),
        // Wrong rkey.
        WorkRequest {
            rkey: r.rkey ^ 0x5555,
            ..wr(4, Opcode::Write, jmr.sge(0, 16), r, 0)
        },
        // Below the region.
        WorkRequest {
            remote_addr: r.addr - 4096,
            ..wr(5, Opcode::Write, jmr.sge(0, 16), r, 0)
        },
        // Address wrap-around.
        WorkRequest {
            remote_addr: u64::MAX - 8,
            ..wr(6, Opcode::Write, jmr.sge(0, 16), r, 0)
        },
    ];
    // On verbs (RC) an error completion breaks the QP: each failing request gets a fresh one,
    // and the broken one must fail what follows. Elsewhere the same QP goes on.
    let breaks = h.client.errors_break_qp();
    let fresh = || {
        if breaks {
            h.qp()
        } else {
            (qp.clone(), cq.clone())
        }
    };
    for c in cases {
        let rd = WorkRequest {
            opcode: Opcode::Read,
            wr_id: c.wr_id + 100,
            ..c
        };
        for w in [c, rd] {
            let (q, cq) = fresh();
            assert_eq!(run_one(&*q, &cq, w), WcStatus::RemoteAccessError, "{w:?}");
            assert_eq!(q.is_connected(), !breaks, "{w:?}");
            if breaks {
                let ok = wr(7, Opcode::Write, smr.sge(0, 16), r, 0);
                assert_eq!(run_one(&*q, &cq, ok), WcStatus::TransportError);
            }
        }
    }
    // The failed reads did not touch the local buffer, and the region is unchanged.
    assert!(junk.to_vec(0, 16384).iter().all(|&b| b == 0xee));
    let (q, cq) = fresh();
    assert_eq!(read_back(h, &*q, &cq, r, 0, 8192), before);
    // The first connection saw no error (on verbs) or survived them all.
    assert!(qp.is_connected());
}

/// A second session handed the first one's address and key reaches nothing: the request fails
/// as a bad key would, its queue pair breaks on the fabrics where errors break one (verbs:
/// the extent lives in the owner's protection domain), and the owner's data stays as it was.
fn another_sessions_extent_is_out_of_reach(h: &Harness) {
    let (qp, cq) = h.qp();
    let r = h.remote(8192);
    let (src, smr) = h.buf(8192, Access::LOCAL);
    src.write_at(0, &bytes(11, 8192));
    assert_eq!(
        run_one(&*qp, &cq, wr(1, Opcode::Write, smr.sge(0, 8192), r, 0)),
        WcStatus::Success
    );
    let thief = Harness::session(&h.server);
    let (loot, lmr) = h.buf(8192, Access::LOCAL);
    let breaks = h.client.errors_break_qp();
    for opcode in [Opcode::Read, Opcode::Write] {
        let (tq, tcq) = h.qp_in(&thief);
        let w = wr(2, opcode, lmr.sge(0, 8192), r, 0);
        assert_eq!(run_one(&*tq, &tcq, w), WcStatus::RemoteAccessError, "{w:?}");
        assert_eq!(tq.is_connected(), !breaks);
    }
    assert!(
        loot.to_vec(0, 8192).iter().all(|&b| b == 0),
        "no byte leaked"
    );
    assert_eq!(read_back(h, &*qp, &cq, r, 0, 8192), bytes(11, 8192));
    // The thief's own memory works as usual.
    let own = remote_in(&thief, 4096);
    let (tq, tcq) = h.qp_in(&thief);
    assert_eq!(
        run_one(&*tq, &tcq, wr(3, Opcode::Write, smr.sge(0, 4096), own, 0)),
        WcStatus::Success
    );
}

/// A shared volume's member evicted by another (its engine session ran out): once the server
/// grants the eviction, the member's queue pairs are closed, and a one-sided write it posts
/// lands nowhere; the volume's memory keeps what it held (as a taken-over holder's writes
/// fail, so the evictor may hand the memory to others at once).
fn an_evicted_members_writes_fail(h: &Harness) {
    let claim =
        |control: &ControlConn, who: &str| match control.request(|tag| Message::VolumeClaim {
            tag,
            name: "shared".into(),
            holder: who.into(),
            mode: ClaimMode::Share,
            takeover: false,
            min_epoch: 0,
        }) {
            Ok(Message::VolumeClaimed { .. }) => {}
            other => panic!("{who}'s claim: {other:?}"),
        };
    let a = Harness::session(&h.server);
    claim(&a, "a");
    let (qa, cqa) = h.qp_in(&a);
    let r = remote_in(&a, 8192);
    let (src, smr) = h.buf(8192, Access::LOCAL);
    src.write_at(0, &bytes(21, 8192));
    assert_eq!(
        run_one(&*qa, &cqa, wr(1, Opcode::Write, smr.sge(0, 8192), r, 0)),
        WcStatus::Success
    );
    let b = Harness::session(&h.server);
    claim(&b, "b");
    match b.request(|tag| Message::Evict {
        tag,
        who: "a".into(),
    }) {
        Ok(Message::VolumeDone { .. }) => {}
        other => panic!("the eviction: {other:?}"),
    }
    src.write_at(0, &bytes(22, 8192));
    let late = run_one(&*qa, &cqa, wr(2, Opcode::Write, smr.sge(0, 8192), r, 0));
    assert_ne!(late, WcStatus::Success, "an evicted member's write landed");
    // Another member reads the volume's extent: what the evicted one wrote before.
    let (qb, cqb) = h.qp_in(&b);
    assert_eq!(read_back(h, &*qb, &cqb, r, 0, 8192), bytes(21, 8192));
}

fn remote_in(control: &ControlConn, len: u64) -> Remote {
    match control.request(|tag| Message::Alloc { tag, len }) {
        Ok(Message::Allocated {
            addr, len, rkey, ..
        }) => Remote { addr, len, rkey },
        other => panic!("alloc failed: {other:?}"),
    }
}

fn unregistered_local_buffer_fails_locally(h: &Harness) {
    let (qp, cq) = h.qp();
    let r = h.remote(4096);
    let (_buf, mr) = h.buf(4096, Access::LOCAL);
    let bad = [
        Sge {
            addr: mr.addr(),
            len: 16,
            lkey: mr.lkey() ^ 0x77,
        },
        Sge {
            addr: mr.addr() + 4000,
            len: 200,
            lkey: mr.lkey(),
        },
        Sge {
            addr: mr.addr() - 1,
            len: 16,
            lkey: mr.lkey(),
        },
    ];
    for (i, sge) in bad.into_iter().enumerate() {
        for op in [Opcode::Read, Opcode::Write] {
            assert_eq!(
                run_one(&*qp, &cq, wr(i as u64, op, sge, r, 0)),
                WcStatus::LocalProtectionError,
                "{op:?} {sge:?}"
            );
        }
    }
    // A region without local write access cannot be the target of a READ.
    let (_ro, ro_mr) = h.buf(4096, Access::NONE);
    assert_eq!(
        run_one(&*qp, &cq, wr(9, Opcode::Read, ro_mr.sge(0, 64), r, 0)),
        WcStatus::LocalProtectionError
    );
    assert_eq!(
        run_one(&*qp, &cq, wr(10, Opcode::Write, ro_mr.sge(0, 64), r, 0)),
        WcStatus::Success
    );
}

fn deregistered_regions_stop_working(h: &Harness) {
    let (qp, cq) = h.qp();
    let r = h.remote(4096);
    let (_buf, mr) = h.buf(4096, Access::LOCAL);
    let sge = mr.sge(0, 64);
    assert_eq!(
        run_one(&*qp, &cq, wr(1, Opcode::Write, sge, r, 0)),
        WcStatus::Success
    );
    h.client
        .deregister(vec![mr])
        .expect("idle region deregisters");
    assert_eq!(
        run_one(&*qp, &cq, wr(2, Opcode::Write, sge, r, 0)),
        WcStatus::LocalProtectionError
    );
    // A freed remote extent stops working too.
    let (_b2, mr2) = h.buf(4096, Access::LOCAL);
    h.free(r);
    assert_eq!(
        run_one(&*qp, &cq, wr(3, Opcode::Write, mr2.sge(0, 64), r, 0)),
        WcStatus::RemoteAccessError
    );
    let (qp, cq) = if h.client.errors_break_qp() {
        h.qp()
    } else {
        (qp, cq)
    };
    assert_eq!(
        run_one(&*qp, &cq, wr(4, Opcode::Read, mr2.sge(0, 64), r, 0)),
        WcStatus::RemoteAccessError
    );
}

fn region_in_use_is_not_deregistered(h: &Harness) {
    let (qp, cq) = h.qp();
    let r = h.remote(1 << 20);
    let (_buf, mr) = h.buf(1 << 20, Access::LOCAL);
    let (_buf2, mr2) = h.buf(4096, Access::LOCAL);
    qp.post(&[wr(1, Opcode::Read, mr.sge(0, 1 << 20), r, 0)]);
    // Until the completion is reaped *and dropped*, the region is in use.
    let c = reap(&cq, 1).pop().unwrap();
    assert_eq!(c.status, WcStatus::Success);
    assert_eq!(mr.in_flight(), 1);
    let mr = match h.client.deregister(vec![mr, mr2]) {
        Err(DeregisterError::Busy(mut v)) => {
            assert_eq!(v.len(), 1, "only the busy region is returned");
            v.pop().unwrap()
        }
        Ok(()) => panic!("a region in use was deregistered"),
    };
    drop(c);
    assert_eq!(mr.in_flight(), 0);
    h.client.deregister(vec![mr]).expect("now idle");
}

fn server_killed_mid_batch_gives_transport_errors(h: &Harness) {
    let (qp, cq) = h.qp();
    const N: usize = 64;
    const SZ: usize = 1 << 20;
    let r = h.remote((N * SZ) as u64);
    let (_buf, mr) = h.buf(N * SZ, Access::LOCAL);
    let wrs: Vec<_> = (0..N)
        .map(|i| {
            wr(
                i as u64,
                Opcode::Write,
                mr.sge((i * SZ) as u64, SZ as u64),
                r,
                (i * SZ) as u64,
            )
        })
        .collect();
    qp.post(&wrs);
    let first = cq.wait(Duration::from_secs(10)).expect("first completion");
    (h.kill)();
    // Every request completes (`reap` fails the test rather than hang if one never does).
    let mut all = vec![first];
    all.extend(reap(&cq, N - 1));
    let failed = all
        .iter()
        .filter(|c| c.status == WcStatus::TransportError)
        .count();
    assert!(
        all.iter()
            .all(|c| matches!(c.status, WcStatus::Success | WcStatus::TransportError)),
        "{:?}",
        all.iter().map(|c| c.status).collect::<Vec<_>>()
    );
    assert!(failed > 0, "killing the server mid-batch failed nothing");
    drop(all);
    // Later operations fail at once, and nothing is left in use.
    assert_eq!(run_one(&*qp, &cq, wrs[0]), WcStatus::TransportError);
    assert!(!qp.is_connected());
    assert_eq!(mr.in_flight(), 0);
}

macro_rules! conformance {
    ($module:ident, $make:expr) => {
        mod $module {
            use super::*;
            #[test]
            fn read_after_write() {
                read_after_write_at_every_size(&$make);
            }
            #[test]
            fn batches() {
                batches_with_many_ops_in_flight(&$make);
            }
            #[test]
            fn concurrency() {
                concurrent_threads(&$make);
            }
            #[test]
            fn remote_access_errors() {
                remote_access_errors_change_nothing(&$make);
            }
            #[test]
            fn other_sessions_extents() {
                another_sessions_extent_is_out_of_reach(&$make);
            }
            #[test]
            fn local_protection_errors() {
                unregistered_local_buffer_fails_locally(&$make);
            }
            #[test]
            fn deregistration() {
                deregistered_regions_stop_working(&$make);
            }
            #[test]
            fn in_use_regions_stay_registered() {
                region_in_use_is_not_deregistered(&$make);
            }
            #[test]
            fn evicted_members() {
                an_evicted_members_writes_fail(&$make);
            }
            #[test]
            fn server_killed_mid_batch() {
                server_killed_mid_batch_gives_transport_errors(&$make);
            }
        }
    };
}

conformance!(tcp, Harness::tcp());
conformance!(local, Harness::local().0);
#[cfg(feature = "verbs")]
conformance!(rdma_device, Harness::verbs());

/// Things only the in-process fabric can do on demand.
mod local_faults {
    use super::*;

    #[test]
    fn fail_nth_delay_and_counters() {
        let (h, server, client) = Harness::local();
        let (qp, cq) = h.qp();
        let r = h.remote(4096);
        let (_b, mr) = h.buf(4096, Access::LOCAL);
        let served = server.served();
        server.fail_nth(2, true);
        let sts: Vec<_> = (0..3)
            .map(|i| run_one(&*qp, &cq, wr(i, Opcode::Write, mr.sge(0, 64), r, 0)))
            .collect();
        assert_eq!(
            sts,
            [
                WcStatus::Success,
                WcStatus::RemoteAccessError,
                WcStatus::Success
            ]
        );
        assert_eq!(server.served(), served + 3);
        server.set_delay(Duration::from_millis(50));
        let t = Instant::now();
        assert_eq!(
            run_one(&*qp, &cq, wr(9, Opcode::Read, mr.sge(0, 64), r, 0)),
            WcStatus::Success
        );
        assert!(t.elapsed() >= Duration::from_millis(50));
        server.set_delay(Duration::ZERO);
        server.fail_nth(1, false);
        assert_eq!(
            run_one(&*qp, &cq, wr(10, Opcode::Read, mr.sge(0, 64), r, 0)),
            WcStatus::TransportError
        );
        // Initiator-side counters: 4 successful operations (3 writes... of which one failed).
        let n = client.counters();
        assert_eq!((n.writes, n.reads, n.failed), (2, 1, 2));
        assert_eq!(n.bytes_written, 128);
        assert!(n.registrations >= 1);
    }
}
