//! The server side of the TCP fabric: its "NIC". One listener on the server's listen address
//! (a wildcard listen serves every interface) and one thread per data connection, which
//! executes READ and WRITE straight against registered memory after the registry's remote
//! check (rkey, bounds, access), without the server's control logic.

use super::wire::{
    recv_exact_raw, send_all_raw, RawSlice, Request, Response, DATA_MAGIC, REQ_HEADER, TICK,
};
use crate::fabric::TOKEN_LEN;
use crate::fabric::{Opcode, Registry, Token, WcStatus};
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{Arc, Mutex};
use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::thread;
use std::time::{Duration, Instant};

/// NIC threads only need a little stack: a header and a drain buffer.
const NIC_STACK: usize = 256 * 1024;

/// A running NIC: stopped (listener and every connection closed) on [`Nic::stop`].
pub(super) struct Nic {
    /// Where the listener is bound (the server's listen address with port 0).
    pub bound: SocketAddr,
    shared: Arc<NicShared>,
}

struct NicShared {
    registry: Arc<Registry>,
    op_timeout: Duration,
    stop: AtomicBool,
    /// Live data connections, so a shutdown (or a test "killing" the server) can cut them.
    conns: Mutex<HashMap<u64, TcpStream>>,
    next_conn: AtomicU64,
}

impl Nic {
    /// Listens on `listen`'s address (port 0) and serves data connections.
    pub fn start(
        listen: SocketAddr,
        registry: Arc<Registry>,
        op_timeout: Duration,
    ) -> io::Result<Nic> {
        let listener = TcpListener::bind(SocketAddr::new(listen.ip(), 0))?;
        let bound = listener.local_addr()?;
        let shared = Arc::new(NicShared {
            registry,
            op_timeout,
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(0),
        });
        let s = shared.clone();
        thread::Builder::new()
            .name("nic-accept".into())
            .spawn(move || nic_accept_loop(listener, s))?;
        Ok(Nic { bound, shared })
    }

    /// Stops serving: closes every data connection and the listener, as if the NIC went dark.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let conns: Vec<TcpStream> = self.shared.conns.lock().drain().map(|(_, c)| c).collect();
        for c in conns {
            let _ = c.shutdown(Shutdown::Both);
        }
        // Wake the accept loop so it sees `stop`, at an address that reaches the listener
        // however it is bound.
        let _ = TcpStream::connect_timeout(
            &crate::fabric::reachable(self.bound),
            Duration::from_millis(200),
        );
    }
}

fn nic_accept_loop(listener: TcpListener, nic: Arc<NicShared>) {
    for conn in listener.incoming() {
        if nic.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = conn else { continue };
        let id = nic.next_conn.fetch_add(1, Ordering::Relaxed);
        match stream.try_clone() {
            Ok(c) => nic.conns.lock().insert(id, c),
            Err(_) => continue,
        };
        let n = nic.clone();
        let spawned = thread::Builder::new()
            .name("nic".into())
            .stack_size(NIC_STACK)
            .spawn(move || {
                let peer = stream.peer_addr().ok();
                if let Err(e) = nic_serve(&n, &stream, id) {
                    // Refusals (no session, a bad key) are what an operator should see.
                    let level = if e.kind() == io::ErrorKind::PermissionDenied {
                        log::Level::Warn
                    } else {
                        log::Level::Info
                    };
                    log::log!(
                        level,
                        "tcp fabric: data connection from {peer:?} closed: {e}"
                    );
                }
                // The clone in `conns` keeps the socket open: shut it down so the peer sees
                // the end at once rather than after its timeout.
                let _ = stream.shutdown(Shutdown::Both);
                n.conns.lock().remove(&id);
            });
        if let Err(e) = spawned {
            log::error!("tcp fabric: cannot spawn a NIC thread: {e}");
        }
    }
}

/// Counts a refused remote access; the error closes its data connection.
fn refused(registry: &Registry, why: String) -> io::Error {
    registry
        .counters
        .remote_refused
        .fetch_add(1, Ordering::Relaxed);
    io::Error::new(io::ErrorKind::PermissionDenied, why)
}

/// Stops a fenced session's cut connection from being remembered once it ends on its own.
struct Hooked<'a>(&'a crate::fabric::LiveSession, u64);

