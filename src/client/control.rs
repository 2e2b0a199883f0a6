//! The client end of one server's control connection.
//!
//! Requests carry tags and replies are routed back by tag by a reader thread, so several
//! requests may be outstanding at once (FRRWP sends its tagged allocations up front). A reply
//! that does not come within the request timeout, or a connection that breaks, is an error for
//! every waiter: nothing blocks forever.

use super::PoolError;
use crate::auth::{self, Secret, Token};
use crate::proto::{self, Capacity, FrameError, Message, PROTOCOL_VERSION};
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{Arc, Mutex};
use crossbeam_channel::{Receiver, Sender};
use std::collections::HashMap;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::thread;
use std::time::Duration;

/// Who is waiting for the reply to a tag: a thread (on a channel), or a handler run by the
/// reply thread itself the moment the reply arrives (`None` if the connection died first).
pub enum Waiter {
    Channel(Sender<Message>),
    Handler(Box<dyn FnOnce(Option<Message>) + Send>),
}

type Waiters = Arc<Mutex<HashMap<u64, Waiter>>>;

/// What the server said in its `Welcome`.
#[derive(Debug, Clone)]
pub struct ServerHello {
    pub instance: u64,
    pub fabric: String,
    pub capacity: Capacity,
    /// The server keeps its extents in a file (`serve --backing`): volume commits ask it to
    /// persist.
    pub backed: bool,
}

pub struct ControlConn {
    pub addr: SocketAddr,
    writer: Mutex<TcpStream>,
    waiters: Waiters,
    next_tag: AtomicU64,
    dead: Arc<AtomicBool>,
    timeout: Duration,
    pub hello: ServerHello,
    /// The server's capacity as last heard: the hello's, then every reply that carries one,
    /// set by the reply thread in the order of the replies (a waiter setting it after it
    /// wakes could set it back to an older figure than a reply handled meanwhile).
    pub capacity: Arc<Mutex<Capacity>>,
    /// The session token both ends derived in the handshake; the data path presents it.
    pub token: Token,
}

impl ControlConn {
    /// Connects, runs the mutual authentication ([`crate::auth`]) under `secret`, and
    /// starts the reply router.
    pub fn connect(
        addr: SocketAddr,
        client_name: &str,
        timeout: Duration,
        secret: &Secret,
    ) -> Result<ControlConn, PoolError> {
        Self::open(addr, client_name, timeout, secret, false)
    }

    /// As [`ControlConn::connect`], as an observer: the session may only ask for `Stats`,
    /// and a server at its `--max-clients` still answers it.
    pub fn connect_observer(
        addr: SocketAddr,
        client_name: &str,
        timeout: Duration,
        secret: &Secret,
    ) -> Result<ControlConn, PoolError> {
        Self::open(addr, client_name, timeout, secret, true)
    }

