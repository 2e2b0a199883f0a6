//! `rmemfs mount`: checks the mount point, connects to the memory servers (or starts an
//! embedded one), builds the file system and serves it through FUSE until it is unmounted
//! (`umount`, or SIGINT/SIGTERM, which unmount cleanly). Closing the connections gives every
//! server its memory back.

use crate::client::control::ControlConn;
use crate::client::{Pool, PoolConfig};
use crate::config;
use crate::data::DataStore;
use crate::fabric::mem::page_size;
use crate::fabric::{Fabric, FabricOptions};
use crate::fs::{Fs, FsConfig};
use crate::fuse::FuseFs;
use crate::mrrc::CacheConfig;
use crate::server::{MemoryServer, ServerConfig, DEFAULT_PORT};
use crate::size::format_size;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Everything `rmemfs mount` was asked for.
#[derive(Debug, Clone)]
pub struct MountConfig {
    pub mountpoint: PathBuf,
    /// `tcp` or `verbs`; `None` takes what the first server announces (tcp when embedded).
    pub fabric: Option<String>,
    /// Device and GID for verbs (the op timeout is `op_timeout`).
    pub fabric_options: FabricOptions,
    /// `host[:port]` of each memory server; empty means an embedded server.
    pub servers: Vec<String>,
    /// Embedded server arena size (default: a quarter of available RAM).
    pub size: Option<u64>,
    /// `-o` options.
    pub options: Vec<String>,
    pub chunk_size: u64,
    pub threads: usize,
    pub op_timeout: Duration,
    /// Registration cache policy and its size in bytes (default from the memlock limit).
    pub reg_cache: crate::mrrc::Policy,
    pub reg_cache_size: Option<u64>,
    pub write_path: crate::data::WritePath,
    /// The shared secret of the memory servers (also given to the embedded server).
    pub secret: crate::auth::Secret,
    /// Copies of every chunk; `None`: 2 with two or more servers, else 1.
    pub replicas: Option<usize>,
    /// Fewest copies a write may land on (fewer is EIO).
    pub min_replicas: usize,
    /// Bytes per second the background rebuild copies at most (0: no limit).
    pub rebuild_rate: u64,
    /// How long the rebuild waits after the live servers change ([`config::REBUILD_DELAY`]).
    pub rebuild_delay: Duration,
    /// Free pool bytes below which writes bypass the writeback cache; `None`: the dirty page
    /// cache the mount may hold.
    pub writeback_low_water: Option<u64>,
    /// Where to serve Prometheus metrics (`--metrics-listen`); `None`: nowhere.
    pub metrics_listen: Option<SocketAddr>,
    /// Spin briefly for small ops' completions on the tcp fabric (`--busy-poll`).
    pub busy_poll: bool,
}

impl MountConfig {
    /// A mount at `mountpoint` with every setting at its default (an embedded server).
    pub fn new(mountpoint: PathBuf) -> MountConfig {
        MountConfig {
            mountpoint,
            fabric: None,
            fabric_options: FabricOptions::default(),
            servers: Vec::new(),
            size: None,
            options: Vec::new(),
            chunk_size: config::CHUNK_SIZE,
            threads: config::FUSE_THREADS,
            op_timeout: config::OP_TIMEOUT,
            reg_cache: crate::mrrc::Policy::Mrrc,
            reg_cache_size: None,
            write_path: crate::data::WritePath::Frrwp,
            secret: crate::auth::Secret::none(),
            replicas: None,
            min_replicas: 1,
            rebuild_rate: config::REBUILD_RATE,
            rebuild_delay: config::REBUILD_DELAY,
            writeback_low_water: None,
            metrics_listen: None,
            busy_poll: false,
        }
    }

    /// The copies each chunk gets over `servers` memory servers.
    pub fn replicas_for(&self, servers: usize) -> usize {
        self.replicas.unwrap_or(if servers >= 2 {
            config::DEFAULT_REPLICAS
        } else {
            1
        })
    }
}

/// Resolves `host[:port]` (port defaults to [`DEFAULT_PORT`]).
pub fn resolve_server(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, DEFAULT_PORT));
    }
    let has_port = s
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok());
    let with_port = if has_port {
        s.to_string()
    } else {
        format!("{s}:{DEFAULT_PORT}")
    };
    with_port
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve memory server '{s}': {e}"))?
        .next()
        .ok_or_else(|| format!("memory server '{s}' resolves to no address"))
}