impl Drop for Hooked<'_> {
    fn drop(&mut self) {
        self.0.forget(self.1);
    }
}

fn ended() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "the session of this data connection ended",
    )
}

fn nic_serve(nic: &NicShared, stream: &TcpStream, id: u64) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(TICK))?;
    stream.set_write_timeout(Some(TICK))?;
    let fd = stream.as_raw_fd();
    let stalled = |since: &mut Instant, moved: bool| {
        if moved {
            *since = Instant::now();
        }
        !nic.stop.load(Ordering::SeqCst) && since.elapsed() <= nic.op_timeout
    };
    // Magic, then the session token: a connection that did not come through an
    // authenticated control session is closed here.
    let mut hello = [0u8; DATA_MAGIC.len() + TOKEN_LEN];
    let mut since = Instant::now();
    let mut last = 0;
    // SAFETY: local array of the right size.
    unsafe {
        recv_exact_raw(fd, hello.as_mut_ptr(), hello.len(), &mut |got| {
            let moved = got != last;
            last = got;
            stalled(&mut since, moved)
        })?
    };
    if hello[..DATA_MAGIC.len()] != DATA_MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "bad data-connection magic",
        ));
    }
    let token: Token = hello[DATA_MAGIC.len()..].try_into().expect("token length");
    let registry = &nic.registry;
    let Some(live) = registry.live_session(&token) else {
        return Err(refused(
            registry,
            "no live session has this token (the control handshake was skipped or the session \
             ended)"
                .into(),
        ));
    };
    let session = live.access;
    // The session's fence cuts this connection, so a request it admitted ends at once.
    let cut = stream.try_clone()?;
    let hooked = live.on_fence(
        id,
        Box::new(move || {
            let _ = cut.shutdown(Shutdown::Both);
        }),
    );
    if !hooked {
        return Err(ended());
    }
    let _hooked = Hooked(&live, id);
    loop {
        let mut h = [0u8; REQ_HEADER];
        let mut last = 0;
        let mut since = Instant::now();
        let mut keep_waiting = |got: usize| {
            if nic.stop.load(Ordering::SeqCst) {
                return false;
            }
            if got == 0 {
                return true; // idle between requests
            }
            let moved = got != last;
            last = got;
            stalled(&mut since, moved)
        };
        // SAFETY: local array of REQ_HEADER bytes.
        match unsafe { recv_exact_raw(fd, h.as_mut_ptr(), REQ_HEADER, &mut keep_waiting) } {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            r => r?,
        }
        // Something a well-behaved QP never sends: the stream cannot be trusted any more.
        let req = Request::decode(&h).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        // A session that ended (its control connection dropped, a takeover, an eviction)
        // serves nothing more on its old data connections; one that ends while this request
        // is served cuts the connection and waits for it (see `LiveSession`).
        let Some(_serving) = live.serve() else {
            return Err(ended());
        };
        let hold = registry.admit_remote(session, req.opcode, req.rkey, req.addr, req.len);
        let status = if hold.is_some() {
            WcStatus::Success
        } else {
            WcStatus::RemoteAccessError
        };
        let resp = Response {
            status,
            seq: req.seq,
            len: req.len,
        }
        .encode();
        let mut since = Instant::now();
        let mut last = 0;
        let mut progress = |done: usize| {
            let moved = done != last;
            last = done;
            stalled(&mut since, moved)
        };
        if req.opcode == Opcode::Write {
            match &hold {
                // SAFETY: `admit_remote` checked that [addr, addr+len) lies inside a live
                // registration with REMOTE_WRITE; `hold` keeps it registered meanwhile.
                Some(_) => unsafe {
                    recv_exact_raw(fd, req.addr as *mut u8, req.len as usize, &mut progress)?
                },
                None => drain(stream, req.len)?,
            }
        }
        let payload_len = if req.opcode == Opcode::Read && hold.is_some() {
            req.len as usize
        } else {
            0
        };
        let parts = [
            RawSlice {
                ptr: resp.as_ptr(),
                len: resp.len(),
            },
            RawSlice {
                ptr: req.addr as *const u8,
                len: payload_len,
            },
        ];
        // SAFETY: the response header is local; a non-empty payload range was checked by
        // `admit_remote` (REMOTE_READ, in bounds) and `hold` keeps it registered while we
        // send.
        unsafe { send_all_raw(fd, &parts, &mut progress)? };
        registry.counters.count(req.opcode, status, req.len);
        if hold.is_none() {
            // As an RC queue pair does: the first access error ends the connection, so a
            // peer gets one guess per authenticated connection, not a free oracle.
            return Err(refused(
                registry,
                format!(
                    "remote access refused ({:?} of {} bytes at {:#x}, key {:#x}, session \
                     {}{}): closing the connection",
                    req.opcode,
                    req.len,
                    req.addr,
                    req.rkey,
                    session.session,
                    if session.read_only { ", read-only" } else { "" }
                ),
            ));
        }
        drop(hold);
    }
}

