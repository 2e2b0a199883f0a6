//! The pool's failures ([`PoolError`]), and the errno each one is to a program (the pool's
//! and the fabric's errors become the file system's [`Error`] here, beside their types).

use crate::error::Error;
use crate::fabric::{FabricError, Opcode, ServerId, WcStatus};
use crate::proto::RefusalCode;
use std::net::SocketAddr;

/// Pool failures. Every variant that concerns one server names it.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("memory server {addr} is unreachable: {reason}")]
    Unreachable { addr: SocketAddr, reason: String },
    #[error("memory server {addr} refused the handshake: {reason}")]
    Handshake { addr: SocketAddr, reason: String },
    #[error("{reason}")]
    Auth { addr: SocketAddr, reason: String },
    #[error("lost the control connection to memory server {addr}: {reason}")]
    ControlLost { addr: SocketAddr, reason: String },
    #[error("memory server {addr} ({server}) has failed")]
    ServerFailed { server: ServerId, addr: SocketAddr },
    #[error("{opcode:?} on memory server {addr} ({server}) failed: {status:?}")]
    Op {
        server: ServerId,
        addr: SocketAddr,
        opcode: Opcode,
        status: WcStatus,
    },
    #[error("no memory server has {requested} contiguous bytes free")]
    NoSpace { requested: u64 },
    /// Nothing could be placed because no server is up (not for want of room: EIO).
    #[error("no memory server is up to hold {requested} bytes")]
    NoServerUp { requested: u64 },
    #[error("memory server {addr} refused: {message}")]
    Refused {
        addr: SocketAddr,
        code: RefusalCode,
        message: String,
    },
    #[error("{0}")]
    Fabric(#[from] FabricError),
    #[error("bad request: {0}")]
    Invalid(String),
}

impl PoolError {
    /// The server an operation failed on, or that failed, if the error is about one server's
    /// data path (what a replicated write drops that server's copy for).
    pub fn failed_server(&self) -> Option<ServerId> {
        match self {
            PoolError::ServerFailed { server, .. } => Some(*server),
            PoolError::Op {
                server,
                status: WcStatus::TransportError | WcStatus::RemoteAccessError,
                ..
            } => Some(*server),
            _ => None,
        }
    }
}

impl From<PoolError> for Error {
    fn from(e: PoolError) -> Error {
        let errno = match &e {
            PoolError::NoSpace { .. }
            | PoolError::Refused {
                code: RefusalCode::NoSpace,
                ..
            } => libc::ENOSPC,
            PoolError::Refused {
                code: RefusalCode::BadLength,
                ..
            } => libc::EFBIG,
            PoolError::Refused {
                code: RefusalCode::RegistrationFailed,
                ..
            } => libc::ENOMEM,
            PoolError::Op {
                status: WcStatus::LocalProtectionError,
                ..
            } => libc::EFAULT,
            PoolError::Invalid(_) => libc::EINVAL,
            PoolError::Fabric(FabricError::PinLimit { .. }) => libc::ENOMEM,
            // A server that failed, refused, or an operation that failed on it: the data is
            // not reachable, which programs know as EIO.
            _ => libc::EIO,
        };
        Error::new(errno, e.to_string())
    }
}

impl From<FabricError> for Error {
    fn from(e: FabricError) -> Error {
        PoolError::Fabric(e).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos_are_chosen_here() {
        let addr = "127.0.0.1:1".parse().unwrap();
        let e: Error = PoolError::NoSpace { requested: 1 }.into();
        assert_eq!(e.errno, libc::ENOSPC);
        let e: Error = PoolError::Op {
            server: ServerId(0),
            addr,
            opcode: Opcode::Read,
            status: WcStatus::TransportError,
        }
        .into();
        assert_eq!(e.errno, libc::EIO);
        let e: Error = PoolError::ServerFailed {
            server: ServerId(1),
            addr,
        }
        .into();
        assert_eq!(e.errno, libc::EIO);
        assert!(e.message.contains("127.0.0.1:1"));
    }
}