/// Checks that `path` can be mounted on: exists, is a directory, is not already a mount of
/// ours or anyone's. Returns the canonical path.
pub fn check_mountpoint(path: &Path) -> Result<PathBuf, String> {
    let canon = canonical_mountpoint(path)?;
    let meta =
        std::fs::metadata(&canon).map_err(|e| format!("mount point {}: {e}", path.display()))?;
    if !meta.is_dir() {
        return Err(format!("mount point {} is not a directory", path.display()));
    }
    if let Some(fstype) = mounted_at(&canon) {
        return Err(format!(
            "{} is already a mount point ({fstype}): unmount it first, or pass --force to \
             detach it (a lazy unmount) and mount over it",
            path.display()
        ));
    }
    Ok(canon)
}

/// The canonical form of `path`, also when it is the root of a FUSE mount whose daemon is
/// gone (a stat of it fails with ENOTCONN): its parent's canonical form and its name.
fn canonical_mountpoint(path: &Path) -> Result<PathBuf, String> {
    let missing = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::NotFound {
            format!("mount point {} does not exist", path.display())
        } else {
            format!("mount point {}: {e}", path.display())
        }
    };
    match std::fs::canonicalize(path) {
        Ok(p) => Ok(p),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
                return Err(missing(e));
            };
            let parent = if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            };
            Ok(std::fs::canonicalize(parent).map_err(missing)?.join(name))
        }
        Err(e) => Err(missing(e)),
    }
}

/// The file system type of the last (topmost) mount at `target`, from mountinfo.
fn mounted_at(target: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let target = target.to_string_lossy();
    info.lines()
        .filter(|l| {
            l.split(' ')
                .nth(4)
                .is_some_and(|m| unescape_mountinfo(m) == target)
        })
        .filter_map(|l| l.split(" - ").nth(1)?.split(' ').next().map(String::from))
        .next_back()
}

/// How long a stat of a mounted rmemfs may take before its daemon counts as alive but stuck
/// (not dead): a live daemon answers a GETATTR in microseconds; a frozen one never does.
const STAT_PATIENCE: Duration = Duration::from_secs(2);

/// Makes `path` ready for `rmemfs mount`: a mount of rmemfs whose daemon is gone (killed,
/// OOM-killed: the kernel answers ENOTCONN until someone unmounts it) is detached with a lazy
/// unmount; with `force`, whatever is mounted there is. Returns what it did, for the user.
/// Anything else mounted there is left for [`check_mountpoint`] to refuse.
pub fn prepare_mountpoint(path: &Path, force: bool) -> Result<Option<String>, String> {
    let canon = canonical_mountpoint(path)?;
    let Some(fstype) = mounted_at(&canon) else {
        return Ok(None);
    };
    let what = if fstype == "fuse.rmemfs" && daemon_gone(&canon) {
        "an rmemfs mount whose daemon is gone"
    } else if force {
        "a live mount (--force)"
    } else {
        return Ok(None);
    };
    lazy_unmount(&canon).map_err(|e| {
        format!(
            "{} is {what} ({fstype}); detaching it failed: {e}",
            canon.display()
        )
    })?;
    Ok(Some(format!(
        "{} was {what} ({fstype}): detached it (lazy unmount)",
        canon.display()
    )))
}

/// True if a stat of `mountpoint` answers ENOTCONN: the FUSE connection is gone. Asked on a
/// thread so a frozen daemon (no answer) counts as alive instead of hanging the caller.
fn daemon_gone(mountpoint: &Path) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    let path = mountpoint.to_path_buf();
    let asked = std::thread::Builder::new()
        .name("stat-mountpoint".into())
        .spawn(move || {
            let _ = tx.send(
                std::fs::metadata(&path)
                    .err()
                    .and_then(|e| e.raw_os_error()),
            );
        });
    asked.is_ok() && rx.recv_timeout(STAT_PATIENCE) == Ok(Some(libc::ENOTCONN))
}

