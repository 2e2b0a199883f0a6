//! The TCP fabric's wire format, and socket I/O straight from and into registered memory.
//!
//! A data connection opens with [`DATA_MAGIC`]. Each request is a 32-byte header
//! ([`Request`]), followed for a WRITE by its payload; each response is a 24-byte header
//! ([`Response`]), followed for a successful READ by its payload. The server answers in order,
//! echoing each request's sequence number.

use crate::fabric::{Opcode, WcStatus, MAX_OP_LEN};
use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

/// First bytes of a data connection, so a control client or a stray peer is told apart.
pub const DATA_MAGIC: [u8; 8] = *b"RMFSDAT1";
pub const REQ_HEADER: usize = 40;
pub const RESP_HEADER: usize = 24;
const OP_READ: u8 = 1;
const OP_WRITE: u8 = 2;

/// How often a blocked socket call wakes up to check for timeouts and shutdown.
pub const TICK: Duration = Duration::from_millis(200);

/// A request header: `op u8, 7 bytes 0, rkey u64, remote addr u64, len u64, seq u64` (LE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub opcode: Opcode,
    pub rkey: u64,
    pub addr: u64,
    pub len: u64,
    pub seq: u64,
}

impl Request {
    pub fn encode(&self) -> [u8; REQ_HEADER] {
        let mut h = [0u8; REQ_HEADER];
        h[0] = match self.opcode {
            Opcode::Read => OP_READ,
            Opcode::Write => OP_WRITE,
        };
        h[8..16].copy_from_slice(&self.rkey.to_le_bytes());
        h[16..24].copy_from_slice(&self.addr.to_le_bytes());
        h[24..32].copy_from_slice(&self.len.to_le_bytes());
        h[32..40].copy_from_slice(&self.seq.to_le_bytes());
        h
    }

    /// Parses a header; an unknown opcode, nonzero padding or a length no single operation
    /// may have is not something a well-behaved queue pair sends.
    pub fn decode(h: &[u8; REQ_HEADER]) -> Result<Request, String> {
        let opcode = match h[0] {
            OP_READ => Opcode::Read,
            OP_WRITE => Opcode::Write,
            other => return Err(format!("unknown opcode {other}")),
        };
        let len = u64_at(h, 24);
        if h[1..8] != [0; 7] || len > MAX_OP_LEN {
            return Err(format!("malformed request ({opcode:?}, len {len})"));
        }
        Ok(Request {
            opcode,
            rkey: u64_at(h, 8),
            addr: u64_at(h, 16),
            len,
            seq: u64_at(h, 32),
        })
    }
}

/// A response header: `status u8, 7 bytes padding, seq u64, len u64` (LE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    pub status: WcStatus,
    pub seq: u64,
    pub len: u64,
}

impl Response {
    pub fn encode(&self) -> [u8; RESP_HEADER] {
        let mut h = [0u8; RESP_HEADER];
        h[0] = match self.status {
            WcStatus::Success => 0,
            _ => 1,
        };
        h[8..16].copy_from_slice(&self.seq.to_le_bytes());
        h[16..24].copy_from_slice(&self.len.to_le_bytes());
        h
    }

    pub fn decode(h: &[u8; RESP_HEADER]) -> Result<Response, String> {
        if h[1..8] != [0; 7] {
            return Err("nonzero padding in a response header".into());
        }
        let status = match h[0] {
            0 => WcStatus::Success,
            1 => WcStatus::RemoteAccessError,
            other => return Err(format!("bad status byte {other}")),
        };
        Ok(Response {
            status,
            seq: u64_at(h, 8),
            len: u64_at(h, 16),
        })
    }
}

fn u64_at(h: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(h[at..at + 8].try_into().expect("8 bytes"))
}

/// A raw byte range for scatter/gather socket I/O.
#[derive(Clone, Copy)]
pub struct RawSlice {
    pub ptr: *const u8,
    pub len: usize,
}

