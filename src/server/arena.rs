//! The server's arena: one mapping lent out in extents (anonymous, or a backing file's:
//! [`super::backing`]), reserved (populated and locked) at start unless `--lazy`, never
//! exposed as a Rust slice.

use crate::fabric::mem::page_size;
use std::io;

/// The server's memory: one anonymous mapping, never exposed as a Rust slice (remote peers
/// write it through the fabric at any time).
pub(super) struct Arena {
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
    /// The whole mapping the arena lies in (a backing file's also holds its metadata).
    map_base: *mut u8,
    map_len: usize,
}

// SAFETY: the arena is a raw mapping owned by the server; it is only accessed through raw
// pointers by the fabric after bounds checks against registrations.
unsafe impl Send for Arena {}
// SAFETY: as above; no references to its bytes are ever created.
unsafe impl Sync for Arena {}

/// `madvise` advice that faults every page of a range in, writable (Linux 5.14+;
/// include/uapi/asm-generic/mman-common.h; not in the libc crate this builds with).
const MADV_POPULATE_WRITE: libc::c_int = 23;

/// How a reserved arena came out ([`Arena::reserve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserved {
    /// Every page faulted in and locked in RAM (no swap, no reclaim).
    Locked,
    /// Every page faulted in, but not locked (the memlock limit is below the arena); the
    /// host may still swap it out under pressure.
    Populated,
}

impl Arena {
    /// Faults every page of the arena in now (and locks it where the memlock limit allows),
    /// so the first write into it costs what a later one does and the host cannot take the
    /// memory back under pressure. Done before the server listens: no client exists yet,
    /// so nothing else touches the arena meanwhile.
    pub(super) fn reserve(&self) -> io::Result<Reserved> {
        // SAFETY: the range is this arena's own mapping; the advice only faults its pages in
        // (their contents stay zero).
        let r =
            unsafe { libc::madvise(self.ptr as *mut libc::c_void, self.len, MADV_POPULATE_WRITE) };
        if r != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINVAL) {
                return Err(e);
            }
            // A kernel before 5.14: touch each page instead.
            let page = page_size();
            for off in (0..self.len).step_by(page) {
                // SAFETY: `off` is inside the mapping, which is writable; nothing else holds
                // a reference to its bytes (no client exists yet), and the byte written is
                // the one read (a backed arena keeps its contents).
                unsafe {
                    let p = self.ptr.add(off);
                    std::ptr::write_volatile(p, std::ptr::read_volatile(p));
                }
            }
        }
        // SAFETY: locking our own mapping's pages; the result is checked.
        let locked = unsafe { libc::mlock(self.ptr as *const libc::c_void, self.len) } == 0;
        Ok(if locked {
            Reserved::Locked
        } else {
            Reserved::Populated
        })
    }

    pub(super) fn map(len: usize) -> io::Result<Arena> {
        // SAFETY: a fresh anonymous private mapping; the result is checked. NORESERVE: the
        // arena only costs RAM where clients write (and where extents are pinned).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Arena {
            ptr: ptr as *mut u8,
            len,
            map_base: ptr as *mut u8,
            map_len: len,
        })
    }

    /// The arena of a backing file's mapping ([`super::backing`]): `len` bytes at `ptr`,
    /// inside the mapping `map_base..map_base + map_len`, which the arena unmaps on drop.
    pub(super) fn backed(ptr: *mut u8, len: usize, map_base: *mut u8, map_len: usize) -> Arena {
        Arena {
            ptr,
            len,
            map_base,
            map_len,
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping. The server (and with it every session holding
        // registrations into the arena) is gone by the time the arena drops.
        unsafe { libc::munmap(self.map_base as *mut libc::c_void, self.map_len) };
    }
}