/// Detaches the mount at `mountpoint` (MNT_DETACH): directly as root, else through
/// `fusermount3 -u -z`, which lets a user detach a FUSE mount of their own.
pub fn lazy_unmount(mountpoint: &Path) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| "a NUL byte in the path".to_string())?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
        return Ok(());
    }
    let direct = std::io::Error::last_os_error();
    if direct.raw_os_error() != Some(libc::EPERM) {
        return Err(direct.to_string());
    }
    let out = std::process::Command::new("fusermount3")
        .args(["-u", "-z", "--"])
        .arg(mountpoint)
        .output()
        .map_err(|e| format!("{direct}; fusermount3: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "fusermount3 -u -z: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `/proc/self/mountinfo` escapes spaces and the like as `\040`.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A default embedded arena: a quarter of the memory available now, between 64 MiB and 8 GiB
/// (1 GiB when that cannot be read). Pages cost RAM only when files use them.
pub fn default_embedded_size() -> u64 {
    match crate::size::mem_available() {
        Some(b) => (b / 4).clamp(config::EMBEDDED_MIN_BYTES, config::EMBEDDED_MAX_BYTES),
        None => 1 << 30,
    }
}

/// What the registration cache may pin by default: what the locked-memory limit allows (less
/// room for the bounce buffers), or 1 GiB where pinning is not limited (root, or unlimited).
/// The registration cache's size unless `--reg-cache-size` says: at most
/// [`config::REG_CACHE_MAX_BYTES`]; on verbs, whose registrations must pin, also what the
/// memlock limit leaves past [`config::REG_CACHE_MEMLOCK_HEADROOM`]. A software fabric
/// registers unpinned what the limit refuses, so its cache is not held to the limit.
fn default_cache_bytes(pins_for_real: bool) -> u64 {
    const CAP: u64 = config::REG_CACHE_MAX_BYTES;
    const HEADROOM: u64 = config::REG_CACHE_MEMLOCK_HEADROOM;
    // SAFETY: geteuid has no preconditions.
    if !pins_for_real || unsafe { libc::geteuid() } == 0 {
        return CAP;
    }
    match crate::fabric::mem::memlock_limit() {
        None => CAP,
        Some(limit) => limit.saturating_sub(HEADROOM).clamp(1 << 20, CAP),
    }
}

/// Refuses a verbs mount at once when the memlock limit is below
/// [`config::VERBS_MIN_MEMLOCK`]: every verbs buffer is pinned, so such a mount would fail
/// its writes later instead.
fn check_verbs_memlock() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return Ok(());
    }
    match crate::fabric::mem::memlock_limit() {
        Some(limit) if limit < config::VERBS_MIN_MEMLOCK => Err(format!(
            "the verbs fabric pins every buffer it registers, and the locked-memory limit \
             (ulimit -l) is {} KiB; it needs at least {} MiB: raise it (ulimit -l unlimited, \
             or LimitMEMLOCK= in a systemd unit, or memlock in /etc/security/limits.conf) or \
             mount as root",
            limit / 1024,
            config::VERBS_MIN_MEMLOCK >> 20
        )),
        _ => Ok(()),
    }
}

/// A user's mount needs read and write access to `/dev/fuse`, whether rmemfs opens it or
/// the setuid `fusermount3` does: libfuse's helper opens the device with the caller's own
/// file-system uid on purpose, so the device's mode is the admin's switch for who may use
/// FUSE. Where that switch is off (mode 0600, as on some machines), say so and name the ways
/// to turn it on, instead of a bare "Permission denied" from deep in the mount.
fn check_fuse_device() -> Result<(), String> {
    const DEV_FUSE: &str = "/dev/fuse";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return Ok(());
    }
    let path = std::ffi::CString::new(DEV_FUSE).expect("no NUL");
    // SAFETY: `path` is a NUL-terminated string that outlives the call.
    if unsafe { libc::access(path.as_ptr(), libc::R_OK | libc::W_OK) } == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::EACCES) {
        return Ok(()); // missing, or the like: the mount itself says what is wrong
    }
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let mode = std::fs::metadata(DEV_FUSE)
        .map(|m| {
            format!(
                "mode {:04o}, owner uid {}",
                m.permissions().mode() & 0o7777,
                m.uid()
            )
        })
        .unwrap_or_else(|_| "unreadable".into());
    Err(format!(
        "this user may not use FUSE here: {DEV_FUSE} ({mode}) does not let it read and write, \
         and fusermount3 opens it as the calling user too. An admin allows it with \
         `chmod 0666 {DEV_FUSE}` (Debian's default) or `setfacl -m u:USER:rw {DEV_FUSE}`; or \
         mount as root (with -o allow_other for other users)"
    ))
}

/// `rmemfs stats MOUNTPOINT [--json]`: reads the live counters from the mount's virtual
/// attribute (its text form, or JSON).
pub fn print_stats(mountpoint: &Path, json: bool) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| "mount point contains a NUL byte".to_string())?;
    let name = std::ffi::CString::new(if json {
        crate::fs::STATS_JSON_XATTR
    } else {
        crate::fs::STATS_XATTR
    })
    .expect("no NUL");
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: both strings are NUL-terminated and `buf` is writable for its length.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
        )
    };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!(
            "{} is not a live rmemfs mount ({e})",
            mountpoint.display()
        ));
    }
    buf.truncate(n as usize);
    print!("{}", String::from_utf8_lossy(&buf));
    Ok(())
}

