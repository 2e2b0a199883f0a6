//! rmemfs patch: FUSE over io_uring (Linux 6.14+, the fuse module's `enable_uring` on).
//!
//! When the file system asks for `FUSE_OVER_IO_URING` at INIT and the kernel grants it, every
//! request after INIT goes to a ring entry of the queue of the CPU its caller runs on (one
//! queue per possible CPU), and only once every queue has entries. Each ring thread here owns
//! one io_uring and one entry of one queue, and is pinned to that queue's CPU. A request
//! arrives as a completion; the thread rebuilds it in /dev/fuse's layout (in-header, op
//! header, payload, contiguous, the payload where the kernel put it), dispatches it like a
//! /dev/fuse request, writes the reply into the entry and, in one submission, commits it and
//! asks for the next (`COMMIT_AND_FETCH`): no read or write system call per request, and the
//! kernel wakes the thread on its caller's CPU. Forgets and interrupts still come through
//! /dev/fuse, whose threads keep running.
//!
//! An entry holds its request until the reply is committed, and a queue has only the entries
//! registered for it: a handler that answers later, from another thread (a blocked `flock`
//! or `F_SETLKW` waits for the lock), keeps its entry. So that such waits never take every
//! entry of a queue (the holder of the lock, closing on that CPU, would then wait for an
//! entry forever: a deadlock), a thread whose request is answered later first adds a ring
//! thread to its queue whenever fewer than the queue's first count of entries would be free,
//! up to [`MOST_ENTRIES_PER_QUEUE`]. The kernel hands a request that came while every entry
//! of its queue was taken to the queue's next commit, not to an entry registered later: an
//! added entry would wait idle beside it (a lookup queued so held its directory's lock, which
//! the invalidation a granted lock waited for needed: a deadlock, seen). So once an added
//! entry is registered, a thread on its CPU makes a request of its own (a `statfs` of the
//! mount): it takes a free entry, and that entry's commit hands out what was queued.
//!
//! An entry's buffers belong to its [`RingReply`] (shared with the reply objects handed to
//! the file system), so they outlive any reply; and they are leaked, never freed, if the
//! thread ends while the kernel may still write into them. A queue the kernel would wait on
//! forever (its entries refused again and again) ends the connection, instead of leaving every
//! request made on that CPU hanging: through `Filesystem::ring_failed`, or else by aborting the
//! process.
//!
//! Structures as in the kernel's `include/uapi/linux/fuse.h` (protocol 7.42).

use parking_lot::{Condvar, Mutex};
use std::io;
use std::io::IoSlice;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Duration;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::error;
use log::warn;

use crate::Errno;
use crate::Filesystem;
use crate::channel::ChannelSender;
use crate::ll::RequestId;
use crate::ll::reply::{Response, ResponseErrno};
use crate::reply::ReplySender;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;
/// `struct fuse_in_header` and `struct fuse_out_header`.
const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;
/// `struct fuse_uring_req_header`: the in/out header area (128), the op header area (128),
/// then `struct fuse_uring_ent_in_out` (flags, commit_id, payload_sz, padding, reserved).
const OP_IN_AT: usize = 128;
const OP_IN_MAX: usize = 128;
const COMMIT_ID_AT: usize = 256 + 8;
const PAYLOAD_SZ_AT: usize = 256 + 16;
const HEADER_BYTES: usize = 256 + 32;
/// Room before the payload where the in-header and op header are copied, so the request
/// lies contiguous in front of the payload.
const SCRATCH: usize = IN_HEADER + OP_IN_MAX;
/// How often an idle ring thread looks whether the session ended.
const POLL: Duration = Duration::from_millis(50);
/// An entry refused this many times in a row (1 ms apart) is given up on. REGISTER is
/// refused with EAGAIN until the kernel has processed INIT's reply, which takes far less.
const REGISTER_TRIES: u32 = 5000;
/// After the session ended, how many POLL periods a thread waits for the kernel to give its
/// entry back before leaking the buffers.
const LAST_WAITS: u32 = 20;
/// The most entries (ring threads) one queue is given while answers are deferred: each holds
/// a payload buffer (max_write, 1 MiB), so 32 bounds that at 32 MiB per CPU, past which
/// requests of that CPU wait for a deferred answer (as they would for any full queue).
const MOST_ENTRIES_PER_QUEUE: usize = 32;
/// How long a handler's answer from another thread may take before it counts as deferred
/// (and its queue may be given an entry, see [`Rings::deferring`]): a lock granted by the
/// shared volume's notifier is answered within well under this once the kernel was told, and
/// counted at once it added entries that were not needed (up to the 32 above).
const DEFERRED_AFTER: Duration = Duration::from_millis(1);
/// Completion results that mean the connection is gone (the entry is the kernel's no more).
const TEARDOWN: [i32; 4] = [
    libc::ENOTCONN,
    libc::ENODEV,
    libc::ECANCELED,
    libc::ECONNABORTED,
];