/// Sends all of `parts` with `sendmsg` (one syscall for header plus payload where the socket
/// takes it), straight from the raw pointers. `EAGAIN` (send timeout) calls `keep_waiting`;
/// with the bytes sent so far; when that says no the send fails with `TimedOut`.
///
/// # Safety
/// Every part must be readable for its length for the duration of the call.
pub unsafe fn send_all_raw(
    fd: RawFd,
    parts: &[RawSlice],
    keep_waiting: &mut dyn FnMut(usize) -> bool,
) -> io::Result<()> {
    let mut sent = 0;
    let mut iov: [libc::iovec; 2] = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 2];
    assert!(parts.len() <= iov.len());
    let mut idx = 0;
    let mut off = 0;
    while idx < parts.len() {
        if parts[idx].len == off {
            idx += 1;
            off = 0;
            continue;
        }
        let mut n_iov = 0;
        for (k, p) in parts[idx..].iter().enumerate() {
            if p.len == 0 {
                // Never hand the kernel an empty part: its pointer may be anything (a refused
                // READ's remote address), and some kernels reject such an iovec with EFAULT.
                continue;
            }
            let skip = if k == 0 { off } else { 0 };
            iov[n_iov] = libc::iovec {
                // SAFETY: `skip` is within the part (it is bytes of it already sent).
                iov_base: unsafe { p.ptr.add(skip) } as *mut libc::c_void,
                iov_len: p.len - skip,
            };
            n_iov += 1;
        }
        // SAFETY: an all-zero msghdr is a valid "no name, no control" header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = n_iov;
        // SAFETY: the iovecs point into the caller's parts, readable per this fn's contract.
        let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    if keep_waiting(sent) {
                        continue;
                    }
                    return Err(io::ErrorKind::TimedOut.into());
                }
                _ => return Err(err),
            }
        }
        let mut n = n as usize;
        sent += n;
        while n > 0 && idx < parts.len() {
            let left = parts[idx].len - off;
            if n >= left {
                n -= left;
                idx += 1;
                off = 0;
            } else {
                off += n;
                n = 0;
            }
        }
    }
    Ok(())
}

/// Receives exactly `len` bytes into `ptr` with `recv`, straight into the destination.
/// EOF is `UnexpectedEof`; receive timeouts consult `keep_waiting` as in [`send_all_raw`].
///
/// # Safety
/// `ptr` must be writable for `len` bytes for the duration of the call.
pub unsafe fn recv_exact_raw(
    fd: RawFd,
    ptr: *mut u8,
    len: usize,
    keep_waiting: &mut dyn FnMut(usize) -> bool,
) -> io::Result<()> {
    let mut got = 0;
    while got < len {
        // SAFETY: `ptr..ptr+len` is writable per this fn's contract and `got < len`.
        let n = unsafe {
            libc::recv(
                fd,
                ptr.add(got) as *mut libc::c_void,
                len - got,
                libc::MSG_WAITALL,
            )
        };
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if n < 0 {
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    if keep_waiting(got) {
                        continue;
                    }
                    return Err(io::ErrorKind::TimedOut.into());
                }
                _ => return Err(err),
            }
        }
        got += n as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_junk_is_refused() {
        let r = Request {
            opcode: Opcode::Write,
            rkey: 0xdead_beef,
            addr: 1 << 40,
            len: 4096,
            seq: 7,
        };
        assert_eq!(Request::decode(&r.encode()), Ok(r));
        let mut bad = r.encode();
        bad[0] = 9;
        assert!(Request::decode(&bad).is_err());
        let mut bad = r.encode();
        bad[2] = 1;
        assert!(Request::decode(&bad).is_err());
        let huge = Request {
            len: MAX_OP_LEN + 1,
            ..r
        };
        assert!(Request::decode(&huge.encode()).is_err());
        let resp = Response {
            status: WcStatus::RemoteAccessError,
            seq: 9,
            len: 0,
        };
        assert_eq!(Response::decode(&resp.encode()), Ok(resp));
        let mut bad = resp.encode();
        bad[0] = 5;
        assert!(Response::decode(&bad).is_err());
    }
}
