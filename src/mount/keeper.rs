//! Restart without unmounting: the FUSE connection kept open across the daemon's end.
//!
//! The kernel ends a FUSE connection when its last /dev/fuse descriptor closes, and every
//! program with a file open on the mount loses it. A daemon that keeps its connection
//! (`--keep-connection`, which `--supervise` implies; volumes only) hands a duplicate of its
//! descriptor, with a small state file (a memfd), to a keeper the way systemd's file
//! descriptor store takes them: `FDSTORE=1` datagrams on `$NOTIFY_SOCKET` carrying the
//! descriptors (SCM_RIGHTS). The keeper is systemd itself (`FileDescriptorStoreMax=`) or the
//! supervisor of `rmemfs mount --supervise` ([`supervise`]), which speaks the same protocol.
//! When the daemon dies (a crash, `kill -9`, the OOM killer) or restarts on purpose
//! (SIGHUP: an upgrade), programs' requests wait in the kernel; the next daemon receives
//! both descriptors (`$LISTEN_FDS`, `$LISTEN_FDNAMES`), re-attaches the volume, takes the
//! connection over and asks the kernel to queue again what the dead daemon read but never
//! answered (FUSE_NOTIFY_RESEND, Linux 6.9+).
//!
//! The state file says what a daemon taking over must know that the kernel will not tell it
//! again: the protocol version agreed at INIT, and each daemon's incarnation with the first
//! inode number it issued. Inode numbers issued in a crash's lost commit interval are issued
//! again by the next daemon; the kernel may still hold the old ones, so inodes from each
//! incarnation's first number on carry that incarnation as their FUSE generation, and the
//! kernel takes a reused number for a new inode (`fuse_iget` drops a stale one).