/// Whether this process may use io_uring with 128-byte entries (seccomp, the
/// `kernel.io_uring_disabled` sysctl and memlock limits may say no): asked before INIT is
/// answered, since after INIT granted the ring the kernel waits for it.
pub(crate) fn usable() -> io::Result<()> {
    IoUring::<squeue::Entry128, cqueue::Entry>::builder()
        .build(4)
        .map(drop)
}

/// The kernel's queue count: one per possible CPU (`/sys/devices/system/cpu/possible`, as
/// `0-3` or `0,2-5`), else the configured processor count.
pub(crate) fn queues() -> usize {
    let count = |list: &str| -> Option<usize> {
        list.trim().split(',').try_fold(0, |n, part| {
            Some(n + match part.split_once('-') {
                Some((a, b)) => b.parse::<usize>().ok()?.checked_sub(a.parse().ok()?)? + 1,
                None => {
                    part.parse::<usize>().ok()?;
                    1
                }
            })
        })
    };
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|l| count(&l))
        .filter(|&n| n > 0)
        // SAFETY: sysconf has no preconditions.
        .unwrap_or_else(|| unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as usize)
}

/// One entry's buffers, and where the reply to its request in service goes. A reply to a
/// request with a payload is staged (the handler may still hold the request's bytes, which
/// lie where the reply goes) and copied in once the handler returned; any other is written
/// in place.
pub(crate) struct RingReply {
    /// The session's device, for backing files (passthrough).
    pub(crate) channel: ChannelSender,
    /// The kernel's `fuse_uring_req_header` (from `Box::into_raw`, freed in Drop).
    header: *mut [u64; HEADER_BYTES / 8],
    /// SCRATCH bytes, then the payload (from `Box::into_raw`, freed in Drop).
    buf: *mut [u8],
    payload_cap: usize,
    state: Mutex<Answer>,
    answered: Condvar,
}

// SAFETY: the buffers are owned by this value and freed only when the last reference goes;
// they are written only while the state says a reply is awaited (under the state's lock) or
// by the ring thread between a completion and the next commit, when no reply is awaited.
unsafe impl Send for RingReply {}
// SAFETY: as for Send; all mutation by repliers goes through the state mutex.
unsafe impl Sync for RingReply {}

impl Drop for RingReply {
    fn drop(&mut self) {
        // SAFETY: both came from Box::into_raw in `Entry::new` and are freed once, here;
        // whoever might still write them (the kernel) keeps this value alive by leaking it.
        unsafe {
            drop(Box::from_raw(self.header));
            drop(Box::from_raw(self.buf));
        }
    }
}

impl std::fmt::Debug for RingReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingReply").finish_non_exhaustive()
    }
}