/// The counters of a memory server, asked over an authenticated control session (the
/// server's secret is needed: they tell who was refused and how often). The session
/// allocates nothing and says goodbye.
pub fn server_stats_text(
    server: &str,
    secret: &crate::auth::Secret,
    timeout: Duration,
    json: bool,
) -> Result<String, String> {
    use std::fmt::Write;
    let addr = resolve_server(server)?;
    let conn = ControlConn::connect_observer(addr, "rmemfs-stats", timeout, secret)
        .map_err(|e| e.to_string())?;
    let reply = conn.request(|tag| crate::proto::Message::Stat { tag });
    conn.goodbye();
    let (capacity, extents, clients, counters) = match reply.map_err(|e| e.to_string())? {
        crate::proto::Message::Stats {
            capacity,
            extents,
            clients,
            counters,
            ..
        } => (capacity, extents, clients, counters),
        other => return Err(format!("memory server {addr} answered {other:?}")),
    };
    if json {
        let v = crate::server::stats_json(
            &addr.to_string(),
            &conn.hello.fabric,
            conn.hello.instance,
            capacity,
            clients,
            extents,
            &counters,
        );
        return Ok(format!("{v}\n"));
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "memory server {addr}: fabric {}, instance {:#x}",
        conn.hello.fabric, conn.hello.instance
    );
    let _ = writeln!(
        out,
        "  memory: {} of {} bytes free, largest free extent {}",
        capacity.free, capacity.total, capacity.largest_free
    );
    let _ = writeln!(out, "  clients {clients}, extents {extents}");
    for (name, value) in counters.fields() {
        if name == "remote accesses refused" && conn.hello.fabric == "verbs" {
            // An RDMA NIC refuses them without the server's software seeing it; the
            // client's `stats` counts them as remote access errors.
            let _ = writeln!(out, "  {name}: not seen by software on verbs");
        } else {
            let _ = writeln!(out, "  {name}: {value}");
        }
    }
    Ok(out)
}

/// Parses `-o` options into fuser's configuration; returns it and whether the mount is
/// read-only.
fn fuser_config(
    options: &[String],
    threads: usize,
) -> Result<(fuser::Config, MountChoices), String> {
    use fuser::{MountOption as O, SessionACL};
    let mut cfg = fuser::Config::default();
    let mut fsname = "rmemfs".to_string();
    let mut read_only = false;
    let mut atime = crate::fs::Atime::Relative;
    let mut dir_atime = true;
    let mut acl = true;
    let mut writeback = true;
    let mut readdirplus = true;
    // FUSE over io_uring wherever the kernel offers it (see [`allow_io_uring`]).
    let mut io_uring = true;
    let mut opts = vec![O::DefaultPermissions, O::Subtype("rmemfs".into())];
    for o in options
        .iter()
        .flat_map(|s| s.split(','))
        .filter(|s| !s.is_empty())
    {
        match o {
            "allow_other" => cfg.acl = SessionACL::All,
            "allow_root" => cfg.acl = SessionACL::RootAndOwner,
            "ro" => {
                read_only = true;
                opts.push(O::RO);
            }
            "rw" => read_only = false,
            "auto_unmount" => opts.push(O::AutoUnmount),
            "default_permissions" => {}
            "noatime" => {
                atime = crate::fs::Atime::Never;
                opts.push(O::NoAtime);
            }
            "relatime" | "atime" => atime = crate::fs::Atime::Relative,
            "strictatime" => atime = crate::fs::Atime::Strict,
            "nodiratime" => dir_atime = false,
            "acl" => acl = true,
            "noacl" => acl = false,
            "writeback_cache" => writeback = true,
            "no_writeback_cache" => writeback = false,
            // NFS's names for the same choice.
            "rdirplus" => readdirplus = true,
            "nordirplus" => readdirplus = false,
            "io_uring" => io_uring = true,
            "no_io_uring" => io_uring = false,
            "diratime" => dir_atime = true,
            // Timestamps live in the daemon's memory only: there is no disk write for
            // lazytime to put off.
            "lazytime" | "nolazytime" => {}
            "nodev" => opts.push(O::NoDev),
            "nosuid" => opts.push(O::NoSuid),
            "noexec" => opts.push(O::NoExec),
            "exec" => opts.push(O::Exec),
            "dev" => opts.push(O::Dev),
            "suid" => opts.push(O::Suid),
            o if o.starts_with("fsname=") => fsname = o["fsname=".len()..].to_string(),
            o if o.starts_with("subtype=") => {
                opts.retain(|x| !matches!(x, O::Subtype(_)));
                opts.push(O::Subtype(o["subtype=".len()..].to_string()));
            }
            other => return Err(format!("unknown mount option '{other}'")),
        }
    }
    opts.push(O::FSName(fsname));
    cfg.mount_options = opts;
    cfg.n_threads = Some(threads.max(1));
    cfg.clone_fd = threads > 1;
    Ok((
        cfg,
        MountChoices {
            read_only,
            atime,
            dir_atime,
            acl,
            writeback,
            readdirplus,
            io_uring,
        },
    ))
}

