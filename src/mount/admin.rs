//! `rmemfs admin`: how an admin reaches a running mount daemon.
//!
//! Each daemon listens on a Unix socket in a directory only its user may enter
//! (`/run/rmemfs` for root, else `$XDG_RUNTIME_DIR/rmemfs` or `/tmp/rmemfs-UID`, mode 0700),
//! named by its pid (and a count, for a process serving several mounts). The socket's path
//! is in the mount's report (`stats --json`: `admin_socket`), which `rmemfs admin MOUNTPOINT
//! …` reads through the mount itself, so no naming convention ties a mount point to a socket. Who may use it: root, or the user the
//! daemon runs as (the mount's owner); the daemon checks the caller's credentials
//! (SO_PEERCRED) as well as the directory's mode.
//!
//! One request per connection: a JSON line (`{"op":"export","dest":"…"}`), answered by one
//! JSON line (`{"ok":true,"message":"…"}`).

use crate::fs::{Barrier, Fs};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A request to the daemon.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    /// A point-in-time copy of the attached volume into `dest` (a directory or
    /// `s3://BUCKET/PREFIX`): changes wait while it copies.
    Export { dest: String },
    /// Keep `copies` copies of every chunk from now on; the rebuild adds or drops copies in
    /// the background (its progress in `stats`: `chunks.degraded`, `chunks.surplus`).
    SetReplicas { copies: usize },
    /// Put the server at `server` (`host:port`) into the pool; with `rebalance`, then move
    /// copies toward even use (progress lines meanwhile).
    AddServer {
        server: String,
        #[serde(default)]
        rebalance: bool,
    },
    /// Move everything off `server`; answered once it holds nothing of the mount (progress
    /// lines meanwhile).
    Drain { server: String },
    /// Forget drained `server`.
    Remove { server: String },
    /// Move copies toward even use of the servers (progress lines meanwhile).
    Rebalance,
}

/// One answer line. Before the last, a long request may send progress lines
/// (`progress: true`), which the caller shows as they come.
#[derive(Debug, Serialize, Deserialize)]
struct Reply {
    ok: bool,
    message: String,
    #[serde(default)]
    progress: bool,
}

/// How long a caller may take to send its request line: the thread serves one caller at a
/// time, and an unmount waits for the request in hand.
const REQUEST_WAIT: Duration = Duration::from_secs(10);

/// The longest request line read (a path or URL and a few words).
const MAX_REQUEST: u64 = 64 * 1024;

/// The daemon's end: a listening socket and the thread serving it. Dropping it ends the
/// thread (after the request it serves, if any) and removes the socket file; the thread's
/// hold on the file system ends with it, so an unmount can say goodbye to the servers.
pub struct AdminServer {
    path: PathBuf,
    /// Ends a drain under way (an unmount does not wait for one).
    work: Arc<crate::upkeep::rebuild::Stop>,
    /// A second handle on the listening socket, to wake the thread's `accept`.
    listener: UnixListener,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the daemon's admin requests act on.
pub struct Target {
    pub fs: Arc<Fs>,
    /// Where a drain shows itself and its passes.
    pub upkeep: Arc<crate::upkeep::figures::UpkeepFigures>,
    /// The volume and its journal (none: a private namespace, which has nothing to export).
    pub volume: Option<(String, Arc<crate::volume::VolumeJournal>)>,
    /// Most bytes per second a drain copies (the mount's `--rebuild-rate`; 0: no limit).
    pub rebuild_rate: u64,
}

fn socket_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return PathBuf::from("/run/rmemfs");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) => PathBuf::from(d).join("rmemfs"),
        None => std::env::temp_dir().join(format!("rmemfs-{uid}")),
    }
}

/// The admin socket, bound but not yet served: bound before the mount, so its path is in
/// the report from the first request on.
pub struct Listening {
    path: PathBuf,
    listener: UnixListener,
}

