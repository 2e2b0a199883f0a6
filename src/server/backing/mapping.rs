//! The backing file as the kernel sees it: whether a device may pin it, where it is mapped
//! (at the address the arena had, so clients' extent addresses stay valid) and its header.

use super::{Layout, FORMAT, HEADER_LEN, OWNERS_SLOT};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

/// Whether a device (verbs) may pin a shared mapping of `path` for writing: the kernel refuses
/// a writable long-term pin of a file on a file system with writeback (ext4, xfs) and of
/// fsdax; devdax (a character device), tmpfs and hugetlbfs are pinnable.
pub(in crate::server) fn pinnable_by_device(path: &Path) -> Result<(), String> {
    /// `statfs` magic numbers (include/uapi/linux/magic.h).
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;
    if std::fs::metadata(path).is_ok_and(|m| m.file_type().is_char_device()) {
        return Ok(());
    }
    let dir = match path.parent() {
        Some(p) if !path.exists() && !p.as_os_str().is_empty() => p,
        _ => path,
    };
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("{} has a NUL byte", dir.display()))?;
    // SAFETY: a zeroed statfs is a valid out-parameter; the path is a NUL-terminated C string.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the result is checked.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(format!(
            "cannot stat the file system of {}: {}",
            dir.display(),
            io::Error::last_os_error()
        ));
    }
    match st.f_type as i64 {
        TMPFS_MAGIC | HUGETLBFS_MAGIC => Ok(()),
        other => Err(format!(
            "{} is on a file system (type {other:#x}) whose shared mappings an RDMA device \
             cannot pin for writing (the kernel refuses long-term pins of ext4, xfs and fsdax \
             files): put the backing file on devdax, tmpfs or hugetlbfs",
            path.display()
        )),
    }
}

/// Where a new backing file's first mapping is asked for (a hint; the kernel picks elsewhere
/// if it is taken): a random 1 GiB-aligned address between 32 and 64 TiB, away from where
/// the kernel places mappings by itself (top-down from just below the stack, near 128 TiB,
/// with the binary and its heap near 86 TiB on x86-64). A restart must map the file at the
/// same address again: there, no thread stack, library or allocation of the new process (or,
/// in tests, of another server in the same process) has taken it first.
fn fresh_map_hint() -> *mut libc::c_void {
    const LOW: u64 = 32 << 40;
    const SPAN: u64 = 32 << 40;
    const ALIGN: u64 = 1 << 30;
    if usize::BITS < 64 {
        return std::ptr::null_mut();
    }
    let r = u64::from_le_bytes(crate::auth::random_bytes::<8>());
    (LOW + (r % (SPAN / ALIGN)) * ALIGN) as usize as *mut libc::c_void
}

/// Maps `len` bytes of `file` shared, at `at` exactly when given (`MAP_FIXED_NOREPLACE`:
/// refused rather than moved if something else is there).
pub(super) fn map(file: &File, len: u64, at: Option<u64>) -> io::Result<(*mut u8, usize)> {
    let len = usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let (hint, flags) = match at {
        Some(a) => (
            a as *mut libc::c_void,
            libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE,
        ),
        None => (fresh_map_hint(), libc::MAP_SHARED),
    };
    // SAFETY: a new shared mapping of our file; the result is checked. NOREPLACE never
    // unmaps anything already there.
    let ptr = unsafe {
        libc::mmap(
            hint,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            file.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    if at.is_some() && ptr != hint {
        // A kernel before 4.17 takes NOREPLACE as a hint.
        // SAFETY: unmapping the mapping just made.
        unsafe { libc::munmap(ptr, len) };
        return Err(io::Error::from(io::ErrorKind::AddrInUse));
    }
    Ok((ptr as *mut u8, len))
}

pub(super) fn read_header(h: &[u8; HEADER_LEN + 4]) -> Result<(Layout, u64), String> {
    let crc = u32::from_le_bytes(h[HEADER_LEN..].try_into().expect("4 bytes"));
    if crc32fast::hash(&h[..HEADER_LEN]) != crc {
        return Err("its checksum does not match".into());
    }
    let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().expect("8 bytes"));
    let format = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
    if format != FORMAT {
        return Err(format!(
            "format {format}; this rmemfs reads format {FORMAT} (a newer rmemfs wrote it)"
        ));
    }
    let page = u32::from_le_bytes(h[12..16].try_into().expect("4 bytes")) as u64;
    if !page.is_power_of_two() {
        return Err(format!("page size {page}"));
    }
    let arena_len = u64_at(16);
    let layout = Layout::new(arena_len, page);
    let recorded = (u64_at(24), u64_at(40), u64_at(48), u64_at(56));
    if recorded
        != (
            layout.arena_offset,
            layout.owners_offset,
            OWNERS_SLOT,
            layout.table_offset,
        )
    {
        return Err("its layout is not this format's".into());
    }
    Ok((layout, u64_at(32)))
}