#[derive(Debug)]
enum Answer {
    /// No request in service.
    Idle,
    /// A reply is awaited; written in place if `in_place`.
    Awaited { in_place: bool },
    /// The reply is in the entry: this many payload bytes.
    Written(usize),
    /// The reply, to copy in once the handler is done.
    Staged(Vec<u8>),
}

impl RingReply {
    fn header_ptr(&self) -> *mut u8 {
        self.header.cast()
    }

    fn payload_ptr(&self) -> *mut u8 {
        // SAFETY: SCRATCH is within the buffer of SCRATCH + payload_cap bytes.
        unsafe { self.buf.cast::<u8>().add(SCRATCH) }
    }

    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let total: usize = data.iter().map(|d| d.len()).sum();
        let stream = || data.iter().flat_map(|d| d.iter().copied());
        let mut st = self.state.lock();
        let Answer::Awaited { in_place } = *st else {
            return Err(io::Error::other("a ring reply with no request awaiting it"));
        };
        if total < OUT_HEADER || total - OUT_HEADER > self.payload_cap {
            // Answered EIO instead, so the entry still goes back to the kernel.
            let mut unique = [0u8; 8];
            for (b, v) in unique.iter_mut().zip(stream().skip(8)) {
                *b = v;
            }
            *st = Answer::Staged(eio_reply(u64::from_ne_bytes(unique)));
            self.answered.notify_all();
            return Err(io::Error::other(format!(
                "a reply of {total} bytes does not fit the ring entry; answered EIO"
            )));
        }
        if in_place {
            let mut at = 0;
            for d in data {
                for (i, chunk) in split_at_header(at, d) {
                    // SAFETY: `i` + chunk length stays within the out-header area or the
                    // payload (checked against payload_cap above); the kernel does not touch
                    // the entry until it is committed, and no reference to these bytes is
                    // held (the request had no payload).
                    unsafe {
                        let dst = if i < OUT_HEADER {
                            self.header_ptr().add(i)
                        } else {
                            self.payload_ptr().add(i - OUT_HEADER)
                        };
                        std::ptr::copy_nonoverlapping(chunk.as_ptr(), dst, chunk.len());
                    }
                }
                at += d.len();
            }
            *st = Answer::Written(total - OUT_HEADER);
        } else {
            let mut staged = Vec::with_capacity(total);
            for d in data {
                staged.extend_from_slice(d);
            }
            *st = Answer::Staged(staged);
        }
        self.answered.notify_all();
        Ok(())
    }

    /// Whether the reply is still awaited `grace` after the handler returned without
    /// answering (it answers later, from another thread): one sent a moment later (a granted
    /// lock answered once the kernel was told) does not hold the entry for long.
    fn awaited_after(&self, grace: Duration) -> bool {
        let mut st = self.state.lock();
        if matches!(*st, Answer::Awaited { .. }) {
            let _ = self.answered.wait_for(&mut st, grace);
        }
        matches!(*st, Answer::Awaited { .. })
    }

    fn await_reply(&self, in_place: bool) {
        *self.state.lock() = Answer::Awaited { in_place };
    }

    /// Waits for the reply (a handler may answer from another thread, later), puts a staged
    /// one in place; returns the payload bytes.
    fn take(&self) -> usize {
        let mut st = self.state.lock();
        while matches!(*st, Answer::Awaited { .. }) {
            self.answered.wait(&mut st);
        }
        match std::mem::replace(&mut *st, Answer::Idle) {
            Answer::Written(n) => n,
            Answer::Staged(v) => {
                // SAFETY: lengths checked in `send`; the handler has returned, so nothing
                // refers to the request's bytes any more.
                unsafe {
                    std::ptr::copy_nonoverlapping(v.as_ptr(), self.header_ptr(), OUT_HEADER);
                    std::ptr::copy_nonoverlapping(
                        v[OUT_HEADER..].as_ptr(),
                        self.payload_ptr(),
                        v.len() - OUT_HEADER,
                    );
                }
                v.len() - OUT_HEADER
            }
            Answer::Idle | Answer::Awaited { .. } => unreachable!("waited for above"),
        }
    }
}

