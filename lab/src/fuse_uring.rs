//! The null file system of [`crate::fuse_floor`] served through FUSE over io_uring (Linux
//! 6.14+, `fuse.enable_uring=1`): how much of the FUSE round trip the ring saves here, the
//! measurement behind any decision to move rmemfs's own mount onto it.
//!
//! The kernel hands each request to a ring entry of the queue of the CPU the caller runs on
//! (one queue per possible CPU); the daemon answers in place and, in the same submission,
//! asks for the next request (`COMMIT_AND_FETCH`): no read and write system calls per
//! request. Once INIT chose the ring, every request waits for it: it answers the lookup and
//! getattr of the null file system's one file (attributes the kernel then caches) and the
//! measured `getxattr`s; anything else is answered ENOSYS.
//! Structures as in the kernel's `include/uapi/linux/fuse.h` (protocol 7.42).

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;
const FUSE_LOOKUP: u32 = 1;
const FUSE_GETATTR: u32 = 3;
const FUSE_GETXATTR: u32 = 22;
/// How long the kernel may cache the one entry and its attributes (s).
const TTL_SECS: u64 = 3600;
/// REGISTER before the kernel finished INIT is refused with EAGAIN: tries, 1 ms apart.
const REGISTER_TRIES: usize = 2000;
/// `struct fuse_uring_req_header`: the in/out header (128), the op header (128), then
/// `struct fuse_uring_ent_in_out` (flags, commit_id, payload_sz, padding, reserved).
const HEADER_BYTES: usize = 128 + 128 + 32;
const COMMIT_ID_AT: usize = 256 + 8;
const PAYLOAD_SZ_AT: usize = 256 + 16;
/// At least the kernel's largest request payload for this mount (its `max_pages` pages).
const PAYLOAD_BYTES: usize = 1 << 20;
/// Entries per queue: one in service, one waiting.
const ENTRIES_PER_QUEUE: usize = 2;
/// How often a queue thread looks at the stop flag while no request comes.
const POLL: Duration = Duration::from_millis(50);

/// The kernel's switch for FUSE over io_uring.
pub const ENABLE_PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// One ring entry's buffers: they stay put (boxed) while the kernel may write them.
struct Entry {
    header: Box<[u64; HEADER_BYTES / 8]>,
    /// Request arguments after the op header (names), then the reply.
    payload: Box<[u8]>,
    iov: Box<[libc::iovec; 2]>,
}

/// A queue's ring and entries; the ring is declared first so it is dropped (and the kernel's
/// use of the entries cancelled) before the buffers go.
struct Queue {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    entries: Vec<Entry>,
}

impl Entry {
    fn new() -> Entry {
        let mut header = Box::new([0u64; HEADER_BYTES / 8]);
        let mut payload = vec![0u8; PAYLOAD_BYTES].into_boxed_slice();
        let iov = Box::new([
            libc::iovec {
                iov_base: header.as_mut_ptr().cast(),
                iov_len: HEADER_BYTES,
            },
            libc::iovec {
                iov_base: payload.as_mut_ptr().cast(),
                iov_len: PAYLOAD_BYTES,
            },
        ]);
        Entry {
            header,
            payload,
            iov,
        }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: the header array is HEADER_BYTES of plain integers; viewing it as bytes is
        // sound, and no ring operation on this entry is in flight while we hold it (the
        // kernel wrote it before posting the completion we are handling).
        unsafe { std::slice::from_raw_parts_mut(self.header.as_mut_ptr().cast(), HEADER_BYTES) }
    }

    /// The SQE that registers this entry (commit 0) or answers and fetches again.
    fn sqe(
        &self,
        fd: RawFd,
        qid: u16,
        cmd_op: u32,
        commit_id: u64,
        user_data: u64,
    ) -> squeue::Entry128 {
        // struct fuse_uring_cmd_req: flags, commit_id, qid, padding.
        let mut cmd = [0u8; 80];
        cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
        let sqe = opcode::UringCmd80::new(types::Fd(fd), cmd_op)
            .cmd(cmd)
            .addr(Some(self.iov.as_ptr() as u64))
            .build()
            .user_data(user_data);
        with_len(sqe, 2)
    }
}