use nix::sys::socket::{self, ControlMessage, ControlMessageOwned, MsgFlags, UnixAddr};
use std::ffi::OsString;
use std::io::{IoSlice, IoSliceMut, Read, Seek, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The names the descriptors are stored under (`FDNAME=`).
pub const FUSE_FD_NAME: &str = "rmemfs-fuse";
pub const STATE_FD_NAME: &str = "rmemfs-state";
/// Set in the environment of a daemon the supervisor runs: it keeps its connection.
pub const SUPERVISED_ENV: &str = "RMEMFS_SUPERVISED";
/// The exit code of a daemon that ends on purpose without unmounting (SIGHUP), so that its
/// keeper starts the next one at once (EX_TEMPFAIL).
pub const RESTART_EXIT: i32 = 75;
/// The first descriptor passed by `$LISTEN_FDS` (SD_LISTEN_FDS_START).
const LISTEN_FDS_START: RawFd = 3;
/// The supervisor gives up after this many unplanned daemon ends within
/// [`RESPAWN_WINDOW`] (a daemon that cannot attach would otherwise spin): the connection is
/// then let go, and the mount answers ENOTCONN until `rmemfs mount` mounts it again.
const RESPAWN_LIMIT: usize = 5;
const RESPAWN_WINDOW: Duration = Duration::from_secs(60);
/// The pause before starting a daemon again after one failed (servers may still be coming
/// back).
const RESPAWN_PAUSE: Duration = Duration::from_secs(1);
/// The state file's first line.
const STATE_MAGIC: &str = "rmemfs kept connection 1";

/// A kept connection a daemon receives from its keeper.
pub struct Inherited {
    pub fuse: OwnedFd,
    pub state: KeptState,
}

/// The descriptors this daemon was started with (`$LISTEN_FDS`), if its keeper holds a
/// connection for it. The variables are removed so that no child inherits them.
/// `$LISTEN_PID`, which systemd sets, must name this process; the supervisor leaves it out.
pub fn inherited() -> Result<Option<Inherited>, String> {
    let Some(count) = std::env::var_os("LISTEN_FDS") else {
        return Ok(None);
    };
    let pid = std::env::var("LISTEN_PID").ok();
    let names = std::env::var("LISTEN_FDNAMES").unwrap_or_default();
    for var in ["LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"] {
        std::env::remove_var(var);
    }
    if pid.is_some_and(|p| p != std::process::id().to_string()) {
        return Ok(None);
    }
    let count: RawFd = count
        .to_str()
        .and_then(|c| c.parse().ok())
        .ok_or("LISTEN_FDS is not a number")?;
    let (mut fuse, mut state) = (None, None);
    for (i, name) in (0..count).zip(names.split(':').chain(std::iter::repeat(""))) {
        let raw = LISTEN_FDS_START + i;
        // SAFETY: the keeper passed descriptors LISTEN_FDS_START.. to this process, which
        // owns them from here (nothing else in it knows these numbers).
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        nix::fcntl::fcntl(
            &fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .map_err(|e| format!("inherited descriptor {raw}: {e}"))?;
        match name {
            FUSE_FD_NAME => fuse = Some(fd),
            STATE_FD_NAME => state = Some(KeptState(std::fs::File::from(fd))),
            _ => {}
        }
    }
    match (fuse, state) {
        (Some(fuse), Some(state)) => Ok(Some(Inherited { fuse, state })),
        (None, _) => Ok(None),
        (Some(_), None) => Err(format!(
            "the keeper passed a FUSE connection without its state ({STATE_FD_NAME})"
        )),
    }
}

/// The state file of a kept connection (see the module doc), in RAM (a memfd), appended to
/// by each daemon before it serves a request.
pub struct KeptState(std::fs::File);

/// What the state file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRecord {
    /// The kernel's FUSE protocol minor, as agreed at INIT.
    pub proto_minor: u32,
    /// (incarnation, first inode number it issued), oldest first.
    pub incarnations: Vec<(u32, u64)>,
}

impl StateRecord {
    /// The FUSE generation of inode `ino`: the incarnation that issued numbers from the
    /// highest first number at or below it (0: the first daemon's).
    pub fn generation(&self, ino: u64) -> u64 {
        self.incarnations
            .iter()
            .rev()
            .find(|(_, first)| *first <= ino)
            .map_or(0, |(inc, _)| u64::from(*inc))
    }

    /// The incarnation of the next daemon.
    pub fn next_incarnation(&self) -> u32 {
        self.incarnations.last().map_or(0, |(i, _)| i + 1)
    }

    fn parse(text: &str) -> Result<StateRecord, String> {
        let mut lines = text.split_inclusive('\n');
        if lines.next().map(str::trim_end) != Some(STATE_MAGIC) {
            return Err("the kept connection's state file is not rmemfs's".into());
        }
        let mut record = StateRecord {
            proto_minor: 0,
            incarnations: Vec::new(),
        };
        // A line without its newline is one a daemon died writing: ignored.
        for line in lines.filter(|l| l.ends_with('\n')) {
            let words: Vec<&str> = line.split_whitespace().collect();
            let num = |w: &str| {
                w.parse::<u64>()
                    .map_err(|_| format!("bad state line {line:?}"))
            };
            match words[..] {
                ["proto", minor] => record.proto_minor = num(minor)? as u32,
                ["incarnation", inc, "first", first] => {
                    record.incarnations.push((num(inc)? as u32, num(first)?))
                }
                _ => return Err(format!("bad state line {line:?}")),
            }
        }
        Ok(record)
    }
}

impl KeptState {
    /// A new state file for a connection just initialized with protocol minor `proto_minor`.
    pub fn create(proto_minor: u32) -> std::io::Result<KeptState> {
        let fd = nix::sys::memfd::memfd_create(
            "rmemfs-kept-connection",
            nix::sys::memfd::MFdFlags::MFD_CLOEXEC,
        )?;
        let mut state = KeptState(std::fs::File::from(fd));
        state.append(&format!("{STATE_MAGIC}\nproto {proto_minor}\n"))?;
        Ok(state)
    }

    pub fn read(&self) -> Result<StateRecord, String> {
        let mut text = String::new();
        let mut f = &self.0;
        f.seek(std::io::SeekFrom::Start(0))
            .and_then(|_| f.read_to_string(&mut text))
            .map_err(|e| format!("cannot read the kept connection's state: {e}"))?;
        StateRecord::parse(&text)
    }

    /// Records that daemon `incarnation` issues inode numbers from `first` on.
    pub fn record_incarnation(&mut self, incarnation: u32, first: u64) -> std::io::Result<()> {
        self.append(&format!("incarnation {incarnation} first {first}\n"))
    }

    fn append(&mut self, line: &str) -> std::io::Result<()> {
        self.0.seek(std::io::SeekFrom::End(0))?;
        self.0.write_all(line.as_bytes())
    }
}

impl AsFd for KeptState {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Hands the connection and its state to the keeper named by `$NOTIFY_SOCKET` (systemd's
/// file descriptor store, or the supervisor). Each replaces what an earlier daemon stored
/// under the same name.
pub fn store(fuse: BorrowedFd<'_>, state: &KeptState) -> Result<(), String> {
    let path = std::env::var_os("NOTIFY_SOCKET")
        .ok_or("--keep-connection needs a keeper: run under systemd with FileDescriptorStoreMax=2, or use --supervise")?;
    let addr = notify_addr(&path).map_err(|e| format!("NOTIFY_SOCKET: {e}"))?;
    let sock = UnixDatagram::unbound().map_err(|e| e.to_string())?;
    for (name, fd) in [(FUSE_FD_NAME, fuse), (STATE_FD_NAME, state.as_fd())] {
        let msg = format!("FDSTORE=1\nFDNAME={name}\n");
        let fds = [fd.as_raw_fd()];
        socket::sendmsg(
            sock.as_raw_fd(),
            &[IoSlice::new(msg.as_bytes())],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            Some(&addr),
        )
        .map_err(|e| format!("cannot hand {name} to the keeper: {e}"))?;
    }
    Ok(())
}

fn notify_addr(path: &std::ffi::OsStr) -> nix::Result<UnixAddr> {
    use std::os::unix::ffi::OsStrExt;
    match path.as_bytes().strip_prefix(b"@") {
        Some(name) => UnixAddr::new_abstract(name),
        None => UnixAddr::new(path.as_bytes()),
    }
}

/// What the supervisor has been told by its daemon.
#[derive(Default)]
struct Kept {
    fuse: Option<OwnedFd>,
    state: Option<OwnedFd>,
    ready: bool,
}

impl Kept {
    /// Reads every datagram waiting on `sock` (sd_notify's protocol: `KEY=value` lines,
    /// descriptors attached to `FDSTORE=1`).
    fn drain(&mut self, sock: &UnixDatagram) {
        loop {
            let mut buf = [0u8; 512];
            let mut cmsg = nix::cmsg_space!([RawFd; 4]);
            let mut iov = [IoSliceMut::new(&mut buf)];
            let msg = match socket::recvmsg::<()>(
                sock.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg),
                MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Ok(m) => m,
                Err(nix::errno::Errno::EAGAIN) => return,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    log::error!("supervisor: reading the daemon's notification: {e}");
                    return;
                }
            };
            let mut fds: Vec<OwnedFd> = Vec::new();
            if let Ok(cmsgs) = msg.cmsgs() {
                for c in cmsgs {
                    if let ControlMessageOwned::ScmRights(raw) = c {
                        // SAFETY: SCM_RIGHTS installed these descriptors in this process
                        // for this message; nothing else owns them.
                        fds.extend(raw.into_iter().map(|r| unsafe { OwnedFd::from_raw_fd(r) }));
                    }
                }
            }
            let len = msg.bytes;
            let text = String::from_utf8_lossy(&buf[..len]).into_owned();
            let fields: Vec<&str> = text.lines().collect();
            if fields.contains(&"READY=1") {
                self.ready = true;
            }
            if fields.contains(&"FDSTORE=1") {
                let name = fields.iter().find_map(|f| f.strip_prefix("FDNAME="));
                match (name, fds.pop()) {
                    (Some(FUSE_FD_NAME), Some(fd)) => self.fuse = Some(fd),
                    (Some(STATE_FD_NAME), Some(fd)) => self.state = Some(fd),
                    (name, _) => log::warn!("supervisor: ignored a stored descriptor {name:?}"),
                }
            }
        }
    }
}

/// Runs the daemon (this binary with `args`, in the environment [`SUPERVISED_ENV`]) and
/// keeps its FUSE connection: a daemon that dies is started again on the same connection,
/// and programs keep their open files. `ready` is called once the first daemon is serving.
/// Returns when a daemon ends with the mount (0: unmounted), or when the supervisor gives
/// up. SIGTERM and SIGINT go to the daemon (which unmounts), SIGHUP too (which restarts it
/// in place: an upgraded binary takes over).
pub fn supervise(args: &[OsString], ready: &mut dyn FnMut()) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own binary: {e}"))?;
    let name = format!(
        "rmemfs-keeper-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let sock = {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .map_err(|e| e.to_string())?;
        UnixDatagram::bind_addr(&addr).map_err(|e| format!("supervisor socket: {e}"))?
    };
    let child_pid = std::sync::Arc::new(std::sync::atomic::AtomicI32::new(0));
    forward_signals(child_pid.clone())?;
    let mut kept = Kept::default();
    let mut ends: Vec<Instant> = Vec::new();
    loop {
        let mut cmd = Command::new(&exe);
        cmd.args(args)
            .env(SUPERVISED_ENV, "1")
            .env("NOTIFY_SOCKET", format!("@{name}"))
            .stdin(Stdio::null());
        if kept.ready {
            // After the first daemon is up, the parent's pipe (stdout) is no one's to write.
            cmd.stdout(Stdio::null());
        }
        let passed = pass_kept(&mut cmd, &kept)?;
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start the mount daemon: {e}"))?;
        drop(passed);
        child_pid.store(child.id() as i32, std::sync::atomic::Ordering::SeqCst);
        let mut announced = kept.ready;
        let status = loop {
            kept.drain(&sock);
            if kept.ready && !announced {
                announced = true;
                ready();
            }
            match child.try_wait().map_err(|e| e.to_string())? {
                Some(status) => break status,
                None => wait_readable(&sock, Duration::from_millis(200)),
            }
        };
        kept.drain(&sock);
        child_pid.store(0, std::sync::atomic::Ordering::SeqCst);
        if !kept.ready {
            return Err(format!(
                "the mount daemon exited before the mount was ready ({status}); its log says why"
            ));
        }
        match (status.code(), status.signal()) {
            (Some(0), _) => return Ok(()),
            (Some(RESTART_EXIT), _) => {
                log::info!("supervisor: the daemon restarts in place");
                continue;
            }
            (code, signal) => {
                log::error!(
                    "supervisor: the daemon ended (exit {code:?}, signal {signal:?}); starting \
                     another on the kept connection"
                );
            }
        }
        if kept.fuse.is_none() {
            return Err("the daemon ended without handing its connection over".into());
        }
        let now = Instant::now();
        ends.retain(|t| now.duration_since(*t) < RESPAWN_WINDOW);
        ends.push(now);
        if ends.len() > RESPAWN_LIMIT {
            return Err(format!(
                "the daemon ended {} times within {RESPAWN_WINDOW:?}: letting the connection \
                 go (the mount answers ENOTCONN; `rmemfs mount` mounts it again)",
                ends.len()
            ));
        }
        if ends.len() > 1 {
            std::thread::sleep(RESPAWN_PAUSE);
        }
    }
}