/// Reads and discards `len` payload bytes of a refused WRITE, keeping the stream in step.
fn drain(mut stream: &TcpStream, mut len: u64) -> io::Result<()> {
    let mut scratch = [0u8; 16 * 1024];
    let deadline = Instant::now();
    while len > 0 {
        let want = scratch.len().min(len as usize);
        match stream.read(&mut scratch[..want]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => len -= n as u64,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                // A refused payload gets a generous but bounded time to arrive.
                if deadline.elapsed() > Duration::from_secs(60) {
                    return Err(e);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::wire::{Request, RESP_HEADER};
    use super::super::{TcpConfig, TcpFabric};
    use crate::fabric::mem::AlignedBuf;
    use crate::fabric::{Fabric, Opcode, SessionKey};
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::time::{Duration, Instant};

    const LEN: usize = 64 << 10;
    const FIRST: usize = 4096;

    /// A stale holder's WRITE admitted before the fence (its link stalls mid-payload, then
    /// heals) must not land after the fence returns: the fence cuts the connection and waits.
    #[test]
    fn a_fence_stops_a_write_already_admitted() {
        let fabric = TcpFabric::new(TcpConfig {
            op_timeout: Duration::from_secs(10),
            ..TcpConfig::default()
        });
        let token = [0x3c; crate::fabric::TOKEN_LEN];
        let key = SessionKey {
            id: 9,
            token,
            read_only: false,
        };
        let (reply, guard) = fabric
            .accept(&[], SocketAddr::from(([127, 0, 0, 1], 0)), key)
            .unwrap();
        let port = u16::from_le_bytes([reply[0], reply[1]]);
        let buf = AlignedBuf::new(LEN).unwrap();
        // SAFETY: `buf` outlives the registration (dropped first, below).
        let mr = unsafe { fabric.register_extent(buf.as_ptr(), LEN, 9) }.unwrap();
        let mut s = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], port))).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let req = Request {
            opcode: Opcode::Write,
            rkey: mr.rkey(),
            addr: mr.addr(),
            len: LEN as u64,
            seq: 1,
        };
        let mut hello = super::DATA_MAGIC.to_vec();
        hello.extend_from_slice(&token);
        hello.extend_from_slice(&req.encode());
        hello.extend_from_slice(&[0xaa; FIRST]);
        s.write_all(&hello).unwrap();
        // The request is admitted once its first bytes are in the arena.
        let landed = || {
            // SAFETY: reading our own buffer; the NIC writes into it concurrently, and a torn
            // read only delays the check.
            unsafe { std::ptr::read_volatile(buf.as_ptr().add(FIRST - 1)) }
        };
        let start = Instant::now();
        while landed() != 0xaa {
            assert!(start.elapsed() < Duration::from_secs(10), "never admitted");
            std::thread::yield_now();
        }
        // The fence (a takeover ends the old holder's control session).
        drop(guard);
        // The link heals: the rest of the payload arrives.
        let _ = s.write_all(&[0xbb; LEN - FIRST]);
        let mut h = [0u8; RESP_HEADER];
        let answered = s.read_exact(&mut h).is_ok();
        // SAFETY: as above; the NIC is done with it (its connection is closed).
        let tail = unsafe { std::slice::from_raw_parts(buf.as_ptr().add(FIRST), LEN - FIRST) };
        let stale = tail.iter().filter(|&&b| b == 0xbb).count();
        drop(mr);
        assert!(!answered, "a fenced session's write was answered");
        assert_eq!(stale, 0, "bytes sent after the fence landed");
    }
}
