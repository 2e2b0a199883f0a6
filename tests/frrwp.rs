//! FRRWP: conditional writes fire exactly once whether the server's reply comes before or
//! after the write is submitted, in any order across tags; refusals, dead servers and bad
//! local buffers complete with an error instead of hanging, and nothing leaks.
//!
//! A scripted memory server (real protocol, in-process fabric) controls when and in what order
//! allocation replies go out.

use rmemfs::client::frrwp::Ticket;
use rmemfs::client::{Pool, PoolConfig, PoolError, RemoteOp};
use rmemfs::fabric::local::{LocalFabric, LocalNetwork};
use rmemfs::fabric::{Access, AlignedBuf, Fabric, LocalMr, Opcode, ServerId, Sge, WcStatus};
use rmemfs::proto::{self, Capacity, Message, RefusalCode, PROTOCOL_VERSION};
use rmemfs::server::{MemoryServer, ServerConfig};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

enum Mode {
    Immediate,
    /// Hold the allocation reply until the test opens the gate (sends on the channel).
    Gate(std::sync::mpsc::Receiver<()>),
    /// Hold replies until this many allocations arrived, then answer them last-first.
    Reverse(usize),
    Refuse,
    /// Close the connection instead of answering an allocation.
    Die,
    /// Never answer an allocation, but keep the connection open (a frozen server).
    Silent,
}

/// A memory server whose allocation replies follow a script.
fn scripted(net: &Arc<LocalNetwork>, mode: Mode) -> SocketAddr {
    let node = net.node();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let local = s.local_addr().unwrap();
        let cap = Capacity {
            total: 1 << 30,
            free: 1 << 30,
            largest_free: 1 << 30,
        };
        let mut extents: Vec<LocalMr> = Vec::new();
        let mut token = [0u8; 32];
        let mut guards = Vec::new();
        let mut held: Vec<Message> = Vec::new();
        while let Ok(msg) = proto::read_frame(&mut s) {
            let reply = match msg {
                // The handshake of a server without a secret.
                Message::Hello {
                    client_name, nonce, ..
                } => {
                    let server_nonce = rmemfs::auth::random_bytes::<32>();
                    let t = rmemfs::auth::Transcript {
                        client_nonce: &nonce,
                        server_nonce: &server_nonce,
                        client_name: &client_name,
                    };
                    let none = rmemfs::auth::Secret::none();
                    token = none.session_token(&t);
                    Message::Challenge {
                        version: PROTOCOL_VERSION,
                        nonce: server_nonce,
                        authenticated: false,
                        proof: none.server_proof(&t),
                    }
                }
                Message::Proof { .. } => Message::Welcome {
                    version: PROTOCOL_VERSION,
                    server_instance: 1,
                    fabric: "local".into(),
                    capacity: cap,
                    backed: false,
                },
                Message::Connect { tag, blob } => {
                    let session = rmemfs::fabric::SessionKey {
                        id: 1,
                        token,
                        read_only: false,
                    };
                    let (blob, guard) = node.accept(&blob, local, session).unwrap();
                    guards.push(guard);
                    Message::Connected { tag, blob }
                }
                Message::Alloc { tag, len } => {
                    let refuse = Message::Refused {
                        tag,
                        code: RefusalCode::NoSpace,
                        message: "scripted: full".into(),
                    };
                    match &mode {
                        Mode::Refuse => refuse,
                        Mode::Die => return,
                        Mode::Silent => continue,
                        _ => {
                            let buf = Arc::new(AlignedBuf::new(len as usize).unwrap());
                            let mr = node.register_buf(buf, Access::REMOTE).unwrap();
                            mr.restrict_to(1);
                            let m = Message::Allocated {
                                tag,
                                addr: mr.addr(),
                                len,
                                rkey: mr.rkey(),
                                capacity: cap,
                            };
                            extents.push(mr);
                            m
                        }
                    }
                }
                Message::Free { tag, .. } => Message::Freed { tag, capacity: cap },
                Message::Stat { tag } => Message::Stats {
                    tag,
                    capacity: cap,
                    extents: extents.len() as u64,
                    clients: 1,
                    counters: Default::default(),
                    session: Default::default(),
                },
                _ => return,
            };
            let is_alloc = matches!(reply, Message::Allocated { .. });
            match &mode {
                Mode::Gate(gate) if is_alloc => {
                    let _ = gate.recv();
                    proto::write_frame(&mut s, &reply).unwrap();
                }
                Mode::Reverse(n) if is_alloc => {
                    held.push(reply);
                    if held.len() == *n {
                        while let Some(r) = held.pop() {
                            proto::write_frame(&mut s, &r).unwrap();
                        }
                    }
                }
                _ => proto::write_frame(&mut s, &reply).unwrap(),
            }
        }
    });
    addr
}

