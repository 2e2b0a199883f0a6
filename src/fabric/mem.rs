//! Local memory that the fabrics move data to and from: page-aligned buffers that are never
//! handed out as Rust slices.
//!
//! Memory that a peer may write at any moment is never turned into a long-lived `&[u8]` or
//! `&mut [u8]`: it stays a raw `(ptr, len)` range, checked against its registration on every
//! operation (see [`super::registry`]) and moved with `ptr::copy_nonoverlapping` or
//! `recv`/`sendmsg` straight from and to the raw pointer. The one exception is a short-lived
//! shared view of a buffer no operation can reach any more ([`AlignedBuf::quiet_bytes`]),
//! so a read's bytes go to the kernel from where the fabric put them.

use std::io;

/// The page size everything is aligned to (pinning works on whole pages).
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 {
        v as usize
    } else {
        4096
    }
}

/// Rounds `v` up to a multiple of `align` (a power of two).
pub fn round_up(v: u64, align: u64) -> u64 {
    (v + align - 1) & !(align - 1)
}

/// An owned, page-aligned, anonymous mapping: the buffers rmemfs registers.
///
/// It hands out no references to its bytes; all access is through copies, because the fabric
/// may be writing into it concurrently.
#[derive(Debug)]
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
    map_len: usize,
}

// SAFETY: the buffer is plain memory owned by this value; all access goes through raw copies,
// and concurrent writers to the same bytes (as with a NIC) race only on data, never on the
// mapping itself, which lives until drop.
unsafe impl Send for AlignedBuf {}
// SAFETY: see `Send`; shared access only performs raw copies.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Maps `len` zeroed bytes (at least one page).
    pub fn new(len: usize) -> io::Result<AlignedBuf> {
        let map_len = round_up(len.max(1) as u64, page_size() as u64) as usize;
        // SAFETY: anonymous private mapping with no address hint; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(AlignedBuf {
            ptr: ptr as *mut u8,
            len,
            map_len,
        })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `data` into the buffer at `offset`. Panics if out of bounds (a caller bug).
    pub fn write_at(&self, offset: usize, data: &[u8]) {
        assert!(offset
            .checked_add(data.len())
            .is_some_and(|e| e <= self.len));
        // SAFETY: bounds checked above; source is a distinct Rust slice.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(offset), data.len()) }
    }

    /// Copies bytes out of the buffer at `offset`. Panics if out of bounds (a caller bug).
    pub fn read_at(&self, offset: usize, out: &mut [u8]) {
        assert!(offset.checked_add(out.len()).is_some_and(|e| e <= self.len));
        // SAFETY: bounds checked above; destination is a distinct Rust slice.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(offset), out.as_mut_ptr(), out.len()) }
    }

    /// Returns a copy of `len` bytes at `offset`.
    pub fn to_vec(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.read_at(offset, &mut v);
        v
    }

    /// Zeroes `len` bytes at `offset`. Panics if out of bounds (a caller bug).
    pub fn zero(&self, offset: usize, len: usize) {
        assert!(offset.checked_add(len).is_some_and(|e| e <= self.len));
        // SAFETY: bounds checked above; the range lies inside our mapping.
        unsafe { std::ptr::write_bytes(self.ptr.add(offset), 0, len) }
    }

    /// A shared view of `len` bytes at `offset`. Panics if out of bounds (a caller bug).
    ///
    /// # Safety
    /// Nothing may write these bytes while the view lives: no operation may be in flight on
    /// them (every one that used them has completed), and the caller holds the buffer alone.
    pub unsafe fn quiet_bytes(&self, offset: usize, len: usize) -> &[u8] {
        assert!(offset.checked_add(len).is_some_and(|e| e <= self.len));
        // SAFETY: bounds checked above; the caller guarantees no writer while the view lives,
        // and the mapping lives as long as `self`, which the view borrows.
        unsafe { std::slice::from_raw_parts(self.ptr.add(offset), len) }
    }

    /// Sets every byte to `byte`.
    pub fn fill(&self, byte: u8) {
        // SAFETY: the whole mapping of `len` bytes is ours.
        unsafe { std::ptr::write_bytes(self.ptr, byte, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping created in `new`; no references into it exist.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.map_len) };
    }
}

/// The soft RLIMIT_MEMLOCK in bytes; `None` when unlimited (or unknown).
pub fn memlock_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0
        || lim.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    Some(lim.rlim_cur)
}

/// The soft RLIMIT_MEMLOCK, for error messages.
pub fn memlock_limit_text() -> String {
    match memlock_limit() {
        None => "unlimited".into(),
        Some(bytes) => format!("{} KiB", bytes / 1024),
    }
}
