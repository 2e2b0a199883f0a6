//! The one error type the file system reports: an errno (what FUSE sends back to the program)
//! with a message for the log. Module errors convert into it here, in one place, so the choice
//! of errno for each failure is made once.

use crate::client::PoolError;
use crate::fabric::{FabricError, WcStatus};
use crate::proto::RefusalCode;

#[derive(Debug, thiserror::Error)]
#[error("{message} (errno {errno})")]
pub struct Error {
    pub errno: i32,
    pub message: String,
}

impl Error {
    pub fn new(errno: i32, message: impl Into<String>) -> Error {
        Error {
            errno,
            message: message.into(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a caught panic said (its payload, when it is text), for the log.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
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

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::new(e.raw_os_error().unwrap_or(libc::EIO), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::{Opcode, ServerId};

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
