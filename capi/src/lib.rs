//! rmemfs's library (`rmemfs::library`) as a C ABI: `include/rmemfs.h` declares it, and the
//! Python package (`python/rmemfs`) loads it with ctypes.
//!
//! Conventions: calls return 0 or a count on success and a negative errno on failure
//! (`rmemfs_open_volume` returns NULL and sets `errno`); `rmemfs_last_error` gives the
//! failed call's message on this thread. Strings are NUL-terminated UTF-8. A volume may be
//! used from several threads at once.

use rmemfs::error::Error;
use rmemfs::library::{open_volume, Mode, ReadRequest, Volume, VolumeOptions};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::path::PathBuf;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn remember(e: &Error) -> i64 {
    let text = CString::new(e.message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = text);
    -(e.errno as i64)
}

fn invalid(what: &str) -> Error {
    Error::new(libc::EINVAL, what.to_string())
}

/// The string at `s`, if it is one.
///
/// # Safety
/// `s` is NULL or a NUL-terminated string that outlives the call.
unsafe fn text<'a>(s: *const c_char) -> Result<&'a str, Error> {
    if s.is_null() {
        return Err(invalid("a NULL string"));
    }
    // SAFETY: not NULL, and the caller passes a NUL-terminated string.
    unsafe { CStr::from_ptr(s) }
        .to_str()
        .map_err(|_| invalid("a string that is not UTF-8"))
}

/// Runs `f` on the volume at `v`, turning its error into a negative errno.
///
/// # Safety
/// `v` is NULL or a volume from `rmemfs_open_volume` not yet closed.
unsafe fn with(v: *const Volume, f: impl FnOnce(&Volume) -> Result<i64, Error>) -> i64 {
    // SAFETY: the caller passes a live volume (or NULL, refused).
    match unsafe { v.as_ref() } {
        None => remember(&invalid("a NULL volume")),
        Some(v) => f(v).unwrap_or_else(|e| remember(&e)),
    }
}

/// The message of this thread's last failed call ("" if none); valid until its next call.
#[no_mangle]
pub extern "C" fn rmemfs_last_error() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}

/// Opens volume `name` on `servers` (comma-separated `host[:port]`); `secret_file` may be
/// NULL; `mode` 0 follows, 1 holds; `create` (holders) makes it if missing. NULL on failure,
/// with `errno` set.
///
/// # Safety
/// The strings are NUL-terminated (or `secret_file` NULL).
#[no_mangle]
pub unsafe extern "C" fn rmemfs_open_volume(
    servers: *const c_char,
    name: *const c_char,
    secret_file: *const c_char,
    mode: c_int,
    create: c_int,
) -> *mut Volume {
    let open = || -> Result<Volume, Error> {
        // SAFETY: the caller's strings, as documented.
        let (servers, name) = unsafe { (text(servers)?, text(name)?) };
        let secret_file = match secret_file.is_null() {
            true => None,
            // SAFETY: as above.
            false => Some(PathBuf::from(unsafe { text(secret_file)? })),
        };
        let mode = match mode {
            0 => Mode::Follow,
            1 => Mode::Hold,
            _ => return Err(invalid("mode: 0 (follow) or 1 (hold)")),
        };
        open_volume(&VolumeOptions {
            servers: servers.split(',').map(|s| s.trim().to_string()).collect(),
            name: name.to_string(),
            secret_file,
            mode,
            create: create != 0,
        })
    };
    match open() {
        Ok(v) => Box::into_raw(Box::new(v)),
        Err(e) => {
            remember(&e);
            // SAFETY: errno is this thread's.
            unsafe { *libc::__errno_location() = e.errno };
            std::ptr::null_mut()
        }
    }
}

/// Closes volume `v` (every handle still open with it): a holder's changes are committed.
///
/// # Safety
/// `v` is NULL or a volume from `rmemfs_open_volume`, not used again after.
#[no_mangle]
pub unsafe extern "C" fn rmemfs_close_volume(v: *mut Volume) {
    if !v.is_null() {
        // SAFETY: made by Box::into_raw in rmemfs_open_volume, closed once.
        drop(unsafe { Box::from_raw(v) });
    }
}