fn pool(net: &Arc<LocalNetwork>, addrs: &[SocketAddr]) -> (Pool, Arc<LocalFabric>) {
    pool_with_timeout(net, addrs, Duration::from_secs(5))
}

fn pool_with_timeout(
    net: &Arc<LocalNetwork>,
    addrs: &[SocketAddr],
    timeout: Duration,
) -> (Pool, Arc<LocalFabric>) {
    let node = net.node();
    let p = Pool::connect(
        node.clone(),
        addrs,
        &PoolConfig {
            timeout,
            ..PoolConfig::default()
        },
    )
    .unwrap();
    (p, node)
}

fn filled(fabric: &dyn Fabric, len: usize, byte: u8) -> (Arc<AlignedBuf>, LocalMr) {
    let buf = Arc::new(AlignedBuf::new(len).unwrap());
    buf.fill(byte);
    let mr = fabric.register_buf(buf.clone(), Access::LOCAL).unwrap();
    (buf, mr)
}

fn read_back(p: &Pool, t: &Ticket, len: usize) -> Vec<u8> {
    let (buf, mr) = filled(&**p.fabric(), len, 0);
    p.read(t.region().expect("allocated"), 0, mr.sge(0, len as u64))
        .unwrap();
    buf.to_vec(0, len)
}

#[test]
fn reply_before_the_write_is_submitted() {
    let net = LocalNetwork::new();
    let (p, node) = pool(&net, &[scripted(&net, Mode::Immediate)]);
    let t = p.begin_alloc(1 << 20).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while t.region().is_none() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    let (_b, mr) = filled(&*node, 1 << 20, 0xa1);
    p.execute_frrwp(&[], &[(&t, vec![(mr.sge(0, 1 << 20), 0)])])
        .unwrap();
    assert!(read_back(&p, &t, 1 << 20).iter().all(|&x| x == 0xa1));
    assert_eq!(node.counters().writes, 1, "posted exactly once");
}

#[test]
fn reply_after_the_write_is_submitted() {
    let net = LocalNetwork::new();
    let (open_gate, gate) = std::sync::mpsc::channel();
    let (p, node) = pool(&net, &[scripted(&net, Mode::Gate(gate))]);
    let t = p.begin_alloc(64 << 10).unwrap();
    let (_b, mr) = filled(&*node, 64 << 10, 0xb2);
    // Two conditional writes into one new extent, submitted while the server holds its
    // reply: the reply thread fires them when the gate opens.
    let writes = vec![
        (mr.sge(0, 32 << 10), 0),
        (mr.sge(32 << 10, 32 << 10), 32 << 10),
    ];
    let submitted = p.submit_crw(&t, writes).unwrap();
    assert!(t.region().is_none(), "the reply must come later");
    assert_eq!(node.counters().writes, 0, "nothing posted before the reply");
    open_gate.send(()).unwrap();
    p.wait_crw(&t, submitted).unwrap();
    assert!(read_back(&p, &t, 64 << 10).iter().all(|&x| x == 0xb2));
    assert_eq!(node.counters().writes, 2);
}