/// The reply answering request `unique` with EIO, built as fuser builds every other.
fn eio_reply(unique: u64) -> Vec<u8> {
    ResponseErrno(Errno::EIO).with_iovec(RequestId(unique), |io| {
        io.iter().flat_map(|s| s.iter().copied()).collect()
    })
}

/// Splits `d`, which starts at byte `at` of a reply, at the end of the out-header: the
/// pieces with their reply offsets.
fn split_at_header(at: usize, d: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let cut = OUT_HEADER.saturating_sub(at).min(d.len());
    let (a, b) = d.split_at(cut);
    [(at, a), (at + cut, b)].into_iter().filter(|(_, p)| !p.is_empty())
}

/// One ring entry: its buffers (in its reply) and the iovecs that name them to the kernel.
struct Entry {
    reply: Arc<RingReply>,
    iov: Box<[libc::iovec; 2]>,
    /// Given to the kernel (REGISTER or COMMIT_AND_FETCH submitted) and not yet given back
    /// (no completion reaped since).
    in_kernel: bool,
}

impl Entry {
    fn new(payload: usize, channel: ChannelSender) -> Entry {
        let header = Box::into_raw(Box::new([0u64; HEADER_BYTES / 8]));
        let buf = Box::into_raw(vec![0u8; SCRATCH + payload].into_boxed_slice());
        let reply = Arc::new(RingReply {
            channel,
            header,
            buf,
            payload_cap: payload,
            state: Mutex::new(Answer::Idle),
            answered: Condvar::new(),
        });
        let iov = Box::new([
            libc::iovec {
                iov_base: reply.header_ptr().cast(),
                iov_len: HEADER_BYTES,
            },
            libc::iovec {
                iov_base: reply.payload_ptr().cast(),
                iov_len: payload,
            },
        ]);
        Entry {
            reply,
            iov,
            in_kernel: false,
        }
    }

    fn header_u64(&self, at: usize) -> u64 {
        let mut b = [0u8; 8];
        // SAFETY: `at + 8` is within the header area; the kernel wrote it before posting the
        // completion being handled, and does not write it again until the commit.
        unsafe {
            std::ptr::copy_nonoverlapping(self.reply.header_ptr().add(at), b.as_mut_ptr(), 8)
        };
        u64::from_ne_bytes(b)
    }

    fn header_u32(&self, at: usize) -> u32 {
        let mut b = [0u8; 4];
        // SAFETY: as in `header_u64`.
        unsafe {
            std::ptr::copy_nonoverlapping(self.reply.header_ptr().add(at), b.as_mut_ptr(), 4)
        };
        u32::from_ne_bytes(b)
    }

    fn set_header_u32(&self, at: usize, v: u32) {
        // SAFETY: as in `header_u64`; the entry is ours until committed.
        unsafe {
            std::ptr::copy_nonoverlapping(
                v.to_ne_bytes().as_ptr(),
                self.reply.header_ptr().add(at),
                4,
            )
        };
    }

    /// The request in /dev/fuse's layout: the in-header and `op_len` bytes of op header
    /// copied in front of the `payload_len` payload bytes the kernel wrote.
    fn request(&self, op_len: usize, payload_len: usize) -> &[u8] {
        let start = SCRATCH - IN_HEADER - op_len;
        let base = self.reply.buf.cast::<u8>();
        // SAFETY: both copies stay within the scratch room (op_len <= OP_IN_MAX) and read
        // the header area the kernel wrote; the slice covers scratch and payload bytes
        // (payload_len <= the payload's size, checked by the caller) that nothing writes
        // while it lives (replies to requests with a payload are staged), and the buffer
        // lives as long as `self.reply`.
        unsafe {
            let header = self.reply.header_ptr();
            std::ptr::copy_nonoverlapping(header, base.add(start), IN_HEADER);
            std::ptr::copy_nonoverlapping(
                header.add(OP_IN_AT),
                base.add(start + IN_HEADER),
                op_len,
            );
            std::slice::from_raw_parts(base.add(start), IN_HEADER + op_len + payload_len)
        }
    }