/// Sets the SQE's `len` (the iovec count the kernel requires), which the crate's builder
/// for this opcode leaves at zero.
fn with_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    const LEN_AT: usize = 24; // struct io_uring_sqe: opcode, flags, ioprio, fd, off, addr, len
                              // SAFETY: Entry128 is repr(C), 128 bytes whose first 64 are a struct io_uring_sqe with
                              // `len` (u32) at byte 24; every bit pattern of the array is a valid Entry128.
    unsafe {
        let mut raw: [u8; 128] = std::mem::transmute(sqe);
        raw[LEN_AT..LEN_AT + 4].copy_from_slice(&len.to_ne_bytes());
        std::mem::transmute(raw)
    }
}

/// The queue threads of one mount; requests they answered, and their stop flag.
pub struct Rings {
    threads: Vec<std::thread::JoinHandle<Result<(), String>>>,
    stop: Arc<AtomicBool>,
    pub served: Arc<AtomicU64>,
}

impl Rings {
    /// Registers `ENTRIES_PER_QUEUE` entries on each of the kernel's queues (one per
    /// possible CPU) of the connection behind `fd`; returns once every queue's entries are
    /// submitted (the kernel switches to the ring when all queues have entries).
    pub fn start(fd: RawFd, queues: usize) -> Result<Rings, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicU64::new(0));
        let mut threads = Vec::new();
        for qid in 0..queues {
            let (tx, rx) = std::sync::mpsc::channel();
            let (stop, served) = (stop.clone(), served.clone());
            let t = std::thread::Builder::new()
                .name(format!("uring-q{qid}"))
                .spawn(move || serve_queue(fd, qid as u16, &stop, &served, tx))
                .map_err(|e| e.to_string())?;
            threads.push(t);
            rx.recv()
                .map_err(|_| format!("queue {qid} ended before registering"))??;
        }
        Ok(Rings {
            threads,
            stop,
            served,
        })
    }

    /// Stops the queue threads (after the unmount ended the connection) and reports the
    /// first error one of them met.
    pub fn stop(self) -> Result<(), String> {
        self.stop.store(true, Ordering::SeqCst);
        let mut first = Ok(());
        for t in self.threads {
            let r = t
                .join()
                .unwrap_or_else(|_| Err("a queue thread panicked".into()));
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

fn serve_queue(
    fd: RawFd,
    qid: u16,
    stop: &AtomicBool,
    served: &AtomicU64,
    registered: std::sync::mpsc::Sender<Result<(), String>>,
) -> Result<(), String> {
    // The kernel picks the queue by the caller's CPU: its thread runs there too.
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET stays within it for qid < CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(qid as usize, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
    let setup = || -> Result<Queue, String> {
        let mut ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .build(8)
            .map_err(|e| format!("io_uring with 128-byte entries: {e}"))?;
        let entries: Vec<Entry> = (0..ENTRIES_PER_QUEUE).map(|_| Entry::new()).collect();
        for (i, e) in entries.iter().enumerate() {
            let sqe = e.sqe(fd, qid, FUSE_IO_URING_CMD_REGISTER, 0, i as u64);
            // SAFETY: the entry's buffers and iovecs live in `entries`, which outlives the
            // ring's use of them (the ring is dropped first, in this function).
            unsafe { ring.submission().push(&sqe) }.map_err(|_| "submission queue full")?;
        }
        ring.submit()
            .map_err(|e| format!("registering queue {qid}: {e}"))?;
        Ok(Queue { ring, entries })
    };
    let mut queue = match setup() {
        Ok(x) => {
            let _ = registered.send(Ok(()));
            x
        }
        Err(e) => {
            let _ = registered.send(Err(e.clone()));
            return Err(e);
        }
    };
    let Queue { ring, entries } = &mut queue;
    let mut registering = vec![0usize; entries.len()];
    let poll = types::Timespec::from(POLL);
    while !stop.load(Ordering::SeqCst) {
        let args = types::SubmitArgs::new().timespec(&poll);
        match ring.submitter().submit_with_args(1, &args) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY)
                ) => {}
            Err(e) => return Err(format!("io_uring_enter: {e}")),
        }
        let done: Vec<(usize, i32)> = ring
            .completion()
            .map(|c| (c.user_data() as usize, c.result()))
            .collect();
        for (i, res) in done {
            if res == -libc::EAGAIN && registering[i] < REGISTER_TRIES {
                // INIT not finished yet: register again shortly.
                registering[i] += 1;
                std::thread::sleep(Duration::from_millis(1));
                let sqe = entries[i].sqe(fd, qid, FUSE_IO_URING_CMD_REGISTER, 0, i as u64);
                // SAFETY: as at registration.
                unsafe { ring.submission().push(&sqe) }.map_err(|_| "submission queue full")?;
                continue;
            }
            if res < 0 {
                // The connection ended (unmount): the kernel gives the entries back.
                if matches!(-res, libc::ENOTCONN | libc::ENODEV | libc::ECANCELED) {
                    return Ok(());
                }
                return Err(format!(
                    "queue {qid}: the kernel refused a ring entry: {}",
                    std::io::Error::from_raw_os_error(-res)
                ));
            }
            let e = &mut entries[i];
            let h = e.bytes();
            let opcode = u32::from_ne_bytes(h[4..8].try_into().expect("4 bytes"));
            let unique = u64::from_ne_bytes(h[8..16].try_into().expect("8 bytes"));
            let nodeid = u64::from_ne_bytes(h[16..24].try_into().expect("8 bytes"));
            let commit_id = u64::from_ne_bytes(
                h[COMMIT_ID_AT..COMMIT_ID_AT + 8]
                    .try_into()
                    .expect("8 bytes"),
            );
            let (error, reply) = answer(opcode, nodeid, &e.payload);
            e.payload[..reply.len()].copy_from_slice(&reply);
            let h = e.bytes();
            // struct fuse_out_header: len, error, unique; the reply itself in the payload.
            h[0..4].copy_from_slice(&(16 + reply.len() as u32).to_ne_bytes());
            h[4..8].copy_from_slice(&error.to_ne_bytes());
            h[8..16].copy_from_slice(&unique.to_ne_bytes());
            h[PAYLOAD_SZ_AT..PAYLOAD_SZ_AT + 4]
                .copy_from_slice(&(reply.len() as u32).to_ne_bytes());
            let sqe = e.sqe(
                fd,
                qid,
                FUSE_IO_URING_CMD_COMMIT_AND_FETCH,
                commit_id,
                i as u64,
            );
            // SAFETY: as at registration; the entry goes back to the kernel with this.
            unsafe { ring.submission().push(&sqe) }.map_err(|_| "submission queue full")?;
            served.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// The null file system's answer to one request: (error, reply bytes).
fn answer(opcode: u32, nodeid: u64, payload: &[u8]) -> (i32, Vec<u8>) {
    const ROOT: u64 = 1;
    const FILE: u64 = 2;
    match opcode {
        // The name follows the (empty) op header, NUL-terminated.
        FUSE_LOOKUP if nodeid == ROOT && payload.starts_with(b"f\0") => {
            // struct fuse_entry_out: nodeid, generation, entry_valid, attr_valid, their
            // nanoseconds, then the attributes.
            let mut r = Vec::with_capacity(128);
            for v in [FILE, 0, TTL_SECS, TTL_SECS] {
                r.extend_from_slice(&v.to_ne_bytes());
            }
            r.extend_from_slice(&[0u8; 8]);
            r.extend_from_slice(&attr(FILE));
            (0, r)
        }
        FUSE_LOOKUP => (-libc::ENOENT, Vec::new()),
        FUSE_GETATTR if nodeid == ROOT || nodeid == FILE => {
            // struct fuse_attr_out: attr_valid, its nanoseconds, a dummy, the attributes.
            let mut r = Vec::with_capacity(104);
            r.extend_from_slice(&TTL_SECS.to_ne_bytes());
            r.extend_from_slice(&[0u8; 8]);
            r.extend_from_slice(&attr(nodeid));
            (0, r)
        }
        FUSE_GETXATTR => (-libc::ENODATA, Vec::new()),
        _ => (-libc::ENOSYS, Vec::new()),
    }
}

/// struct fuse_attr (88 bytes) of the root (a directory) or the file.
fn attr(ino: u64) -> Vec<u8> {
    let mode = if ino == 1 {
        libc::S_IFDIR | 0o755
    } else {
        libc::S_IFREG | 0o644
    };
    let nlink: u32 = if ino == 1 { 2 } else { 1 };
    let mut a = Vec::with_capacity(88);
    // ino, size, blocks, atime, mtime, ctime
    for v in [ino, 0, 0, 0, 0, 0] {
        a.extend_from_slice(&v.to_ne_bytes());
    }
    // atimensec, mtimensec, ctimensec, mode, nlink, uid, gid, rdev, blksize, flags
    for v in [0, 0, 0, mode, nlink, 0, 0, 0, 4096, 0] {
        a.extend_from_slice(&v.to_ne_bytes());
    }
    a
}