#[test]
fn replies_out_of_order_across_tags() {
    let net = LocalNetwork::new();
    let (p, node) = pool(&net, &[scripted(&net, Mode::Reverse(4))]);
    let tickets: Vec<Ticket> = (0..4).map(|_| p.begin_alloc(8192).unwrap()).collect();
    let bufs: Vec<_> = (0..4)
        .map(|i| filled(&*node, 8192, 0x10 + i as u8))
        .collect();
    let crws: Vec<(&Ticket, Vec<(Sge, u64)>)> = tickets
        .iter()
        .zip(&bufs)
        .map(|(t, (_, mr))| (t, vec![(mr.sge(0, 8192), 0)]))
        .collect();
    p.execute_frrwp(&[], &crws).unwrap();
    for (i, t) in tickets.iter().enumerate() {
        assert!(read_back(&p, t, 8192).iter().all(|&x| x == 0x10 + i as u8));
    }
    assert_eq!(node.counters().writes, 4);
}

#[test]
fn refused_allocation_fails_the_write_without_hanging() {
    let net = LocalNetwork::new();
    let good = MemoryServer::start(
        &ServerConfig::new("127.0.0.1:0".parse().unwrap(), 16 << 20),
        net.node(),
    )
    .unwrap();
    let (p, node) = pool(&net, &[good.local_addr(), scripted(&net, Mode::Refuse)]);
    let existing = p.alloc_on(ServerId(0), 4096).unwrap();
    let t = p.begin_alloc_on(ServerId(1), 4096).unwrap();
    let (_b, mr) = filled(&*node, 4096, 7);
    // One ordinary write to an existing extent rides in the same batch and still completes.
    let ops = [RemoteOp {
        opcode: Opcode::Write,
        local: mr.sge(0, 4096),
        remote: existing,
        offset: 0,
    }];
    let err = p
        .execute_frrwp(&ops, &[(&t, vec![(mr.sge(0, 4096), 0)])])
        .unwrap_err();
    assert!(
        matches!(
            err,
            PoolError::Refused {
                code: RefusalCode::NoSpace,
                ..
            }
        ),
        "{err}"
    );
    assert!(t.refused_for_space() && t.region().is_none());
    assert_eq!(
        node.counters().writes,
        1,
        "only the unconditional write went out"
    );
    assert_eq!(mr.in_flight(), 0, "nothing left in use");
}

#[test]
fn server_dying_before_it_answers_fails_the_write() {
    let net = LocalNetwork::new();
    let (p, node) = pool(&net, &[scripted(&net, Mode::Die)]);
    let t = p.begin_alloc(4096).unwrap();
    let (_b, mr) = filled(&*node, 4096, 1);
    let err = p
        .execute_frrwp(&[], &[(&t, vec![(mr.sge(0, 4096), 0)])])
        .unwrap_err();
    assert!(matches!(err, PoolError::ControlLost { .. }), "{err}");
    assert_eq!(node.counters().writes, 0);
}

#[test]
fn bad_local_buffer_fails_the_write_and_keeps_the_extent_accounted() {
    let net = LocalNetwork::new();
    let (open_gate, gate) = std::sync::mpsc::channel();
    let (p, node) = pool(&net, &[scripted(&net, Mode::Gate(gate))]);
    let t = p.begin_alloc(4096).unwrap();
    let (_b, mr) = filled(&*node, 4096, 1);
    let bogus = Sge {
        lkey: mr.lkey() ^ 0xffff,
        ..mr.sge(0, 4096)
    };
    // Submitted before the reply; the reply thread's post of it is refused locally.
    let submitted = p.submit_crw(&t, vec![(bogus, 0)]).unwrap();
    open_gate.send(()).unwrap();
    let err = p.wait_crw(&t, submitted).unwrap_err();
    assert!(
        matches!(
            err,
            PoolError::Op {
                status: WcStatus::LocalProtectionError,
                ..
            }
        ),
        "{err}"
    );
    // The extent was allocated: the caller owns it and can free it.
    let region = t.region().expect("allocated despite the failed write");
    p.free(region).unwrap();
}

