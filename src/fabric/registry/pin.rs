//! Pinning local memory for a registration (`mlock` on the software fabrics), and the
//! checks of a range before anything is registered.

use super::*;

/// Pages locked with `mlock`, unlocked on drop: what registration costs on a software fabric.
///
/// `munlock` is not reference-counted by the kernel, so two registrations sharing a page unpin
/// it when the first goes; the software NIC reaches memory by virtual address, so this only
/// affects the cost model, never correctness.
#[derive(Debug)]
pub struct Pin {
    start: usize,
    len: usize,
    pinned: Arc<AtomicU64>,
}

impl Pin {
    pub fn new(addr: *mut u8, len: usize, pinned: Arc<AtomicU64>) -> Result<Pin, FabricError> {
        let page = page_size();
        let start = (addr as usize) & !(page - 1);
        let end = round_up(addr as u64 + len as u64, page as u64) as usize;
        let span = end - start;
        // SAFETY: mlock only changes residency of pages in our own address space; a bad range
        // gives ENOMEM rather than undefined behaviour.
        let rc = unsafe { libc::mlock(start as *const libc::c_void, span) };
        if rc != 0 {
            let err = io::Error::last_os_error();
            // mlock may fail after locking part of the range (EAGAIN while faulting pages in,
            // ENOMEM at a hole): unlock it all, so nothing stays locked that no Pin owns.
            // SAFETY: as above; unlocking pages never locked is harmless.
            unsafe { libc::munlock(start as *const libc::c_void, span) };
            return Err(match err.raw_os_error() {
                Some(libc::ENOMEM) | Some(libc::EPERM) | Some(libc::EAGAIN) => {
                    FabricError::PinLimit {
                        len: span as u64,
                        limit: memlock_limit_text(),
                    }
                }
                _ => FabricError::Register(format!("mlock of {span} bytes: {err}")),
            });
        }
        pinned.fetch_add(span as u64, Ordering::Relaxed);
        Ok(Pin {
            start,
            len: span,
            pinned,
        })
    }
}

/// A registration a software fabric made without pinning because the memlock limit refused
/// it (a user's mount: `ulimit -l` is 8 MiB by default): counted, and unpinned bytes counted
/// apart. The software NIC reaches memory by virtual address, so nothing depends on the pin
/// but the cost model.
#[derive(Debug)]
pub(super) struct Unpinned {
    pub(super) len: u64,
    pub(super) unpinned: Arc<AtomicU64>,
}

impl Drop for Unpinned {
    fn drop(&mut self) {
        self.unpinned.fetch_sub(self.len, Ordering::Relaxed);
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        // SAFETY: unlocking a range we locked; harmless if it was unmapped meanwhile.
        unsafe { libc::munlock(self.start as *const libc::c_void, self.len) };
        self.pinned.fetch_sub(self.len as u64, Ordering::Relaxed);
    }
}

/// Refuses a null, empty or wrapping range before anything is registered.
pub fn check_range(addr: *mut u8, len: usize) -> Result<(), FabricError> {
    if addr.is_null() || len == 0 {
        return Err(FabricError::InvalidRegion("null or empty range"));
    }
    if (addr as u64).checked_add(len as u64).is_none() {
        return Err(FabricError::InvalidRegion("range wraps the address space"));
    }
    Ok(())
}