    /// REGISTER (commit 0) or COMMIT_AND_FETCH for this entry.
    fn sqe(&self, fd: i32, qid: u16, cmd_op: u32, commit_id: u64) -> squeue::Entry128 {
        // struct fuse_uring_cmd_req: flags, commit_id, qid, padding.
        let mut cmd = [0u8; 80];
        cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
        let sqe = opcode::UringCmd80::new(types::Fd(fd), cmd_op)
            .cmd(cmd)
            .addr(Some(self.iov.as_ptr() as u64))
            .build();
        with_iovec_count(sqe, 2)
    }
}

/// Sets the SQE's `len`, the iovec count the kernel requires, which the io-uring crate's
/// builder for this opcode leaves at zero.
fn with_iovec_count(sqe: squeue::Entry128, count: u32) -> squeue::Entry128 {
    // struct io_uring_sqe: opcode, flags, ioprio, fd, off, addr, then len (u32) at byte 24.
    const LEN_AT: usize = 24;
    // SAFETY: Entry128 is repr(C): 128 bytes, the first 64 a struct io_uring_sqe; any bit
    // pattern of them is a valid Entry128.
    unsafe {
        let mut raw: [u8; 128] = std::mem::transmute(sqe);
        raw[LEN_AT..LEN_AT + 4].copy_from_slice(&count.to_ne_bytes());
        std::mem::transmute::<[u8; 128], squeue::Entry128>(raw)
    }
}

/// Starts the ring threads: `per_queue` on each of the kernel's `queues` (more are added
/// while answers are deferred, see the module doc). Returns once each has submitted its
/// entry (the kernel uses the ring once every queue has one); [`Rings::stop_and_join`] ends
/// them (after the session ended).
pub(crate) fn start<FS: Filesystem>(
    template: SessionEventLoop<FS>,
    payload: usize,
    queues: usize,
    per_queue: usize,
    mountpoint: Option<std::path::PathBuf>,
) -> io::Result<Arc<Rings<FS>>> {
    let per_queue = per_queue.max(1);
    let rings = Arc::new(Rings {
        template,
        payload,
        per_queue,
        mountpoint,
        stop: AtomicBool::new(false),
        counts: (0..queues).map(|_| Mutex::new(QueueCount::default())).collect(),
        threads: Mutex::new(Vec::new()),
    });
    for qid in 0..queues {
        for k in 0..per_queue {
            let (tx, rx) = std::sync::mpsc::channel();
            let started = rings.spawn(qid, k, tx).and_then(|()| {
                rx.recv()
                    .unwrap_or_else(|_| Err(io::Error::other("a ring thread ended at start")))
            });
            if let Err(e) = started {
                let _ = rings.stop_and_join();
                return Err(e);
            }
            rings.counts[qid].lock().entries += 1;
        }
    }
    Ok(rings)
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET stays within it for cpu < CPU_SETSIZE,
    // and a failure (a CPU outside this process's set) leaves the thread where it was.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu < libc::CPU_SETSIZE as usize {
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
}

/// One ring thread's ring and entry; the ring is declared first so it is dropped first.
struct RingThread {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    entry: Entry,
}

impl RingThread {
    /// Queues `sqe` for this thread's entry (submitted by the next wait).
    fn push(&mut self, sqe: &squeue::Entry128) -> io::Result<()> {
        // SAFETY: the entry's buffers live in its RingReply, which is leaked rather than
        // freed while the kernel holds the entry (see `serve`); its iovecs live as long as
        // the entry, and the kernel reads them while the SQE is submitted.
        unsafe { self.ring.submission().push(sqe) }.map_err(|_| io::Error::other("ring full"))?;
        self.entry.in_kernel = true;
        Ok(())
    }

