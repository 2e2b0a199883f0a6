//! The mount's choices: `-o` options parsed into fuser's configuration and what the core
//! takes from them, and the defaults sized from the machine (embedded server, registration
//! cache, dirty allowance, FUSE over io_uring).

use super::*;

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

/// A default embedded arena: a quarter of the memory available now, between 64 MiB and 8 GiB
/// (1 GiB when that cannot be read). Pages cost RAM only when files use them.
pub fn default_embedded_size() -> u64 {
    match crate::size::mem_available() {
        Some(b) => (b / 4).clamp(config::EMBEDDED_MIN_BYTES, config::EMBEDDED_MAX_BYTES),
        None => 1 << 30,
    }
}

/// The registration cache's size unless `--reg-cache-size` says: at most
/// [`config::REG_CACHE_MAX_BYTES`]; on verbs, whose registrations must pin, also what the
/// memlock limit leaves past [`config::REG_CACHE_MEMLOCK_HEADROOM`]. A software fabric
/// registers unpinned what the limit refuses, so its cache is not held to the limit.
pub(super) fn default_cache_bytes(pins_for_real: bool) -> u64 {
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

/// Parses `-o` options into fuser's configuration; returns it and whether the mount is
/// read-only.
pub(super) fn fuser_config(
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
    let mut write_behind = None;
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
            // The kernel's mount flags carry the choice: they are what the daemon follows
            // (`mount::flags`), and a remount changes them.
            "noatime" | "relatime" | "atime" | "strictatime" => {
                opts.retain(|x| !matches!(x, O::NoAtime | O::RelAtime | O::StrictAtime));
                let (rule, flag) = match o {
                    "noatime" => (crate::fs::Atime::Never, O::NoAtime),
                    "strictatime" => (crate::fs::Atime::Strict, O::StrictAtime),
                    _ => (crate::fs::Atime::Relative, O::RelAtime),
                };
                atime = rule;
                opts.push(flag);
            }
            "nodiratime" => {
                dir_atime = false;
                opts.push(O::NoDirAtime);
            }
            "acl" => acl = true,
            "noacl" => acl = false,
            "writeback_cache" => writeback = true,
            "no_writeback_cache" => writeback = false,
            // NFS's names for the same choice.
            "rdirplus" => readdirplus = true,
            "nordirplus" => readdirplus = false,
            "write_behind" => write_behind = Some(true),
            "no_write_behind" => write_behind = Some(false),
            "io_uring" => io_uring = true,
            "no_io_uring" => io_uring = false,
            "diratime" => {
                dir_atime = true;
                opts.retain(|x| *x != O::NoDirAtime);
            }
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
            write_behind,
        },
    ))
}

/// What the `-o` options decide beyond fuser's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MountChoices {
    pub(super) read_only: bool,
    pub(super) atime: crate::fs::Atime,
    pub(super) dir_atime: bool,
    /// POSIX ACLs (`acl`, the default, or `noacl`).
    pub(super) acl: bool,
    /// The kernel's writeback cache (`writeback_cache`, the default, or
    /// `no_writeback_cache`).
    pub(super) writeback: bool,
    /// READDIRPLUS offered to the kernel (`rdirplus`, the default, or `nordirplus`).
    pub(super) readdirplus: bool,
    /// Requests through FUSE over io_uring where the kernel offers it (`io_uring`, the
    /// default; `no_io_uring` for /dev/fuse).
    pub(super) io_uring: bool,
    /// Small writes answered before their bytes are remote (`write_behind` or
    /// `no_write_behind`; see `data::behind`); unsaid (None), on for a private mount and a
    /// volume's holder, off for a shared volume's client (`mount::build`).
    pub(super) write_behind: Option<bool>,
}

/// What a program's volume (`crate::library`) takes of a mount's choices: no kernel in
/// between (no writeback cache, no readdirplus, no io_uring), reads that change no access
/// time (a follower could not write one; a holder's reader is a program, not a path),
/// ACLs checked, writes behind as on a holder mount.
pub(crate) fn library_choices(read_only: bool) -> MountChoices {
    MountChoices {
        read_only,
        atime: crate::fs::Atime::Never,
        dir_atime: false,
        acl: true,
        writeback: false,
        readdirplus: false,
        io_uring: false,
        write_behind: None,
    }
}

/// Roughly the most dirty page cache this mount may hold: the machine's dirty threshold
/// (`vm.dirty_bytes`, or `vm.dirty_ratio` percent of available memory) times the mount's
/// `max_ratio` share. Free pool space under this makes new handles write through.
pub(super) fn dirty_allowance() -> u64 {
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
pub(super) fn allow_io_uring() -> bool {
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