/// Arranges for the kept descriptors to reach `cmd`'s process as `$LISTEN_FDS` 3 and 4.
/// Returns the duplicates it made, to close once the child has started.
fn pass_kept(cmd: &mut Command, kept: &Kept) -> Result<Vec<OwnedFd>, String> {
    let (Some(fuse), Some(state)) = (&kept.fuse, &kept.state) else {
        return Ok(Vec::new());
    };
    // Duplicates above the target numbers, so that placing one cannot overwrite the other.
    let high = |fd: &OwnedFd| {
        nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(64))
            // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor that nothing else owns.
            .map(|raw| unsafe { OwnedFd::from_raw_fd(raw) })
            .map_err(|e| format!("supervisor: dup: {e}"))
    };
    let dups = vec![high(fuse)?, high(state)?];
    let raws: Vec<RawFd> = dups.iter().map(|d| d.as_raw_fd()).collect();
    cmd.env("LISTEN_FDS", "2")
        .env("LISTEN_FDNAMES", format!("{FUSE_FD_NAME}:{STATE_FD_NAME}"))
        .env_remove("LISTEN_PID");
    // SAFETY: between fork and exec only async-signal-safe calls (dup2) are made, on
    // descriptors that stay open in the parent until the child has started.
    unsafe {
        cmd.pre_exec(move || {
            for (i, &raw) in raws.iter().enumerate() {
                // dup2 gives the new number no close-on-exec flag: it survives exec.
                if libc::dup2(raw, LISTEN_FDS_START + i as RawFd) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    Ok(dups)
}

fn wait_readable(sock: &UnixDatagram, timeout: Duration) {
    let mut fds = [nix::poll::PollFd::new(
        sock.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    let ms = nix::poll::PollTimeout::try_from(timeout).unwrap_or(nix::poll::PollTimeout::MAX);
    let _ = nix::poll::poll(&mut fds, ms);
}

/// SIGTERM, SIGINT and SIGHUP to the supervisor go to its daemon.
fn forward_signals(child: std::sync::Arc<std::sync::atomic::AtomicI32>) -> Result<(), String> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    std::thread::Builder::new()
        .name("supervisor-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                let pid = child.load(std::sync::atomic::Ordering::SeqCst);
                if pid > 0 {
                    // SAFETY: kill has no memory-safety preconditions.
                    unsafe { libc::kill(pid, sig) };
                }
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_follow_each_incarnations_first_number() {
        let mut state = KeptState::create(41).unwrap();
        assert_eq!(state.read().unwrap().next_incarnation(), 0);
        state.record_incarnation(0, 0).unwrap();
        state.record_incarnation(1, 500).unwrap();
        state.record_incarnation(2, 480).unwrap(); // a crash lost 480..500: issued again
        let r = state.read().unwrap();
        assert_eq!(r.proto_minor, 41);
        assert_eq!(r.next_incarnation(), 3);
        assert_eq!(r.generation(1), 0);
        assert_eq!(r.generation(479), 0);
        assert_eq!(r.generation(490), 2, "a reissued number is a new inode");
        assert_eq!(r.generation(10_000), 2);
    }

    #[test]
    fn a_torn_last_line_is_ignored_and_a_foreign_file_refused() {
        let text = format!("{STATE_MAGIC}\nproto 40\nincarnation 0 first 0\nincarnation 1 fi");
        let r = StateRecord::parse(&text).unwrap();
        assert_eq!(r.incarnations, vec![(0, 0)]);
        assert!(StateRecord::parse("something else\n").is_err());
    }

    #[test]
    fn stored_descriptors_reach_the_keeper() {
        let name = format!("rmemfs-keeper-test-{}", std::process::id());
        let sock = {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
            UnixDatagram::bind_addr(&addr).unwrap()
        };
        let state = KeptState::create(40).unwrap();
        let fake_fuse = std::fs::File::open("/dev/null").unwrap();
        std::env::set_var("NOTIFY_SOCKET", format!("@{name}"));
        store(fake_fuse.as_fd(), &state).unwrap();
        std::env::remove_var("NOTIFY_SOCKET");
        let mut kept = Kept::default();
        kept.drain(&sock);
        let stored = KeptState(std::fs::File::from(kept.state.expect("state stored")));
        assert_eq!(stored.read().unwrap().proto_minor, 40);
        assert!(kept.fuse.is_some());
        assert!(!kept.ready);
    }
}