/// What `rmemfs_stat` fills.
#[repr(C)]
pub struct RmemfsStat {
    pub ino: u64,
    /// File type and permission bits, as st_mode.
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// Nanoseconds since the epoch.
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

fn ns(t: std::time::SystemTime) -> i64 {
    match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}

/// Fills `out` with what `path` names.
///
/// # Safety
/// `v` live, `path` a string, `out` writable.
#[no_mangle]
pub unsafe extern "C" fn rmemfs_stat(
    v: *const Volume,
    path: *const c_char,
    out: *mut RmemfsStat,
) -> i64 {
    // SAFETY: the caller's volume and string.
    unsafe {
        with(v, |v| {
            let a = v.stat(text(path)?)?;
            let kind = a.kind.mode_bits();
            let st = RmemfsStat {
                ino: a.ino,
                mode: kind | a.perm as u32,
                nlink: a.nlink,
                uid: a.uid,
                gid: a.gid,
                size: a.size,
                mtime_ns: ns(a.mtime),
                ctime_ns: ns(a.ctime),
            };
            // SAFETY: the caller's writable struct (NULL refused).
            *out.as_mut().ok_or_else(|| invalid("a NULL stat"))? = st;
            Ok(0)
        })
    }
}

/// The names in directory `path`, each followed by a NUL, into `buf` (`len` bytes): the
/// bytes the whole listing takes (more than `len`: call again with a larger buffer; nothing
/// past `len` is written).
///
/// # Safety
/// `v` live, `path` a string, `buf` writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn rmemfs_listdir(
    v: *const Volume,
    path: *const c_char,
    buf: *mut u8,
    len: usize,
) -> i64 {
    // SAFETY: the caller's volume and string.
    unsafe {
        with(v, |v| {
            let mut all = Vec::new();
            for e in v.listdir(text(path)?)? {
                all.extend_from_slice(&e.name);
                all.push(0);
            }
            if all.len() <= len && !buf.is_null() {
                // SAFETY: `buf` holds `len` bytes, at least these.
                std::ptr::copy_nonoverlapping(all.as_ptr(), buf, all.len());
            }
            Ok(all.len() as i64)
        })
    }
}

/// open(2) on the volume: a handle (>= 0).
///
/// # Safety
/// `v` live, `path` a string.
#[no_mangle]
pub unsafe extern "C" fn rmemfs_open(
    v: *const Volume,
    path: *const c_char,
    flags: c_int,
    mode: u32,
) -> i64 {
    // SAFETY: the caller's volume and string.
    unsafe { with(v, |v| Ok(v.open(text(path)?, flags, mode)? as i64)) }
}

/// Closes handle `fh`.
///
/// # Safety
/// `v` live.
#[no_mangle]
pub unsafe extern "C" fn rmemfs_close(v: *const Volume, fh: u64) -> i64 {
    // SAFETY: the caller's volume.
    unsafe { with(v, |v| v.close(fh).map(|()| 0)) }
}

/// The bytes at `buf` (`len` of them), whatever the caller passed.
///
/// # Safety
/// `buf` is valid for `len` bytes (or `len` is 0).
unsafe fn bytes_mut<'a>(buf: *mut u8, len: usize) -> Result<&'a mut [u8], Error> {
    match (buf.is_null(), len) {
        (_, 0) => Ok(&mut []),
        (true, _) => Err(invalid("a NULL buffer")),
        // SAFETY: the caller's buffer of `len` bytes.
        (false, _) => Ok(unsafe { std::slice::from_raw_parts_mut(buf, len) }),
    }
}

/// pread(2): the bytes read.
///
/// # Safety
/// `v` live, `buf` writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn rmemfs_pread(
    v: *const Volume,
    fh: u64,
    buf: *mut u8,
    len: usize,
    offset: u64,
) -> i64 {
    // SAFETY: the caller's volume and buffer.
    unsafe { with(v, |v| Ok(v.pread(fh, offset, bytes_mut(buf, len)?)? as i64)) }
}

/// read(2) at the handle's position: the bytes read.
///
/// # Safety
/// `v` live, `buf` writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn rmemfs_read(v: *const Volume, fh: u64, buf: *mut u8, len: usize) -> i64 {
    // SAFETY: the caller's volume and buffer.
    unsafe { with(v, |v| Ok(v.read(fh, bytes_mut(buf, len)?)? as i64)) }
}

