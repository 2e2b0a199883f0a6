//! The properties the fuzz targets (fuzz/fuzz_targets/) check, in one place: the libFuzzer
//! targets call these with every generated input, and `tests/fuzz_regressions.rs` calls them
//! with every saved input under `fuzz/regressions/<target>/`. Each function panics when the
//! property fails (libFuzzer records a panic as a crash).
//!
//! Only with the `testing` feature: never in the product.

use crate::fabric::tcp::wire::{Request, Response, DATA_MAGIC, REQ_HEADER, RESP_HEADER};
use crate::fabric::tcp::{TcpConfig, TcpFabric};
use crate::fabric::{Fabric, Opcode, PeerGuard, SessionKey, WcStatus};
use crate::proto::{read_frame, write_frame, Message, MAX_FRAME_LEN};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// `control_message`: a control-protocol body never panics the decoder, and what decodes
/// re-encodes to the same bytes and decodes back to an equal message; the input read as a
/// stream of length-prefixed frames never panics the frame reader, and every frame it accepts
/// survives `write_frame` / `read_frame`.
pub fn control_message(data: &[u8]) {
    if let Ok(msg) = Message::decode(data) {
        let body = msg.encode();
        assert_eq!(
            Message::decode(&body).as_ref(),
            Ok(&msg),
            "decode(encode(m)) != m"
        );
        assert_eq!(body, data, "{msg:?} re-encodes to other bytes");
    }
    // The whole input as a stream: every accepted frame consumes at least 5 bytes, so this ends.
    let mut stream = data;
    while let Ok(msg) = read_frame(&mut stream) {
        let mut frame = Vec::new();
        write_frame(&mut frame, &msg).expect("writing into a Vec");
        assert!(
            frame.len() <= 4 + MAX_FRAME_LEN,
            "frame of {} bytes",
            frame.len()
        );
        let back = read_frame(&mut frame.as_slice()).expect("re-reading a written frame");
        assert_eq!(back, msg, "frame round trip");
    }
}

/// `tcp_request`: the TCP fabric's headers. The first [`REQ_HEADER`] bytes of the input
/// (zero-padded) as a request header, the first [`RESP_HEADER`] as a response header: never a
/// panic, and a header that decodes re-encodes to the same bytes.
pub fn tcp_request(data: &[u8]) {
    let mut h = [0u8; REQ_HEADER];
    let n = data.len().min(REQ_HEADER);
    h[..n].copy_from_slice(&data[..n]);
    if let Ok(req) = Request::decode(&h) {
        assert_eq!(req.encode(), h, "{req:?} re-encodes to other bytes");
        assert_eq!(Request::decode(&req.encode()), Ok(req));
    }

    let mut h = [0u8; RESP_HEADER];
    let n = data.len().min(RESP_HEADER);
    h[..n].copy_from_slice(&data[..n]);
    if let Ok(resp) = Response::decode(&h) {
        assert_eq!(Response::decode(&resp.encode()), Ok(resp));
        assert_eq!(resp.encode(), h, "{resp:?} re-encodes to other bytes");
    }
}

/// A TCP fabric whose NIC serves the `nic_stream` inputs: started once per process.
struct NicUnderTest {
    port: u16,
    _fabric: Arc<TcpFabric>,
    _guard: Mutex<PeerGuard>,
}

fn nic_under_test() -> &'static NicUnderTest {
    static NIC: OnceLock<NicUnderTest> = OnceLock::new();
    NIC.get_or_init(|| {
        let fabric = TcpFabric::new(TcpConfig {
            op_timeout: Duration::from_millis(200),
            ..TcpConfig::default()
        });
        let session = SessionKey {
            id: 1,
            token: FUZZ_TOKEN,
            read_only: false,
        };
        let (reply, guard) = fabric
            .accept(&[], SocketAddr::from(([127, 0, 0, 1], 0)), session)
            .expect("starting the TCP fabric's NIC");
        let port = match reply.as_slice() {
            [a, b] => u16::from_le_bytes([*a, *b]),
            other => panic!("accept replied {other:?}, not a 2-byte port"),
        };
        NicUnderTest {
            port,
            _fabric: fabric,
            _guard: Mutex::new(guard),
        }
    })
}