/// What the `-o` options decide beyond fuser's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MountChoices {
    read_only: bool,
    atime: crate::fs::Atime,
    dir_atime: bool,
    /// POSIX ACLs (`acl`, the default, or `noacl`).
    acl: bool,
    /// The kernel's writeback cache (`writeback_cache`, the default, or
    /// `no_writeback_cache`).
    writeback: bool,
    /// READDIRPLUS offered to the kernel (`rdirplus`, the default, or `nordirplus`).
    readdirplus: bool,
    /// Requests through FUSE over io_uring where the kernel offers it (`io_uring`, the
    /// default; `no_io_uring` for /dev/fuse).
    io_uring: bool,
}

/// Roughly the most dirty page cache this mount may hold: the machine's dirty threshold
/// (`vm.dirty_bytes`, or `vm.dirty_ratio` percent of available memory) times the mount's
/// `max_ratio` share. Free pool space under this makes new handles write through.
fn dirty_allowance() -> u64 {
    let read_u64 = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    let available = crate::size::mem_available().unwrap_or(8 << 30);
    let threshold = match read_u64("/proc/sys/vm/dirty_bytes") {
        Some(b) if b > 0 => b,
        _ => available / 100 * read_u64("/proc/sys/vm/dirty_ratio").unwrap_or(20),
    };
    let share: u64 = config::WRITEBACK_MAX_RATIO.parse().unwrap_or(100);
    threshold / 100 * share
}

/// The fuse module's switch for FUSE over io_uring (Linux 6.14+).
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Whether the kernel will offer FUSE over io_uring at INIT: its switch is on, or we turned
/// it on (root). The switch is module-wide but only permits: a FUSE file system gets rings
/// only if it asks for them at INIT, so others on the host go on through /dev/fuse. A user's
/// mount cannot write it and uses the rings only if an admin (or a root mount) turned it on.
/// Said in the log either way (and `stats` names the transport in use).
fn allow_io_uring() -> bool {
    match std::fs::read_to_string(ENABLE_URING) {
        Ok(v) if v.trim() == "Y" => true,
        Ok(_) => match std::fs::write(ENABLE_URING, "Y") {
            Ok(()) => {
                log::info!("io_uring: turned the fuse module's enable_uring on");
                true
            }
            Err(e) => {
                log::info!(
                    "io_uring: the fuse module's enable_uring is off and cannot be turned on \
                     here ({e}; as root: echo Y > {ENABLE_URING}): using /dev/fuse"
                );
                false
            }
        },
        Err(e) => {
            log::info!(
                "io_uring: this kernel has no FUSE over io_uring ({ENABLE_URING}: {e}; Linux \
                 6.14 or newer): using /dev/fuse"
            );
            false
        }
    }
}

/// The device number ("MAJOR:MINOR") of the last mount at `mountpoint`, from mountinfo: a
/// stat of the mount point would be a FUSE request to this very daemon, which may not be
/// serving yet.
fn mount_device(mountpoint: &Path) -> Option<String> {
    let target = mountpoint.to_string_lossy();
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() > 4 && unescape_mountinfo(f[4]) == target).then(|| f[2].to_string())
        })
        .next_back()
}

/// The fuse control file system's `abort` file for the FUSE connection mounted at
/// `mountpoint`: its directory is named by the kernel's device number (major << 20 | minor).
fn connection_abort_file(mountpoint: &Path) -> Option<PathBuf> {
    let dev = mount_device(mountpoint)?;
    let (major, minor) = dev.split_once(':')?;
    let id = (major.parse::<u64>().ok()? << 20) | minor.parse::<u64>().ok()?;
    Some(PathBuf::from(format!(
        "{}/{id}/abort",
        crate::fuse::FUSECTL
    )))
}