/// pwrite(2): the bytes written.
///
/// # Safety
/// `v` live, `buf` readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn rmemfs_pwrite(
    v: *const Volume,
    fh: u64,
    buf: *const u8,
    len: usize,
    offset: u64,
) -> i64 {
    // SAFETY: the caller's volume and buffer (only read).
    unsafe {
        with(v, |v| {
            Ok(v.pwrite(fh, offset, bytes_mut(buf as *mut u8, len)?)? as i64)
        })
    }
}

/// write(2) at the handle's position (the end with O_APPEND): the bytes written.
///
/// # Safety
/// `v` live, `buf` readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn rmemfs_write(
    v: *const Volume,
    fh: u64,
    buf: *const u8,
    len: usize,
) -> i64 {
    // SAFETY: the caller's volume and buffer (only read).
    unsafe {
        with(v, |v| {
            Ok(v.write(fh, bytes_mut(buf as *mut u8, len)?)? as i64)
        })
    }
}

/// fsync(2).
///
/// # Safety
/// `v` live.
#[no_mangle]
pub unsafe extern "C" fn rmemfs_fsync(v: *const Volume, fh: u64) -> i64 {
    // SAFETY: the caller's volume.
    unsafe { with(v, |v| v.fsync(fh).map(|()| 0)) }
}

/// mkdir(2).
///
/// # Safety
/// `v` live, `path` a string.
#[no_mangle]
pub unsafe extern "C" fn rmemfs_mkdir(v: *const Volume, path: *const c_char, mode: u32) -> i64 {
    // SAFETY: the caller's volume and string.
    unsafe { with(v, |v| v.mkdir(text(path)?, mode).map(|_| 0)) }
}

/// unlink(2).
///
/// # Safety
/// `v` live, `path` a string.
#[no_mangle]
pub unsafe extern "C" fn rmemfs_unlink(v: *const Volume, path: *const c_char) -> i64 {
    // SAFETY: the caller's volume and string.
    unsafe { with(v, |v| v.unlink(text(path)?).map(|()| 0)) }
}

/// rmdir(2).
///
/// # Safety
/// `v` live, `path` a string.
#[no_mangle]
pub unsafe extern "C" fn rmemfs_rmdir(v: *const Volume, path: *const c_char) -> i64 {
    // SAFETY: the caller's volume and string.
    unsafe { with(v, |v| v.rmdir(text(path)?).map(|()| 0)) }
}

/// rename(2).
///
/// # Safety
/// `v` live, `from` and `to` strings.
#[no_mangle]
pub unsafe extern "C" fn rmemfs_rename(
    v: *const Volume,
    from: *const c_char,
    to: *const c_char,
) -> i64 {
    // SAFETY: the caller's volume and strings.
    unsafe { with(v, |v| v.rename(text(from)?, text(to)?).map(|()| 0)) }
}

/// One read of `rmemfs_read_many`; `got` is filled with the bytes read.
#[repr(C)]
pub struct RmemfsRead {
    pub fh: u64,
    pub offset: u64,
    pub buf: *mut u8,
    pub len: u64,
    pub got: i64,
}

/// Serves `n` reads at once (their one-sided reads in flight together): 0, with each
/// `got` set, or a negative errno for the batch.
///
/// # Safety
/// `v` live; `reqs` holds `n` reads, each `buf` writable for its `len` bytes and no two
/// overlapping.
#[no_mangle]
pub unsafe extern "C" fn rmemfs_read_many(
    v: *const Volume,
    reqs: *mut RmemfsRead,
    n: usize,
) -> i64 {
    // SAFETY: the caller's volume and array.
    unsafe {
        with(v, |v| {
            if n == 0 {
                return Ok(0);
            }
            if reqs.is_null() {
                return Err(invalid("a NULL array of reads"));
            }
            // SAFETY: `n` reads at `reqs`.
            let reqs = std::slice::from_raw_parts_mut(reqs, n);
            let mut batch = Vec::with_capacity(n);
            for r in reqs.iter() {
                batch.push(ReadRequest {
                    fh: r.fh,
                    offset: r.offset,
                    buf: bytes_mut(r.buf, r.len as usize)?,
                });
            }
            let got = v.read_many(&mut batch)?;
            for (r, g) in reqs.iter_mut().zip(got) {
                r.got = g as i64;
            }
            Ok(0)
        })
    }
}