impl Listening {
    /// Binds this mount's admin socket.
    pub fn bind() -> Result<Listening, String> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let dir = socket_dir();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .and_then(|()| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)))
            .map_err(|e| format!("admin socket directory {}: {e}", dir.display()))?;
        // A process may serve several mounts (tests do): each gets its own socket.
        static SERVED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = SERVED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = dir.join(format!("admin-{}-{n}.sock", std::process::id()));
        // A stale socket of an earlier process with this pid.
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)
            .map_err(|e| format!("admin socket {}: {e}", path.display()))?;
        Ok(Listening { path, listener })
    }

    /// Where it listens (the report's `admin_socket`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serves `target`'s admin requests until the result is dropped.
    pub fn serve(self, target: Target) -> Result<AdminServer, String> {
        let Listening { path, listener } = self;
        let served = AdminServer::start(path.clone(), listener, target);
        if served.is_err() {
            let _ = std::fs::remove_file(&path);
        }
        served
    }
}

impl AdminServer {
    fn start(path: PathBuf, listener: UnixListener, target: Target) -> Result<AdminServer, String> {
        let waker = listener.try_clone().map_err(|e| e.to_string())?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let work = Arc::new(crate::upkeep::rebuild::Stop::default());
        let ending = work.clone();
        let thread = std::thread::Builder::new()
            .name("admin".into())
            .spawn(move || {
                let busy = Busy::default();
                // Each caller on its own thread, so a second one hears at once that a long
                // request (a drain) is running; the scope joins them all before the thread
                // (and with it its hold on the file system) ends.
                std::thread::scope(|scope| {
                    for conn in listener.incoming() {
                        if stopped.load(Ordering::SeqCst) {
                            break;
                        }
                        let (target, ending, busy) = (&target, &*ending, &busy);
                        scope.spawn(move || {
                            let served = conn.map_err(|e| e.to_string()).and_then(|conn| {
                                conn.set_read_timeout(Some(REQUEST_WAIT))
                                    .map_err(|e| e.to_string())?;
                                serve(target, ending, busy, conn)
                            });
                            if let Err(e) = served {
                                log::warn!("admin request: {e}");
                            }
                        });
                    }
                });
            })
            .map_err(|e| e.to_string())?;
        Ok(AdminServer {
            path,
            work,
            listener: waker,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.work.stop();
        // Linux ends a blocked accept() on a listening socket that is shut down.
        let _ = nix::sys::socket::shutdown(
            std::os::fd::AsRawFd::as_raw_fd(&self.listener),
            nix::sys::socket::Shutdown::Both,
        );
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Serves one connection: checks who calls, reads one request, answers it.
/// The request running now, if any: requests run one at a time, and a second one is refused
/// at once, naming the first (a drain may take minutes).
#[derive(Default)]
struct Busy(crate::sync::Mutex<Option<String>>);

/// Holds [`Busy`] for one request; lets go on drop (a panic included).
struct Running<'a>(&'a Busy);

impl Busy {
    fn start(&self, what: String) -> Result<Running<'_>, String> {
        let mut now = self.0.lock();
        if let Some(running) = &*now {
            return Err(format!(
                "another admin request is running on this mount ({running}); try again when \
                 it ends"
            ));
        }
        *now = Some(what);
        Ok(Running(self))
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        *self.0 .0.lock() = None;
    }
}

fn serve(
    target: &Target,
    ending: &crate::upkeep::rebuild::Stop,
    busy: &Busy,
    conn: UnixStream,
) -> Result<(), String> {
    let cred = nix::sys::socket::getsockopt(&conn, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| format!("peer credentials: {e}"))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let reply = if cred.uid() != 0 && cred.uid() != me {
        Reply {
            ok: false,
            message: format!(
                "uid {} may not administer this mount (root or uid {me} may)",
                cred.uid()
            ),
            progress: false,
        }
    } else {
        let mut line = String::new();
        let read = BufReader::new(std::io::Read::take(&conn, MAX_REQUEST)).read_line(&mut line);
        match read.map_err(|e| e.to_string()).and_then(|_| {
            serde_json::from_str::<Request>(&line).map_err(|e| format!("bad request: {e}"))
        }) {
            Ok(req) => {
                log::info!(
                    "admin request from uid {} (pid {}): {req:?}",
                    cred.uid(),
                    cred.pid()
                );
                let tell = |line: &str| {
                    let _ = send(
                        &conn,
                        &Reply {
                            ok: true,
                            message: line.to_string(),
                            progress: true,
                        },
                    );
                };
                let outcome = busy
                    .start(format!("{req:?}"))
                    .and_then(|_running| handle(target, req, ending, &tell));
                match outcome {
                    Ok(message) => Reply {
                        ok: true,
                        message,
                        progress: false,
                    },
                    Err(message) => Reply {
                        ok: false,
                        message,
                        progress: false,
                    },
                }
            }
            Err(message) => Reply {
                ok: false,
                message,
                progress: false,
            },
        }
    };
    send(&conn, &reply)
}

fn send(conn: &UnixStream, reply: &Reply) -> Result<(), String> {
    let mut out = serde_json::to_vec(reply).map_err(|e| e.to_string())?;
    out.push(b'\n');
    let mut w = conn;
    w.write_all(&out).map_err(|e| e.to_string())
}

fn handle(
    target: &Target,
    req: Request,
    ending: &crate::upkeep::rebuild::Stop,
    tell: &(dyn Fn(&str) + Sync),
) -> Result<String, String> {
    let journal = target.volume.as_ref().map(|(_, j)| &**j);
    let fs = &*target.fs;
    match req {
        Request::Export { dest } => export(target, &dest),
        Request::SetReplicas { copies } => set_replicas(target, copies),
        Request::AddServer { server, rebalance } => {
            let addr = super::options::resolve_server(&server)?;
            let id = crate::upkeep::membership::add_server(fs, journal, addr)?;
            let joined = format!(
                "memory server {addr} joined as server#{}: new chunks may land there now",
                id.0
            );
            if !rebalance {
                return Ok(joined);
            }
            Ok(format!(
                "{joined}; {}",
                rebalance_now(target, ending, tell)?
            ))
        }
        Request::Rebalance => rebalance_now(target, ending, tell),
        Request::Drain { server } => {
            let addr = super::options::resolve_server(&server)?;
            let d = crate::upkeep::membership::drain(
                fs,
                journal,
                &target.upkeep,
                addr,
                target.rebuild_rate,
                ending,
                tell,
            )?;
            Ok(format!(
                "drained {addr}: {} chunk copies ({} bytes) moved in {:.1} s ({:.0} MB/s); it \
                 holds nothing of this mount (`rmemfs admin remove` forgets it)",
                d.chunks_moved,
                d.bytes_moved,
                d.seconds,
                d.bytes_moved as f64 / d.seconds.max(1e-3) / 1e6
            ))
        }
        Request::Remove { server } => {
            let addr = super::options::resolve_server(&server)?;
            crate::upkeep::membership::remove(fs, journal, addr)?;
            Ok(format!("memory server {addr} removed from this mount"))
        }
    }
}

fn rebalance_now(
    target: &Target,
    ending: &crate::upkeep::rebuild::Stop,
    tell: &(dyn Fn(&str) + Sync),
) -> Result<String, String> {
    let fs = &*target.fs;
    let r = crate::upkeep::membership::rebalance(fs, target.rebuild_rate, ending, tell)?;
    let status = fs.data().pool().status();
    let fractions: Vec<String> = r
        .fractions
        .iter()
        .zip(&status)
        .filter_map(|(f, s)| f.map(|f| format!("{} {:.1}%", s.addr, f * 100.0)))
        .collect();
    Ok(format!(
        "rebalanced: {} chunk copies ({} bytes) moved in {:.1} s; used: {}",
        r.chunks_moved,
        r.bytes_moved,
        r.seconds,
        fractions.join(", ")
    ))
}

fn set_replicas(target: &Target, copies: usize) -> Result<String, String> {
    // A volume survives no more lost servers than its journal's copies do (as `--replicas`
    // at mount: `mount::redundancy`).
    let journal = crate::config::JOURNAL_COPIES;
    if target.volume.is_some() && copies > journal {
        return Err(format!(
            "{copies} copies on a volume: its journal keeps {journal}, which survive {} lost \
             servers, not {}; use at most {journal}",
            journal - 1,
            copies - 1
        ));
    }
    let data = target.fs.data();
    let was = data.replicas();
    data.set_replicas(copies).map_err(|e| e.message)?;
    let h = target.fs.replica_health();
    Ok(format!(
        "copies of every chunk: {was} -> {copies}; the rebuild now brings {} chunks short of \
         copies and {} with too many to it (`rmemfs stats`: chunks degraded and surplus)",
        h.degraded, h.surplus
    ))
}

/// A point-in-time export of the attached volume: changes are held at the door, every
/// change made so far is committed, the namespace and its files' data are copied, then
/// changes go on.
fn export(target: &Target, dest: &str) -> Result<String, String> {
    let Some((name, journal)) = &target.volume else {
        return Err(
            "this mount has no volume: its namespace lives in this daemon only (mount \
                    with --volume to export)"
                .into(),
        );
    };
    let store = crate::volume::store::open(dest)?;
    let start = std::time::Instant::now();
    let frozen = target.fs.freeze();
    let waited = start.elapsed();
    journal.sync().map_err(|e| e.message)?;
    let done = crate::volume::transfer::export(&target.fs, name, &*store);
    drop(frozen);
    let held = start.elapsed();
    let t = done?;
    Ok(format!(
        "exported volume '{name}' to {}: {}; {} chunks copied (the rest were there); changes \
         waited {:.2} s (the freeze began after {:.2} s)",
        store.describe(),
        crate::volume::admin::rate(&t),
        t.chunks_copied,
        held.as_secs_f64(),
        waited.as_secs_f64()
    ))
}

/// `rmemfs admin MOUNTPOINT …`: flushes the mount's dirty pages (so that what programs wrote
/// is in the volume), finds the daemon's socket through the mount's report, sends `req`
/// and returns the daemon's answer.
pub fn request(mountpoint: &Path, req: &Request) -> Result<String, String> {
    use std::os::fd::AsRawFd;
    let dir =
        std::fs::File::open(mountpoint).map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    // SAFETY: syncfs takes a descriptor this process holds open.
    if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
        return Err(format!(
            "flushing {}: {}",
            mountpoint.display(),
            std::io::Error::last_os_error()
        ));
    }
    let report: serde_json::Value =
        serde_json::from_slice(&super::stats::read_report(mountpoint, true)?)
            .map_err(|e| e.to_string())?;
    let socket = report
        .get("admin_socket")
        .and_then(|s| s.as_str())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("{} names no admin socket", mountpoint.display()))?
        .to_string();
    let conn = UnixStream::connect(&socket).map_err(|e| format!("admin socket {socket}: {e}"))?;
    let mut line = serde_json::to_vec(req).map_err(|e| e.to_string())?;
    line.push(b'\n');
    (&conn).write_all(&line).map_err(|e| e.to_string())?;
    let mut lines = BufReader::new(&conn);
    // Progress on one rewritten line in a terminal, one line each otherwise.
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    loop {
        let mut answer = String::new();
        if lines.read_line(&mut answer).map_err(|e| e.to_string())? == 0 {
            return Err("the daemon closed the admin connection without an answer".into());
        }
        let reply: Reply = serde_json::from_str(&answer)
            .map_err(|e| format!("the daemon's answer is not understood ({e}): {answer:?}"))?;
        if reply.progress {
            if tty {
                eprint!("\r\x1b[K{}", reply.message);
            } else {
                eprintln!("{}", reply.message);
            }
            continue;
        }
        if tty {
            eprint!("\r\x1b[K");
        }
        return if reply.ok {
            Ok(reply.message)
        } else {
            Err(reply.message)
        };
    }
}
