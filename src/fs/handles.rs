//! Handles: the numbers the kernel holds between an open and its release.
//!
//! A handle number carries the open mode and the incarnation of the daemon that issued it
//! (`incarnation << 40 | serial << 4 | mode`), so a daemon that takes over a FUSE connection
//! an earlier daemon kept open (restart without unmounting, `mount::keeper`) serves the
//! handles that daemon opened: a number below its own first is adopted on first use, with
//! the mode it spells, for the inode the request names.

use super::{err, Fs, Handle, OpenMode};
use crate::error::Result;
use crate::meta::Ino;
use crate::sync::atomic::Ordering;

/// The low bits of a handle number: its open mode.
const MODE_BITS: u32 = 4;
/// Where the incarnation starts: 2^36 opens per daemon before the serial would reach it.
const INCARNATION_SHIFT: u32 = 40;

fn mode_bits(mode: OpenMode) -> u64 {
    u64::from(mode.read)
        | u64::from(mode.write) << 1
        | u64::from(mode.append) << 2
        | u64::from(mode.noatime) << 3
}

fn mode_of(fh: u64) -> OpenMode {
    OpenMode {
        read: fh & 1 != 0,
        write: fh & 2 != 0,
        append: fh & 4 != 0,
        truncate: false,
        noatime: fh & 8 != 0,
    }
}

impl Fs {
    /// This daemon serves a connection earlier daemons of the same volume served:
    /// `incarnation` (above each of theirs) goes into its handle numbers, and every inode the
    /// kernel may still hold is pinned (their lookup counts died with the earlier daemon, so
    /// none is dropped before the next fresh attach: an unlinked file a program still has
    /// open stays readable).
    pub fn take_over_connection(&self, incarnation: u32) {
        let base = u64::from(incarnation) << INCARNATION_SHIFT;
        self.handle_base.store(base, Ordering::Relaxed);
        self.next_fh
            .store(base + (1 << MODE_BITS), Ordering::Relaxed);
        self.meta.lock().pin_kernel_refs();
    }

    /// Issues a handle number (a file's with its `mode`, a directory stream's with none).
    pub(super) fn issue_fh(&self, mode: OpenMode) -> u64 {
        self.next_fh.fetch_add(1 << MODE_BITS, Ordering::Relaxed) | mode_bits(mode)
    }

    /// Whether `fh` was issued by an earlier daemon of this connection.
    pub(super) fn inherited(&self, fh: u64) -> bool {
        fh < self.handle_base.load(Ordering::Relaxed)
    }

    pub(super) fn new_handle(&self, ino: Ino, mode: OpenMode) -> u64 {
        let fh = self.issue_fh(mode);
        self.handles.lock().insert(fh, Handle { ino, mode });
        fh
    }

    /// The open mode of handle `fh` to `ino`: EBADF for a number nobody issued, or one
    /// issued for another inode.
    pub(super) fn handle(&self, fh: u64, ino: Ino) -> Result<OpenMode> {
        match self.handles.lock().get(&fh) {
            Some(h) if h.ino == ino => return Ok(h.mode),
            Some(_) => return Err(err(libc::EBADF)),
            None if !self.inherited(fh) => return Err(err(libc::EBADF)),
            None => {}
        }
        self.adopt(fh, ino)
    }

    /// Takes on handle `fh`, opened on `ino` by an earlier daemon of this connection.
    fn adopt(&self, fh: u64, ino: Ino) -> Result<OpenMode> {
        let mode = mode_of(fh);
        {
            let mut meta = self.meta.lock();
            super::inode(&meta, ino)?;
            meta.opened(ino);
        }
        let mut handles = self.handles.lock();
        if let Some(h) = handles.get(&fh) {
            // Adopted by a request that ran beside this one: count the open once.
            let known = (h.ino == ino).then_some(h.mode);
            drop(handles);
            self.meta.lock().closed(ino);
            return known.ok_or_else(|| err(libc::EBADF));
        }
        handles.insert(fh, Handle { ino, mode });
        log::debug!("adopted handle {fh:#x} of inode {ino} from an earlier daemon");
        Ok(mode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_number_spells_its_mode() {
        for bits in 0..8u64 {
            let mode = mode_of(bits);
            assert_eq!(mode_bits(mode), bits);
        }
        let append_write = OpenMode::from_flags(libc::O_WRONLY | libc::O_APPEND);
        let m = mode_of(mode_bits(append_write) | 7 << MODE_BITS);
        assert!(m.write && m.append && !m.read);
    }
}
