//! The mount point: checks before mounting (a dead rmemfs mount detached, a live one
//! refused), the FUSE device and memlock checks, and the settings of the mounted bdi
//! (readahead, the connection's abort file).

use super::*;

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
pub(super) fn canonical_mountpoint(path: &Path) -> Result<PathBuf, String> {
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
pub(super) fn mounted_at(target: &Path) -> Option<String> {
    super::mountinfo::topmost_now(target, |m| m.fstype.to_string())
}

/// How long a stat of a mounted rmemfs may take before its daemon counts as alive but stuck
/// (not dead): a live daemon answers a GETATTR in microseconds; a frozen one never does.
pub(super) const STAT_PATIENCE: Duration = Duration::from_secs(2);

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

/// True if a stat of `mountpoint` answers ENOTCONN, or ECONNABORTED: the FUSE connection is
/// gone. (A request that was waiting when the kernel tore the connection down, as it does
/// after the daemon's death once its io_uring queues are cancelled, is ended with
/// ECONNABORTED; later ones get ENOTCONN.) Asked on a thread so a frozen daemon (no answer)
/// counts as alive instead of hanging the caller.
pub(super) fn daemon_gone(mountpoint: &Path) -> bool {
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
    asked.is_ok()
        && matches!(
            rx.recv_timeout(STAT_PATIENCE),
            Ok(Some(libc::ENOTCONN | libc::ECONNABORTED))
        )
}

/// Detaches the mount at `mountpoint` (MNT_DETACH): directly as root, else through
/// `fusermount3 -u -z`, which lets a user detach a FUSE mount of their own.
pub fn lazy_unmount(mountpoint: &Path) -> Result<(), String> {
    unmount(mountpoint, true)
}

/// Unmounts `mountpoint` (detaches it if `lazy`): directly as root, else through
/// `fusermount3 -u`, which lets a user unmount a FUSE mount of their own.
pub(super) fn unmount(mountpoint: &Path, lazy: bool) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| "a NUL byte in the path".to_string())?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        return Ok(());
    }
    let direct = std::io::Error::last_os_error();
    if direct.raw_os_error() != Some(libc::EPERM) {
        return Err(direct.to_string());
    }
    let args: &[&str] = if lazy {
        &["-u", "-z", "--"]
    } else {
        &["-u", "--"]
    };
    let out = std::process::Command::new("fusermount3")
        .args(args)
        .arg(mountpoint)
        .output()
        .map_err(|e| format!("{direct}; fusermount3: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "fusermount3 {}: {}",
            args[..args.len() - 1].join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Refuses a verbs mount at once when the memlock limit is below
/// [`config::VERBS_MIN_MEMLOCK`]: every verbs buffer is pinned, so such a mount would fail
/// its writes later instead.
pub(super) fn check_verbs_memlock() -> Result<(), String> {
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
pub(super) fn check_fuse_device() -> Result<(), String> {
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

/// The device number ("MAJOR:MINOR") of the last mount at `mountpoint`, from mountinfo: a
/// stat of the mount point would be a FUSE request to this very daemon, which may not be
/// serving yet.
pub(super) fn mount_device(mountpoint: &Path) -> Option<String> {
    super::mountinfo::topmost_now(mountpoint, |m| m.device.to_string())
}

/// The fuse control file system's `abort` file for the FUSE connection mounted at
/// `mountpoint`: its directory is named by the kernel's device number (major << 20 | minor).
pub(super) fn connection_abort_file(mountpoint: &Path) -> Option<PathBuf> {
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
pub(super) fn raise_readahead(mountpoint: &Path) {
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