    /// Submits what is queued and waits (at most POLL) for the entry to come back: its
    /// completion's result, if one came.
    fn wait(&mut self) -> io::Result<Option<i32>> {
        let poll = types::Timespec::from(POLL);
        let args = types::SubmitArgs::new().timespec(&poll);
        match self.ring.submitter().submit_with_args(1, &args) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY)
                ) => {}
            Err(e) => return Err(e),
        }
        let res = self.ring.completion().next().map(|c| c.result());
        if res.is_some() {
            self.entry.in_kernel = false;
        }
        Ok(res)
    }
}

/// The ring threads of one session, and what it takes to add one to a queue.
pub(crate) struct Rings<FS: Filesystem> {
    /// What each ring thread's event loop is made from (its name aside).
    template: SessionEventLoop<FS>,
    payload: usize,
    /// Ring threads each queue starts with: the entries kept free of deferred answers.
    per_queue: usize,
    /// Where the session is mounted (none: taken over, not mounted here): an added entry's
    /// `statfs` goes there ([`poke`]).
    mountpoint: Option<std::path::PathBuf>,
    stop: AtomicBool,
    /// Per queue: its entries, and how many of them hold a deferred answer.
    counts: Vec<Mutex<QueueCount>>,
    threads: Mutex<Vec<JoinHandle<io::Result<()>>>>,
}

#[derive(Default)]
struct QueueCount {
    entries: usize,
    deferred: usize,
}

impl<FS: Filesystem> Rings<FS> {
    fn event_loop(&self, thread_name: String) -> SessionEventLoop<FS> {
        SessionEventLoop {
            thread_name,
            ..self.template.clone()
        }
    }

    /// Starts ring thread `k` of queue `qid`; `submitted` hears once its entry is. An added
    /// one (`k` past the first count) then pokes its queue ([`poke`]).
    fn spawn(
        self: &Arc<Self>,
        qid: usize,
        k: usize,
        submitted: std::sync::mpsc::Sender<io::Result<()>>,
    ) -> io::Result<()> {
        let thread_name = format!("fuser-ring-{qid}-{k}");
        let event_loop = self.event_loop(thread_name.clone());
        let rings = self.clone();
        let added = k >= self.per_queue;
        let t = std::thread::Builder::new()
            .name(thread_name)
            .spawn(move || serve(&event_loop, &rings, qid as u16, added, submitted))?;
        self.threads.lock().push(t);
        Ok(())
    }

    /// A request of queue `qid` is answered later: its entry is held until then. Adds an
    /// entry to the queue if fewer than `per_queue` others would be free.
    fn deferring(self: &Arc<Self>, qid: u16) {
        let k = {
            let mut c = self.counts[qid as usize].lock();
            c.deferred += 1;
            // Saturating: a request may be deferred on a queue whose first entries are still
            // being counted at start.
            let free = c.entries.saturating_sub(c.deferred);
            if free >= self.per_queue || self.stop.load(Ordering::SeqCst) {
                return;
            }
            if c.entries >= MOST_ENTRIES_PER_QUEUE {
                warn!(
                    "ring {qid}: {} of its {} entries wait for deferred answers; its requests \
                     wait for them too",
                    c.deferred, c.entries
                );
                return;
            }
            // Counted before it is started (outside the count's lock, which the queue's
            // answers take), so a deferral meanwhile counts it.
            c.entries += 1;
            c.entries - 1
        };
        // Not waited for: the new thread registers its entry on its own.
        let (submitted, _) = std::sync::mpsc::channel();
        if let Err(e) = self.spawn(qid as usize, k, submitted) {
            self.counts[qid as usize].lock().entries -= 1;
            warn!("ring {qid}: no thread for another entry: {e}");
        }
    }

