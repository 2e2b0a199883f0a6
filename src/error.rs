//! The one error type the file system reports: an errno (what FUSE sends back to the program)
//! with a message for the log. Each module's error converts into it beside its own type (the
//! pool's and the fabric's in `client/error.rs`), so the errno of each failure is chosen once
//! and this ground imports no layer above it.

#[derive(Debug, thiserror::Error)]
#[error("{message} (errno {errno})")]
pub struct Error {
    pub errno: i32,
    pub message: String,
    /// A shared volume's change decided on a view of this inode another client changed
    /// since: it is decided again on a table caught up, never answered with this error.
    pub conflict: Option<u64>,
    /// The change touched [`Error::conflict`]'s key shared (a directory it adds a name to,
    /// as other clients may at once): the table catches up and the change runs again
    /// without holding that key's turn ([`crate::fs::Turns::pass`]).
    pub conflict_shared: bool,
    /// A shared volume's drop of this inode, refused because another client has it open:
    /// that client drops it once it lets go (EBUSY if it ever reached a program).
    pub held_elsewhere: Option<u64>,
    /// A partial table (a shared client that loads the namespace as it is used) does not
    /// hold this inode, or this directory's names: loaded, the operation runs again
    /// (`crate::fs::Fs::loading`); ENOENT if it ever reached a program.
    pub unloaded: Option<u64>,
}

impl Error {
    pub fn new(errno: i32, message: impl Into<String>) -> Error {
        Error {
            errno,
            message: message.into(),
            conflict: None,
            conflict_shared: false,
            held_elsewhere: None,
            unloaded: None,
        }
    }

    /// A shared volume's change that must be decided again (see [`Error::conflict`]): EIO if
    /// it ever reached a program.
    pub fn conflict(ino: u64, message: impl Into<String>) -> Error {
        Error {
            conflict: Some(ino),
            ..Error::new(libc::EIO, message)
        }
    }
}

impl Error {
    /// A shared volume's drop of inode `ino` refused: open on another client (see
    /// [`Error::held_elsewhere`]).
    pub fn held_elsewhere(ino: u64, message: impl Into<String>) -> Error {
        Error {
            held_elsewhere: Some(ino),
            ..Error::new(libc::EBUSY, message)
        }
    }
}

impl Error {
    /// What a partial table does not hold: inode `ino`, or directory `ino`'s names (see
    /// [`Error::unloaded`]).
    pub fn unloaded(ino: u64) -> Error {
        Error {
            unloaded: Some(ino),
            ..Error::new(libc::ENOENT, format!("inode {ino} is not loaded here"))
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

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::new(e.raw_os_error().unwrap_or(libc::EIO), e.to_string())
    }
}
