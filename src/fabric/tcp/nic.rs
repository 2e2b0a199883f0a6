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
                if let Err(e) = nic_serve(&n, &stream) {
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

fn nic_serve(nic: &NicShared, stream: &TcpStream) -> io::Result<()> {
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
    let Some(session) = registry.session_for(&token) else {
        return Err(refused(
            registry,
            "no live session has this token (the control handshake was skipped or the session \
             ended)"
                .into(),
        ));
    };
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
        // A session that ended (its control connection dropped; its extents may wait for a
        // resume under a new token) serves nothing more on its old data connections: a late
        // request from before the drop cannot land after the client resumed.
        if registry.session_for(&token) != Some(session) {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the session of this data connection ended",
            ));
        }
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