    /// A deferred answer of queue `qid` came: its entry is free again.
    fn answered_later(&self, qid: u16) {
        self.counts[qid as usize].lock().deferred -= 1;
    }

    /// Stops every ring thread (the session ended) and waits for them, the ones added
    /// meanwhile too.
    pub(crate) fn stop_and_join(&self) -> io::Result<io::Result<()>> {
        self.stop.store(true, Ordering::SeqCst);
        let mut reply = Ok(());
        loop {
            let threads = std::mem::take(&mut *self.threads.lock());
            if threads.is_empty() {
                return Ok(reply);
            }
            let r = crate::session::join_event_loops(threads)?;
            if reply.is_ok() {
                reply = r;
            }
        }
    }
}

/// Makes the kernel hand out what queue `qid` holds queued: a detached thread on its CPU
/// `statfs`es the mount (a request the kernel never answers from a cache), which a free
/// entry (one just added) takes; its commit fetches the next queued request. The thread is
/// not joined: its request ends when answered, or with the connection.
fn poke(mountpoint: &std::path::Path, qid: u16) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(mountpoint.as_os_str().as_bytes()) else {
        return;
    };
    let poked = std::thread::Builder::new()
        .name(format!("fuser-ring-{qid}-poke"))
        .spawn(move || {
            pin_to_cpu(qid as usize);
            // SAFETY: `libc::statfs` is plain integers, for which all zeros is a valid value.
            let mut st: libc::statfs = unsafe { std::mem::zeroed() };
            // SAFETY: `path` is NUL-terminated and outlives the call; `st` is a statfs the
            // call writes into.
            if unsafe { libc::statfs(path.as_ptr(), &mut st) } != 0 {
                let e = io::Error::last_os_error();
                warn!("ring {qid}: statfs of the mount after an entry was added: {e}");
            }
        });
    if let Err(e) = poked {
        warn!("ring {qid}: no thread to hand out requests queued before an added entry: {e}");
    }
}

fn serve<FS: Filesystem>(
    se: &SessionEventLoop<FS>,
    rings: &Arc<Rings<FS>>,
    qid: u16,
    added: bool,
    submitted: std::sync::mpsc::Sender<io::Result<()>>,
) -> io::Result<()> {
    let payload = rings.payload;
    pin_to_cpu(qid as usize);
    let fd = std::os::fd::AsRawFd::as_raw_fd(&std::os::fd::AsFd::as_fd(&se.ch));
    let setup = || -> io::Result<RingThread> {
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(4)?;
        let mut rt = RingThread {
            ring,
            entry: Entry::new(payload, se.ch.sender()),
        };
        let sqe = rt.entry.sqe(fd, qid, FUSE_IO_URING_CMD_REGISTER, 0);
        rt.push(&sqe)?;
        rt.ring.submit()?;
        Ok(rt)
    };
    let mut rt = match setup() {
        Ok(rt) => {
            let _ = submitted.send(Ok(()));
            // Registered (the kernel took the entry as the submission ran).
            if let (true, Some(at)) = (added, rings.mountpoint.as_deref()) {
                poke(at, qid);
            }
            rt
        }
        Err(e) => {
            let _ = submitted.send(Err(io::Error::new(e.kind(), e.to_string())));
            return Err(e);
        }
    };
    let result = serve_entry(se, rings, &mut rt, fd, qid);
    // The session ended (or this thread failed): give the kernel a moment to hand the entry
    // back; if it still holds it, the buffers are leaked, never freed under it.
    let mut waits = 0;
    while rt.entry.in_kernel && waits < LAST_WAITS {
        waits += 1;
        if rt.wait().is_err() {
            break;
        }
    }
    if rt.entry.in_kernel {
        std::mem::forget(rt.entry.reply.clone());
    }
    if let Err(e) = &result {
        error!("FUSE over io_uring: queue {qid} cannot be served ({e}); ending the connection");
        let ended = se.filesystem.fs.as_ref().is_some_and(|fs| fs.ring_failed(qid, e));
        if !ended {
            error!(
                "FUSE over io_uring: the file system could not end the connection; aborting, \
                 so that the kernel ends it instead of holding every request of that CPU forever"
            );
            std::process::abort();
        }
    }
    result
}