/// The session token the NIC under test knows: inputs whose first byte is even are sent after
/// the magic and this token, so the fuzzer reaches the request parser of a live session; odd
/// ones go raw (the magic and session check).
const FUZZ_TOKEN: [u8; 32] = [0x5a; 32];

/// How long the NIC has to finish with an input's connection before that counts as a hang.
const NIC_DEADLINE: Duration = Duration::from_secs(10);

fn connect_nic(port: u16) -> TcpStream {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let s = TcpStream::connect_timeout(&addr, NIC_DEADLINE).expect("the NIC accepts connections");
    s.set_read_timeout(Some(NIC_DEADLINE))
        .expect("read timeout");
    s.set_write_timeout(Some(NIC_DEADLINE))
        .expect("write timeout");
    s
}

/// Writes `input` (the peer may close early and reset the rest), shuts the write side, and
/// reads until the peer closes the connection; a read that times out (the socket's read
/// timeout) is a hang, reported with `hang()`.
fn send_and_wait_closed(mut s: TcpStream, input: &[u8], hang: impl Fn() -> String) {
    let _ = s.write_all(input);
    let _ = s.shutdown(Shutdown::Write);
    let mut sink = [0u8; 16 * 1024];
    loop {
        match s.read(&mut sink) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                panic!("{}", hang())
            }
            Err(_) => return, // reset by the peer: also an end
        }
    }
}

/// `nic_stream`: a server's NIC (no registrations, so every request is refused) fed the input
/// as a data connection's byte stream, write side then shut down. The NIC must close the
/// connection within [`NIC_DEADLINE`] (no hang), and afterwards still serve a fresh, well-formed
/// connection (its accept loop and threads are alive; a panic in a NIC thread also aborts a
/// libFuzzer run through its panic hook).
pub fn nic_stream(data: &[u8]) {
    let nic = nic_under_test();
    let s = connect_nic(nic.port);
    // The NIC may close early (bad magic, malformed header) and reset the rest of our write.
    let stream: Vec<u8> = match data.first() {
        Some(b) if b % 2 == 0 => [&DATA_MAGIC[..], &FUZZ_TOKEN[..], &data[1..]].concat(),
        _ => data.to_vec(),
    };
    send_and_wait_closed(s, &stream, || {
        format!(
            "the NIC kept a connection open {NIC_DEADLINE:?} after the input ({} bytes) ended",
            data.len()
        )
    });

    // Still alive: a well-formed READ (of nothing registered) gets its refusal.
    let mut s = connect_nic(nic.port);
    let req = Request {
        opcode: Opcode::Read,
        rkey: 0x5eed,
        addr: 0x1000,
        len: 8,
        seq: 77,
    };
    let mut hello = DATA_MAGIC.to_vec();
    hello.extend_from_slice(&FUZZ_TOKEN);
    hello.extend_from_slice(&req.encode());
    s.write_all(&hello)
        .expect("the NIC takes a request after the input");
    let mut h = [0u8; RESP_HEADER];
    s.read_exact(&mut h)
        .expect("the NIC answers a request after the input");
    let resp = Response::decode(&h).expect("a well-formed response");
    assert_eq!(resp.seq, 77, "{resp:?}");
    assert_eq!(resp.status, WcStatus::RemoteAccessError, "{resp:?}");
}

/// A memory server (TCP fabric, a secret, no lease, a small quota) that serves the
/// `control_session` inputs: started once per process.
struct ServerUnderTest {
    addr: SocketAddr,
    secret: crate::auth::Secret,
    _server: crate::server::MemoryServer,
}