/// Buffered reads reach the daemon in pieces of the mount's readahead window (128 KiB by
/// default); each piece costs a round trip to a server. Raising it to the FUSE request limit
/// (1 MiB) lets sequential reads arrive whole. Best effort: needs root and sysfs.
fn raise_readahead(mountpoint: &Path) {
    let Some(dev) = mount_device(mountpoint) else {
        return;
    };
    // The knobs: readahead to the FUSE request limit; and the share of the machine's dirty
    // page allowance this mount may hold (FUSE mounts are held to a strict 1% by default,
    // which throttles the writeback cache long before memory is short).
    for (knob, value, what) in [
        ("read_ahead_kb", "1024", "readahead raised to 1 MiB"),
        (
            "max_ratio",
            crate::config::WRITEBACK_MAX_RATIO,
            "dirty page share raised",
        ),
    ] {
        let path = format!("/sys/class/bdi/{dev}/{knob}");
        match std::fs::write(&path, value) {
            Ok(()) => log::info!("{what} ({path} = {value})"),
            Err(e) => log::info!("could not set {path}: {e}"),
        }
    }
}

/// Mounts and serves until unmounted, over the fabric `config` names. `ready` is called once
/// the mount is live (the daemon's parent returns then); errors before that are returned as
/// text for the user.
pub fn run(config: &MountConfig, ready: &mut dyn FnMut()) -> Result<(), String> {
    Mount::new(config.clone()).run(ready)
}

/// A mount being set up: [`MountConfig`] plus, optionally, the fabrics to use instead of
/// opening the one the configuration names. Tests and benchmarks mount over the in-process
/// fabric this way (`fabrics(net.node(), net.node())`): no data crosses a network, so such a
/// mount measures rmemfs's own code plus FUSE.
pub struct Mount {
    config: MountConfig,
    /// (client side, embedded server side)
    fabrics: Option<(Arc<dyn Fabric>, Arc<dyn Fabric>)>,
    on_mounted: Option<Box<dyn FnOnce(Arc<Fs>) + Send>>,
}

impl Mount {
    pub fn new(config: MountConfig) -> Mount {
        Mount {
            config,
            fabrics: None,
            on_mounted: None,
        }
    }

    /// Uses these fabrics: `client` for the mount's queue pairs, `server` for the embedded
    /// memory server (without `--servers`).
    pub fn fabrics(mut self, client: Arc<dyn Fabric>, server: Arc<dyn Fabric>) -> Mount {
        self.fabrics = Some((client, server));
        self
    }

    /// Hands the live file system to `f` once mounted (tests read its counters).
    pub fn on_mounted(mut self, f: impl FnOnce(Arc<Fs>) + Send + 'static) -> Mount {
        self.on_mounted = Some(Box::new(f));
        self
    }

    /// Mounts and serves until unmounted (see [`run`]).
    pub fn run(self, ready: &mut dyn FnMut()) -> Result<(), String> {
        run_mount(self, ready)
    }
}

