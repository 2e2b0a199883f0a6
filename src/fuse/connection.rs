//! The FUSE connection around the handlers: aborting it through the fuse control file
//! system (a failed io_uring queue), and the invalidations the file system sends the kernel
//! on its own (attributes changed behind its back, a follower's or shared client's changes).

use super::FuseFs;
use crate::fs::Fs;
use fuser::INodeNo;
use std::sync::Arc;

/// Where the fuse control file system is mounted (`mount -t fusectl`): each connection's
/// directory there holds its `abort` file.
pub const FUSECTL: &str = "/sys/fs/fuse/connections";
/// [`FUSECTL`] for mount(2).
const FUSECTL_C: &std::ffi::CStr = c"/sys/fs/fuse/connections";

impl FuseFs {
    /// Where the mount puts its connection's control `abort` file once it is mounted.
    pub fn connection(&self) -> Arc<std::sync::OnceLock<std::path::PathBuf>> {
        self.abort_file.clone()
    }

    /// Aborts this mount's FUSE connection through the fuse control file system (mounting it
    /// first if needed; root only): requests waiting in the kernel fail at once, and the
    /// session ends as if unmounted. False if that could not be done.
    pub(super) fn abort_connection(&self) -> bool {
        let Some(abort) = self.abort_file.get() else {
            return false;
        };
        if !abort.exists() {
            let (src, dir) = (c"fusectl", FUSECTL_C);
            // SAFETY: every argument is a NUL-terminated string that outlives the call; the
            // data argument may be null.
            unsafe {
                libc::mount(
                    src.as_ptr(),
                    dir.as_ptr(),
                    src.as_ptr(),
                    0,
                    std::ptr::null(),
                )
            };
        }
        match std::fs::write(abort, "1") {
            Ok(()) => true,
            Err(e) => {
                log::error!(
                    "cannot abort the FUSE connection ({}): {e}",
                    abort.display()
                );
                false
            }
        }
    }

    /// Makes `fs` tell the kernel of `session` when an inode's attributes change behind its
    /// back (an attribute-only invalidation: offset -1 leaves the page cache alone and takes
    /// no lock a request in flight holds, so it may be sent from inside a handler).
    pub fn forward_invalidations(fs: &Fs, session: &fuser::Session<FuseFs>) {
        let notifier = session.notifier();
        fs.on_attr_changed(Box::new(move |ino| {
            if let Err(e) = notifier.inval_inode(INodeNo(ino), -1, 0) {
                log::debug!("invalidating inode {ino}: {e}");
            }
        }));
        // A follower's: what the volume's holder changed (attributes and cached pages,
        // names). Sent with no lock of the file system held (see `Fs::apply_followed`); an
        // inode or name the kernel does not hold answers ENOENT, which is fine.
        let notifier = session.notifier();
        fs.on_followed(Box::new(move |changes| {
            use std::os::unix::ffi::OsStrExt;
            for c in changes {
                let sent = match c {
                    crate::fs::Invalidation::Inode(ino) => {
                        notifier.inval_inode(INodeNo(*ino), 0, 0)
                    }
                    crate::fs::Invalidation::Entry { dir, name } => {
                        notifier.inval_entry(INodeNo(*dir), std::ffi::OsStr::from_bytes(name))
                    }
                };
                if let Err(e) = sent {
                    log::trace!("invalidating {c:?}: {e}");
                }
            }
        }));
    }
}