/// Test hook (rmemfs patch): the next ring thread to look fails its queue as a refused entry
/// would, so a test can see what a ring error does to the mount.
static RING_FAULT: AtomicBool = AtomicBool::new(false);

/// Makes one ring thread fail its queue (see [`RING_FAULT`]).
pub fn fail_a_ring_for_test() {
    RING_FAULT.store(true, Ordering::SeqCst);
}

/// Serves requests through `rt`'s entry until the session ends (`stop`, or the kernel gives
/// the entry back for good).
fn serve_entry<FS: Filesystem>(
    se: &SessionEventLoop<FS>,
    rings: &Arc<Rings<FS>>,
    rt: &mut RingThread,
    fd: i32,
    qid: u16,
) -> io::Result<()> {
    let (payload, stop) = (rings.payload, &rings.stop);
    let mut refusals = 0;
    while !stop.load(Ordering::SeqCst) {
        if RING_FAULT.load(Ordering::Relaxed) && RING_FAULT.swap(false, Ordering::SeqCst) {
            return Err(io::Error::other("a ring failure injected by a test"));
        }
        let Some(res) = rt.wait()? else {
            continue;
        };
        if res < 0 {
            if TEARDOWN.contains(&-res) {
                return Ok(());
            }
            // Refused (EAGAIN before INIT is processed; anything else the kernel may say of
            // a commit it could not match): register the entry again, a while.
            refusals += 1;
            if refusals > REGISTER_TRIES {
                return Err(io::Error::from_raw_os_error(-res));
            }
            if res != -libc::EAGAIN {
                warn!("ring {qid}: entry refused ({}); registering it again", io::Error::from_raw_os_error(-res));
            }
            std::thread::sleep(Duration::from_millis(1));
            let sqe = rt.entry.sqe(fd, qid, FUSE_IO_URING_CMD_REGISTER, 0);
            rt.push(&sqe)?;
            continue;
        }
        refusals = 0;
        let entry = &rt.entry;
        let commit_id = entry.header_u64(COMMIT_ID_AT);
        let unique = entry.header_u64(8);
        let len = entry.header_u32(0) as usize;
        let payload_len = entry.header_u32(PAYLOAD_SZ_AT) as usize;
        let op_len = len.checked_sub(IN_HEADER + payload_len);
        let answered = match op_len {
            Some(op_len) if op_len <= OP_IN_MAX && payload_len <= payload => {
                entry.reply.await_reply(payload_len == 0);
                let request = entry.request(op_len, payload_len);
                match RequestWithSender::new(ReplySender::Ring(entry.reply.clone()), request) {
                    Some(req) => req.dispatch(se),
                    None => {
                        error!("ring {qid}: a request fuser cannot parse; answered EIO");
                        let _ = entry.reply.send(&[IoSlice::new(&eio_reply(unique))]);
                    }
                }
                let later = entry.reply.awaited_after(DEFERRED_AFTER);
                if later {
                    rings.deferring(qid);
                }
                let answered = entry.reply.take();
                if later {
                    rings.answered_later(qid);
                }
                answered
            }
            _ => {
                warn!("ring {qid}: a request of {len} bytes with {payload_len} of payload; answered EIO");
                entry.reply.await_reply(true);
                let _ = entry.reply.send(&[IoSlice::new(&eio_reply(unique))]);
                entry.reply.take()
            }
        };
        entry.set_header_u32(PAYLOAD_SZ_AT, answered as u32);
        let sqe = entry.sqe(fd, qid, FUSE_IO_URING_CMD_COMMIT_AND_FETCH, commit_id);
        rt.push(&sqe)?;
    }
    Ok(())
}
