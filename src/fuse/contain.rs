//! Every handler runs inside [`FuseFs::contain`]: the adapter's request figures, the freeze's
//! door for requests that change something, and a panic (a bug) kept to its one request.

use super::*;

/// The requests that change nothing (a freeze lets them through). Every other one may change
/// the namespace or a file's data (a release or forget may drop an unlinked file).
const READ_ONLY_OPS: [&str; 21] = [
    "lookup",
    "getattr",
    "statx",
    "read",
    "readdir",
    "readdirplus",
    "opendir",
    "releasedir",
    "readlink",
    "statfs",
    "getxattr",
    "listxattr",
    "access",
    "lseek",
    "poll",
    "fsync",
    "fsyncdir",
    // File locks and FLUSH (which releases them) change no file.
    "getlk",
    "setlk",
    "flock",
    "flush",
];

/// The bit the kernel sets in the id of a request it sends again (FUSE_NOTIFY_RESEND).
const FUSE_UNIQUE_RESEND: u64 = 1 << 63;

impl FuseFs {
    /// Runs one handler; a panic inside it becomes EIO for this request only. A request
    /// that may change the file system waits while it is frozen (see [`Fs::freeze`]).
    pub(super) fn contain(&self, op: &'static str, req: &Request, handler: impl FnOnce()) {
        let _admitted = (!READ_ONLY_OPS.contains(&op)).then(|| self.fs.admit_change());
        let start = std::time::Instant::now();
        let figures = &self.figures;
        figures.in_flight.fetch_add(1, Ordering::Relaxed);
        if req.unique().0 & FUSE_UNIQUE_RESEND != 0 {
            figures.resent.fetch_add(1, Ordering::Relaxed);
        }
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(handler));
        figures.in_flight.fetch_sub(1, Ordering::Relaxed);
        figures
            .requests
            .record(op, start.elapsed().as_nanos() as u64);
        if let Err(panic) = outcome {
            let why = crate::error::panic_message(&*panic);
            figures.contained_panics.fetch_add(1, Ordering::Relaxed);
            log::error!(
                "bug: {op} (request {}, pid {}, uid {}) panicked: {why}; answered EIO, the mount \
                 goes on",
                req.unique().0,
                req.pid(),
                req.uid()
            );
        }
    }
}