fn server_under_test() -> &'static ServerUnderTest {
    static SERVER: OnceLock<ServerUnderTest> = OnceLock::new();
    SERVER.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("rmemfs-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for the secret");
        let path = dir.join("secret");
        crate::auth::keygen(&path, true).expect("writing a secret");
        let secret = crate::auth::Secret::from_file(&path).expect("reading the secret");
        let config = crate::server::ServerConfig {
            secret: secret.clone(),
            // Nothing outlives an input's connection, and no input holds much.
            lease: Duration::ZERO,
            max_client_memory: Some(1 << 20),
            client_op_timeout: Duration::from_secs(2),
            ..crate::server::ServerConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)), 16 << 20)
        };
        let fabric = TcpFabric::new(TcpConfig {
            op_timeout: Duration::from_millis(500),
            ..TcpConfig::default()
        });
        let server = crate::server::MemoryServer::start(&config, fabric).expect("a memory server");
        ServerUnderTest {
            addr: server.local_addr(),
            secret,
            _server: server,
        }
    })
}

/// How long the server has to close an input's connection after the input ended.
const SERVER_DEADLINE: Duration = Duration::from_secs(10);

/// Authenticates `s` as a client holding `secret` (Hello, Challenge, Proof, Welcome).
fn authenticate(s: &mut TcpStream, secret: &crate::auth::Secret) {
    let client_nonce = crate::auth::random_bytes::<32>();
    let name = "fuzz";
    write_frame(
        s,
        &Message::Hello {
            version: crate::proto::PROTOCOL_VERSION,
            client_name: name.into(),
            nonce: client_nonce,
            observer: false,
        },
    )
    .expect("sending Hello");
    let Ok(Message::Challenge { nonce, .. }) = read_frame(s) else {
        panic!("no Challenge for a well-formed Hello");
    };
    let t = crate::auth::Transcript {
        client_nonce: &client_nonce,
        server_nonce: &nonce,
        client_name: name,
    };
    write_frame(
        s,
        &Message::Proof {
            proof: secret.client_proof(&t),
        },
    )
    .expect("sending Proof");
    match read_frame(s) {
        Ok(Message::Welcome { .. }) => {}
        other => panic!("no Welcome for the right proof: {other:?}"),
    }
}

/// `control_session`: a memory server's control port fed the input as a stream of bytes: raw
/// (the first byte is 0 mod 3: the handshake parser), after a well-formed `Hello` (1 mod 3: the
/// proof step), or after a complete authentication (2 mod 3: the request handler of a live
/// session: allocations, frees, resumes, connects). Write side then shut down. The server
/// must close the connection within [`SERVER_DEADLINE`], and afterwards still let a client
/// holding its secret in and answer it.
pub fn control_session(data: &[u8]) {
    let server = server_under_test();
    let connect = || {
        let s = TcpStream::connect_timeout(&server.addr, SERVER_DEADLINE)
            .expect("the server accepts connections");
        s.set_read_timeout(Some(SERVER_DEADLINE))
            .expect("read timeout");
        s.set_write_timeout(Some(SERVER_DEADLINE))
            .expect("write timeout");
        s
    };
    let mut s = connect();
    let (mode, rest) = match data.split_first() {
        Some((m, rest)) => (m % 3, rest),
        None => (0, data),
    };
    match mode {
        1 => {
            let hello = Message::Hello {
                version: crate::proto::PROTOCOL_VERSION,
                client_name: "fuzz".into(),
                nonce: [7; 32],
                observer: false,
            };
            write_frame(&mut s, &hello).expect("sending Hello");
            let _ = read_frame(&mut s);
        }
        2 => authenticate(&mut s, &server.secret),
        _ => {}
    }
    // The server may close early (a violation) and reset the rest of our write.
    send_and_wait_closed(s, rest, || {
        format!(
            "the server kept a control connection open {SERVER_DEADLINE:?} after the input \
             ({} bytes, mode {mode}) ended",
            data.len()
        )
    });

    // Still serving: a client with the secret is let in and answered.
    let mut s = connect();
    authenticate(&mut s, &server.secret);
    write_frame(&mut s, &Message::Stat { tag: 5 }).expect("sending Stat");
    match read_frame(&mut s) {
        Ok(Message::Stats { tag: 5, .. }) => {}
        other => panic!("no Stats after the input: {other:?}"),
    }
}