fn run_mount(mount: Mount, ready: &mut dyn FnMut()) -> Result<(), String> {
    let config = &mount.config;
    let mountpoint = check_mountpoint(&config.mountpoint)?;
    check_fuse_device()?;
    let (fuse_config, choices) = fuser_config(&config.options, config.threads)?;
    let read_only = choices.read_only;
    let fabric_options = FabricOptions {
        op_timeout: config.op_timeout,
        ..config.fabric_options.clone()
    };
    let (given_client, given_server) = match mount.fabrics {
        Some((c, s)) => (Some(c), Some(s)),
        None => (None, None),
    };
    let open_fabric = |name: &str| -> Result<Arc<dyn Fabric>, String> {
        match &given_client {
            Some(f) => Ok(f.clone()),
            None => crate::fabric::open(name, &fabric_options).map_err(|e| e.to_string()),
        }
    };
    // Bound first: a port in use fails the mount before anything is set up.
    let metrics_listener = config
        .metrics_listen
        .map(crate::metrics::MetricsServer::bind)
        .transpose()
        .map_err(|e| e.to_string())?;
    // Without --servers, an embedded memory server on loopback.
    let mut embedded = None;
    let (addrs, fabric_name): (Vec<SocketAddr>, String) = if config.servers.is_empty() {
        let fabric_name = config.fabric.clone().unwrap_or_else(|| "tcp".into());
        let size = config.size.unwrap_or_else(default_embedded_size);
        let server_fabric = match &given_server {
            Some(f) => f.clone(),
            None => crate::fabric::open(
                &fabric_name,
                &FabricOptions {
                    op_timeout: crate::config::server_op_timeout(config.op_timeout),
                    ..fabric_options.clone()
                },
            )
            .map_err(|e| e.to_string())?,
        };
        let server = MemoryServer::start(
            &ServerConfig {
                client_op_timeout: config.op_timeout,
                secret: config.secret.clone(),
                ..ServerConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)), size)
            },
            server_fabric,
        )
        .map_err(|e| format!("cannot start the embedded memory server: {e}"))?;
        log::info!(
            "embedded memory server on {} ({}, {fabric_name} fabric)",
            server.local_addr(),
            format_size(size)
        );
        let addr = server.local_addr();
        embedded = Some(server);
        (vec![addr], fabric_name)
    } else {
        let addrs: Vec<SocketAddr> = config
            .servers
            .iter()
            .map(|s| resolve_server(s))
            .collect::<Result<_, _>>()?;
        let fabric_name = match &config.fabric {
            Some(name) => name.clone(),
            // The first server's hello names its fabric; every server must match it.
            None => ControlConn::connect(
                addrs[0],
                "rmemfs-mount (probe)",
                config.op_timeout,
                &config.secret,
            )
            .map_err(|e| e.to_string())?
            .hello
            .fabric
            .clone(),
        };
        (addrs, fabric_name)
    };
    let replicas = config.replicas_for(addrs.len());
    if replicas > addrs.len() {
        return Err(format!(
            "--replicas {replicas} needs at least {replicas} memory servers ({} given)",
            addrs.len()
        ));
    }
    if fabric_name == "verbs" {
        check_verbs_memlock()?;
    }
    let fabric = open_fabric(&fabric_name)?;
    let pool = Pool::connect(
        fabric,
        &addrs,
        &PoolConfig {
            client_name: format!("rmemfs-mount@{}", mountpoint.display()),
            timeout: config.op_timeout,
            secret: config.secret.clone(),
            busy_poll: config.busy_poll,
        },
    )
    .map_err(|e| e.to_string())?;
    let cache = CacheConfig {
        capacity_pages: config
            .reg_cache_size
            .unwrap_or_else(|| default_cache_bytes(fabric_name == "verbs"))
            / page_size() as u64,
        ..CacheConfig::default()
    };
    let data = DataStore::new(
        Arc::new(pool),
        config.chunk_size,
        config.threads * crate::config::READ_BUFFERS_PER_THREAD,
        config.reg_cache,
        cache,
        config.write_path,
    )
    .and_then(|d| d.replicated(replicas, config.min_replicas))
    .map_err(|e| e.message)?;
    // SAFETY: geteuid/getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let fs = Arc::new(Fs::new(
        data,
        FsConfig {
            root_uid: uid,
            root_gid: gid,
            read_only,
            atime: choices.atime,
            dir_atime: choices.dir_atime,
            acl: choices.acl,
            writeback: choices.writeback,
            writeback_low_water: config.writeback_low_water.unwrap_or_else(dirty_allowance),
        },
    ));
    let fuse_fs = FuseFs::new(
        fs.clone(),
        crate::fuse::Offers {
            readdirplus: choices.readdirplus,
            io_uring: choices.io_uring && allow_io_uring(),
        },
    );
    let connection = fuse_fs.connection();
    let mut session = fuser::Session::new(fuse_fs, &mountpoint, &fuse_config)
        .map_err(|e| format!("cannot mount on {}: {e}", mountpoint.display()))?;
    if let Some(abort) = connection_abort_file(&mountpoint) {
        let _ = connection.set(abort);
    }
    FuseFs::forward_invalidations(&fs, &session);
    crate::report::attach(&fs);

    let rebuilder = crate::rebuild::Rebuilder::start(
        fs.clone(),
        crate::rebuild::Upkeep {
            rate: config.rebuild_rate,
            delay: config.rebuild_delay,
            detection: config.op_timeout,
        },
    )
    .map_err(|e| format!("cannot start the rebuild thread: {e}"))?;
    raise_readahead(&mountpoint);
    // The kernel's dirty data for the mount kept below the pool's room (root: the bdi's
    // max_bytes, Linux 6.2+; after raise_readahead, whose max_ratio is the same setting),
    // so the writeback cache can stay on until the pool is nearly full. An explicit
    // --writeback-low-water keeps its rule instead.
    if config.writeback_low_water.is_none() {
        let bdi = mount_device(&mountpoint)
            .map(|dev| PathBuf::from(format!("/sys/class/bdi/{dev}/max_bytes")));
        fs.keep_dirty_limit(crate::dirty_limit::DirtyLimit::new(bdi, dirty_allowance()));
    }
    let metrics = metrics_listener
        .map(|listener| {
            let (a, b, c) = (fs.clone(), fs.clone(), fs.clone());
            let collector = crate::metrics::MountCollector {
                report: Arc::new(move || crate::report::MountReport::gather(&a)),
                requests: Arc::new(move || b.figures().requests.summary()),
                batches: Arc::new(move || c.data().pool().batch_latency()),
            };
            crate::metrics::serve(listener, Box::new(collector))
        })
        .transpose()?;
    if let Some(f) = mount.on_mounted {
        f(fs.clone());
    }

    // SIGINT/SIGTERM unmount; the session then ends as with `umount`. An unmount refused
    // (files open: EBUSY) leaves the mount serving; a second signal then detaches it (lazy
    // unmount) and ends the process at once: open files see ENOTCONN, nothing waits on them.
    let mut unmounter = session.unmount_callable();
    let detach_at = mountpoint.clone();
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let signal_handle = signals.handle();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut signals = signals.forever();
            if let Some(sig) = signals.next() {
                log::info!("signal {sig}: unmounting");
                if let Err(e) = unmounter.unmount() {
                    log::error!(
                        "unmount failed: {e}; a second SIGTERM or SIGINT detaches the mount \
                         and exits"
                    );
                }
            }
            if let Some(sig) = signals.next() {
                log::warn!("signal {sig} again: detaching the mount and exiting");
                if let Err(e) = lazy_unmount(&detach_at) {
                    log::error!("detaching {} failed: {e}", detach_at.display());
                }
                std::process::exit(1);
            }
        })
        .map_err(|e| e.to_string())?;

    ready();
    let result = session.run();
    signal_handle.close();
    log::info!(
        "unmounted {}; returning remote memory. Counters at unmount:\n{}",
        mountpoint.display(),
        crate::report::mount_text(&fs)
    );
    drop(metrics);
    drop(rebuilder);
    drop(fs);
    drop(embedded);
    result.map_err(|e| format!("FUSE session failed: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_addresses_get_the_default_port() {
        assert_eq!(
            resolve_server("127.0.0.1").unwrap(),
            SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT))
        );
        assert_eq!(
            resolve_server("127.0.0.1:9").unwrap(),
            SocketAddr::from(([127, 0, 0, 1], 9))
        );
        assert_eq!(resolve_server("::1").unwrap().port(), DEFAULT_PORT);
        assert_eq!(resolve_server("[::1]:10").unwrap().port(), 10);
        assert!(resolve_server("localhost").is_ok());
        assert!(resolve_server("no.such.host.invalid").is_err());
    }

    #[test]
    fn bad_mount_points_are_named() {
        let e = check_mountpoint(Path::new("/no/such/dir")).unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
        let e = check_mountpoint(Path::new("/etc/hostname")).unwrap_err();
        assert!(e.contains("not a directory"), "{e}");
        let e = check_mountpoint(Path::new("/proc")).unwrap_err();
        assert!(e.contains("already a mount point"), "{e}");
        assert_eq!(unescape_mountinfo("/a\\040b"), "/a b");
    }

    #[test]
    fn mount_options_parse() {
        let (cfg, choices) =
            fuser_config(&["allow_other,ro".into(), "fsname=pool".into()], 4).unwrap();
        assert!(choices.read_only);
        assert_eq!(choices.atime, crate::fs::Atime::Relative);
        let (_, c) = fuser_config(&["strictatime,nodiratime,lazytime".into()], 1).unwrap();
        assert_eq!((c.atime, c.dir_atime), (crate::fs::Atime::Strict, false));
        let (_, c) = fuser_config(&["noatime".into()], 1).unwrap();
        assert_eq!(c.atime, crate::fs::Atime::Never);
        assert!(c.readdirplus);
        let (_, c) = fuser_config(&["nordirplus".into()], 1).unwrap();
        assert!(!c.readdirplus);
        assert!(c.io_uring, "FUSE over io_uring by default");
        let (_, c) = fuser_config(&["no_io_uring".into()], 1).unwrap();
        assert!(!c.io_uring);
        let (_, c) = fuser_config(&["no_io_uring,io_uring".into()], 1).unwrap();
        assert!(c.io_uring);
        let (_, c) = fuser_config(&["io_uring,no_io_uring".into()], 1).unwrap();
        assert!(!c.io_uring);
        assert_eq!(cfg.n_threads, Some(4));
        assert!(cfg
            .mount_options
            .contains(&fuser::MountOption::FSName("pool".into())));
        assert!(fuser_config(&["bogus".into()], 1).is_err());
    }
}