#[test]
fn many_concurrent_large_writes() {
    let net = LocalNetwork::new();
    let servers: Vec<MemoryServer> = (0..2)
        .map(|_| {
            MemoryServer::start(
                &ServerConfig::new("127.0.0.1:0".parse().unwrap(), 256 << 20),
                net.node(),
            )
            .unwrap()
        })
        .collect();
    let addrs: Vec<_> = servers.iter().map(|s| s.local_addr()).collect();
    let (p, node) = pool(&net, &addrs);
    const LEN: usize = 4 << 20;
    std::thread::scope(|s| {
        for th in 0..6u8 {
            let (p, node) = (&p, &node);
            s.spawn(move || {
                for round in 0..5u8 {
                    let byte = th * 16 + round;
                    let t = p.begin_alloc(LEN as u64).unwrap();
                    let (_b, mr) = filled(&**node, LEN, byte);
                    let writes = (0..4)
                        .map(|k| (mr.sge(k * (1 << 20), 1 << 20), k * (1 << 20)))
                        .collect();
                    p.execute_frrwp(&[], &[(&t, writes)]).unwrap();
                    assert!(read_back(p, &t, LEN).iter().all(|&x| x == byte));
                    p.free(t.region().unwrap()).unwrap();
                }
            });
        }
    });
    assert_eq!(node.counters().writes, 6 * 5 * 4);
    let used: u64 = p
        .refresh()
        .iter()
        .map(|s| s.capacity.total - s.capacity.free)
        .sum();
    assert_eq!(used, 0, "every extent was given back");
}

#[test]
fn parts_submitted_one_by_one_all_fire_once() {
    let net = LocalNetwork::new();
    let (open_gate, gate) = std::sync::mpsc::channel();
    let (p, node) = pool(&net, &[scripted(&net, Mode::Gate(gate))]);
    let t = p.begin_alloc(1 << 20).unwrap();
    let (_b, mr) = filled(&*node, 1 << 20, 0xc3);
    // Four parts, each submitted before the reply (the server holds it until the gate
    // opens); then wait for all.
    let subs: Vec<_> = (0..4u64)
        .map(|k| {
            p.submit_crw(&t, vec![(mr.sge(k << 18, 1 << 18), k << 18)])
                .unwrap()
        })
        .collect();
    assert!(t.region().is_none(), "the reply must come after the parts");
    open_gate.send(()).unwrap();
    for s in subs {
        p.wait_crw(&t, s).unwrap();
    }
    assert!(read_back(&p, &t, 1 << 20).iter().all(|&x| x == 0xc3));
    assert_eq!(node.counters().writes, 4, "each part posted exactly once");
    // A part past the extent is refused up front.
    let s = p
        .submit_crw(&t, vec![(mr.sge(0, 4096), (1 << 20) - 100)])
        .unwrap();
    assert!(matches!(p.wait_crw(&t, s), Err(PoolError::Invalid(_))));
}

#[test]
fn a_server_that_never_answers_fails_the_write_after_the_timeout() {
    let net = LocalNetwork::new();
    let timeout = Duration::from_millis(500);
    let (p, node) = pool_with_timeout(&net, &[scripted(&net, Mode::Silent)], timeout);
    let t = p.begin_alloc(4096).unwrap();
    let (_b, mr) = filled(&*node, 4096, 1);
    let start = Instant::now();
    let err = p
        .execute_frrwp(&[], &[(&t, vec![(mr.sge(0, 4096), 0)])])
        .unwrap_err();
    assert!(matches!(err, PoolError::ControlLost { .. }), "{err}");
    // It waited for the timeout (the write was not failed early); no upper bound is asserted,
    // a loaded machine may take longer.
    assert!(start.elapsed() >= timeout);
    assert!(p.status()[0].failed, "the silent server is marked failed");
    assert_eq!(node.counters().writes, 0);
}
