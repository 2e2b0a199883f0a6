//! Software RDMA over TCP: the fabric for machines without an RDMA NIC.
//!
//! It keeps RDMA's semantics so that everything above it (and its cost model) is the same as on
//! verbs: registrations pin memory (`mlock`) and live in the shared [`Registry`]; a server's
//! "NIC" threads execute READ and WRITE directly against registered memory after checking
//! rkey, bounds and access, without the server's control logic; completions are reaped from a
//! queue.
//!
//! Data path, per queue pair: one TCP connection, a sender thread and a receiver thread on the
//! client ([`client`]), one NIC thread on the server ([`nic`]), and the wire format between
//! them ([`wire`]). WRITE payloads are sent with `sendmsg` straight from the registered buffer;
//! READ payloads are received with `recv` straight into it, and on the server straight into
//! and out of the arena. Many requests are in flight per connection (the server answers in
//! order). Nothing is allocated per operation on the hot path. A connection that fails or makes
//! no progress for `op_timeout` completes everything outstanding with
//! [`WcStatus::TransportError`](crate::fabric::WcStatus).

mod client;
mod nic;
pub mod sendq;
pub mod wire;

pub use client::TcpQp;

use super::{
    CompletionQueue, Exchange, Fabric, FabricError, PeerGuard, QueuePair, Registry, SessionKey,
    Token,
};
use crate::sync::{Arc, Mutex};
use nic::Nic;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;
use wire::{DATA_MAGIC, TICK};

/// Tunables of the TCP fabric.
#[derive(Debug, Clone)]
pub struct TcpConfig {
    /// An operation that sees no progress on its connection for this long fails with a
    /// transport error (a dead or frozen peer never hangs a waiter).
    pub op_timeout: Duration,
    pub connect_timeout: Duration,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            op_timeout: crate::config::OP_TIMEOUT,
            // A data connection follows a control connection that just succeeded: a peer that
            // takes longer than this to accept is not one to lend memory to.
            connect_timeout: Duration::from_secs(5),
        }
    }
}

/// The TCP software fabric (client and server roles share one instance per process).
pub struct TcpFabric {
    registry: Arc<Registry>,
    config: TcpConfig,
    nic: Mutex<Option<Nic>>,
}

impl TcpFabric {
    pub fn new(config: TcpConfig) -> Arc<TcpFabric> {
        Arc::new(TcpFabric {
            registry: Arc::new(Registry::new()),
            config,
            nic: Mutex::new(None),
        })
    }

    /// Stops serving data: closes the NIC listener and every data connection, as if the
    /// server's NIC went dark. Clients see transport errors.
    pub fn shutdown_nic(&self) {
        let nic = self.nic.lock().take();
        if let Some(nic) = nic {
            nic.stop();
        }
    }

    /// The NIC's data port, starting the NIC on first use. It listens on the same address as
    /// the server's control listener (`listen`), so a wildcard listen serves every interface
    /// and every client that reached the control port can reach the data port.
    fn nic_port(&self, listen: SocketAddr) -> Result<u16, FabricError> {
        let mut nic = self.nic.lock();
        if let Some(n) = nic.as_ref() {
            return Ok(n.bound.port());
        }
        let started =
            Nic::start(listen, self.registry.clone(), self.config.op_timeout).map_err(|e| {
                FabricError::Connect {
                    addr: listen,
                    source: e,
                }
            })?;
        let port = started.bound.port();
        *nic = Some(started);
        Ok(port)
    }
}

impl Fabric for TcpFabric {
    fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    fn name(&self) -> &'static str {
        "tcp"
    }

    /// As on an RC queue pair: the NIC closes a data connection on its first remote access
    /// error, so a client cannot probe keys one after another.
    fn errors_break_qp(&self) -> bool {
        true
    }

    fn connect(
        &self,
        server: SocketAddr,
        exchange: &mut Exchange<'_>,
        cq: Arc<CompletionQueue>,
        token: &Token,
    ) -> Result<Arc<dyn QueuePair>, FabricError> {
        let reply = exchange(Vec::new())?;
        let port = match reply.as_slice() {
            [a, b] => u16::from_le_bytes([*a, *b]),
            _ => {
                return Err(FabricError::Handshake {
                    addr: server,
                    reason: format!("expected a 2-byte data port, got {} bytes", reply.len()),
                })
            }
        };
        let data_addr = SocketAddr::new(server.ip(), port);
        let mut stream = TcpStream::connect_timeout(&data_addr, self.config.connect_timeout)
            .map_err(|e| FabricError::Connect {
                addr: data_addr,
                source: e,
            })?;
        let setup = |s: &mut TcpStream| -> io::Result<()> {
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(TICK))?;
            s.set_write_timeout(Some(TICK))?;
            // The session's token binds this connection to the authenticated session.
            s.write_all(&[&DATA_MAGIC[..], &token[..]].concat())
        };
        setup(&mut stream).map_err(|e| FabricError::Handshake {
            addr: data_addr,
            reason: e.to_string(),
        })?;
        TcpQp::start(stream, self.registry.clone(), cq, self.config.op_timeout)
            .map(|qp| qp as Arc<dyn QueuePair>)
    }

    fn accept(
        &self,
        _blob: &[u8],
        listen: SocketAddr,
        session: SessionKey,
    ) -> Result<(Vec<u8>, PeerGuard), FabricError> {
        let port = self.nic_port(listen)?;
        let guard = self.registry.open_session(session);
        Ok((port.to_le_bytes().to_vec(), Box::new(guard)))
    }
}

impl Drop for TcpFabric {
    fn drop(&mut self) {
        self.shutdown_nic();
    }
}