    fn open(
        addr: SocketAddr,
        client_name: &str,
        timeout: Duration,
        secret: &Secret,
        observer: bool,
    ) -> Result<ControlConn, PoolError> {
        let unreachable = |e: std::io::Error| PoolError::Unreachable {
            addr,
            reason: e.to_string(),
        };
        let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(unreachable)?;
        stream.set_nodelay(true).map_err(unreachable)?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(unreachable)?;
        stream
            .set_write_timeout(Some(timeout))
            .map_err(unreachable)?;
        let handshake = |reason: String| PoolError::Handshake { addr, reason };
        let (token, hello) = authenticate(&mut stream, addr, client_name, secret, observer)?;
        let hello = match hello {
            Ok(Message::Welcome {
                version,
                server_instance,
                fabric,
                capacity,
                backed,
            }) if version == PROTOCOL_VERSION => ServerHello {
                instance: server_instance,
                fabric,
                capacity,
                backed,
            },
            Ok(Message::Fatal { message }) => return Err(handshake(message)),
            Ok(other) => return Err(handshake(format!("unexpected reply {other:?}"))),
            Err(e) => return Err(handshake(e.to_string())),
        };
        stream.set_read_timeout(None).map_err(unreachable)?;
        let reader = stream.try_clone().map_err(unreachable)?;
        let waiters: Waiters = Arc::default();
        let dead = Arc::new(AtomicBool::new(false));
        let capacity = Arc::new(Mutex::new(hello.capacity));
        let (w, d, c) = (waiters.clone(), dead.clone(), capacity.clone());
        thread::Builder::new()
            .name("control-rx".into())
            .spawn(move || route_replies(reader, addr, w, d, &c))
            .map_err(unreachable)?;
        Ok(ControlConn {
            addr,
            writer: Mutex::new(stream),
            waiters,
            next_tag: AtomicU64::new(1),
            dead,
            timeout,
            hello,
            capacity,
            token,
        })
    }

    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    /// Sends a request built around a fresh tag; the reply arrives on the returned channel.
    pub fn send(&self, build: impl FnOnce(u64) -> Message) -> Result<Receiver<Message>, PoolError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.send_to(build, Waiter::Channel(tx))?;
        Ok(rx)
    }

    /// Sends a request whose reply goes to `handler`, called on the reply thread as soon as
    /// the reply arrives (with `None` if the connection dies first). Returns the tag. If the
    /// send itself fails, the handler is not called.
    pub fn send_with_handler(
        &self,
        build: impl FnOnce(u64) -> Message,
        handler: Box<dyn FnOnce(Option<Message>) + Send>,
    ) -> Result<u64, PoolError> {
        self.send_to(build, Waiter::Handler(handler))
    }

    fn send_to(
        &self,
        build: impl FnOnce(u64) -> Message,
        waiter: Waiter,
    ) -> Result<u64, PoolError> {
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        self.waiters.lock().insert(tag, waiter);
        let msg = build(tag);
        let res = {
            let mut w = self.writer.lock();
            if self.is_dead() {
                Err(std::io::Error::from(std::io::ErrorKind::NotConnected))
            } else {
                proto::write_frame(&mut *w, &msg)
            }
        };
        if let Err(e) = res {
            if self.waiters.lock().remove(&tag).is_none() {
                // The reply thread saw the connection die first and already told the waiter.
                return Ok(tag);
            }
            self.kill();
            return Err(PoolError::ControlLost {
                addr: self.addr,
                reason: e.to_string(),
            });
        }
        Ok(tag)
    }

    /// Waits for the reply on `rx` (from [`ControlConn::send`]).
    pub fn wait(&self, rx: Receiver<Message>) -> Result<Message, PoolError> {
        match rx.recv_timeout(self.timeout) {
            Ok(Message::Fatal { message }) => Err(PoolError::ControlLost {
                addr: self.addr,
                reason: message,
            }),
            Ok(m) => Ok(m),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                // A server that stops answering control requests is treated as gone.
                self.kill();
                Err(PoolError::ControlLost {
                    addr: self.addr,
                    reason: format!("no reply within {:?}", self.timeout),
                })
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(PoolError::ControlLost {
                addr: self.addr,
                reason: "connection closed".into(),
            }),
        }
    }

    /// Sends a request and waits for its reply.
    pub fn request(&self, build: impl FnOnce(u64) -> Message) -> Result<Message, PoolError> {
        let rx = self.send(build)?;
        self.wait(rx)
    }

    /// Tells the server this client is leaving for good, so it frees this session's extents
    /// at once (no lease). Best effort: the connection is closed next anyway.
    pub fn goodbye(&self) {
        let mut w = self.writer.lock();
        if !self.is_dead() {
            let _ = proto::write_frame(&mut *w, &Message::Goodbye);
        }
    }

    /// Closes the connection (the server keeps this session's extents for its lease, unless
    /// [`ControlConn::goodbye`] came first).
    pub fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
        let _ = self.writer.lock().shutdown(Shutdown::Both);
    }
}

impl Drop for ControlConn {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The client's side of the handshake: `Hello` with our nonce; check the server's proof in
/// the `Challenge` (in constant time) before sending ours; then read what follows (`Welcome`,
/// or `Fatal` if the server refused us). Returns the session token and that reply.
fn authenticate(
    stream: &mut TcpStream,
    addr: SocketAddr,
    client_name: &str,
    secret: &Secret,
    observer: bool,
) -> Result<(Token, Result<Message, FrameError>), PoolError> {
    let handshake = |reason: String| PoolError::Handshake { addr, reason };
    let client_nonce = auth::random_bytes::<{ auth::NONCE_LEN }>();
    proto::write_frame(
        stream,
        &Message::Hello {
            version: PROTOCOL_VERSION,
            client_name: client_name.into(),
            nonce: client_nonce,
            observer,
        },
    )
    .map_err(|e| handshake(e.to_string()))?;
    let (server_nonce, authenticated, server_proof) = match proto::read_frame(stream) {
        Ok(Message::Challenge {
            version,
            nonce,
            authenticated,
            proof,
        }) if version == PROTOCOL_VERSION => (nonce, authenticated, proof),
        Ok(Message::Fatal { message }) => return Err(handshake(message)),
        Ok(other) => return Err(handshake(format!("unexpected reply {other:?}"))),
        Err(e) => return Err(handshake(e.to_string())),
    };
    let t = auth::Transcript {
        client_nonce: &client_nonce,
        server_nonce: &server_nonce,
        client_name,
    };
    let refuse = |stream: &mut TcpStream, why: String| {
        let _ = proto::write_frame(
            stream,
            &Message::Fatal {
                message: why.clone(),
            },
        );
        Err(PoolError::Auth { addr, reason: why })
    };
    match (authenticated, secret.is_set()) {
        (true, false) => {
            return refuse(
                stream,
                format!(
                    "memory server {addr} requires a shared secret: give the mount \
                     --secret-file (or ${})",
                    auth::SECRET_FILE_ENV
                ),
            )
        }
        (false, true) => {
            return refuse(
                stream,
                format!(
                    "memory server {addr} has no secret (started with --insecure?) and cannot \
                     prove it is the server this mount's secret is for"
                ),
            )
        }
        _ => {}
    }
    if !auth::proofs_match(&server_proof, &secret.server_proof(&t)) {
        return refuse(
            stream,
            format!(
                "memory server {addr} does not hold this mount's secret (a different \
                 --secret-file?)"
            ),
        );
    }
    proto::write_frame(
        stream,
        &Message::Proof {
            proof: secret.client_proof(&t),
        },
    )
    .map_err(|e| handshake(e.to_string()))?;
    let reply = match proto::read_frame(stream) {
        Ok(Message::Fatal { message }) if message.starts_with("authentication failed") => {
            return Err(PoolError::Auth {
                addr,
                reason: format!("memory server {addr} refused this mount's secret: {message}"),
            })
        }
        other => other,
    };
    Ok((secret.session_token(&t), reply))
}

fn route_replies(
    mut stream: TcpStream,
    addr: SocketAddr,
    waiters: Waiters,
    dead: Arc<AtomicBool>,
    capacity: &Mutex<Capacity>,
) {
    loop {
        match proto::read_frame(&mut stream) {
            Ok(msg) => {
                if let Message::Allocated { capacity: c, .. }
                | Message::Freed { capacity: c, .. }
                | Message::Stats { capacity: c, .. } = &msg
                {
                    *capacity.lock() = *c;
                }
                let Some(tag) = msg.reply_tag() else {
                    if let Message::Fatal { message } = &msg {
                        log::error!("server {addr} closed the control connection: {message}");
                    } else {
                        log::error!("server {addr} sent an unsolicited {msg:?}");
                    }
                    break;
                };
                let waiter = waiters.lock().remove(&tag);
                match waiter {
                    Some(Waiter::Channel(tx)) => {
                        let _ = tx.send(msg);
                    }
                    Some(Waiter::Handler(h)) => h(Some(msg)),
                    None => {}
                }
            }
            // After our own `kill` the read fails too: only an unexpected end is news.
            Err(_) if dead.load(Ordering::SeqCst) => break,
            Err(FrameError::Closed) => {
                log::warn!("server {addr} closed the control connection");
                break;
            }
            Err(e) => {
                log::warn!("control connection to {addr} failed: {e}");
                break;
            }
        }
    }
    dead.store(true, Ordering::SeqCst);
    // Dropping the senders wakes every waiting thread with "disconnected"; handlers hear None.
    let left: Vec<Waiter> = waiters.lock().drain().map(|(_, w)| w).collect();
    for w in left {
        if let Waiter::Handler(h) = w {
            h(None);
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
}
