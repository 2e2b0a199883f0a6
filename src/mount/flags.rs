//! The mount's access-time flags as the kernel keeps them. A FUSE file system decides access
//! times itself (the kernel marks its inodes S_NOATIME), and the kernel never tells it when
//! `mount -o remount,noatime` (or `strictatime`, `relatime`, `nodiratime`) changes the
//! mount's flags. So the flags are read where the kernel keeps them, the mount's line in
//! `/proc/self/mountinfo`: once the mount is up, and again whenever this namespace's mount
//! table changes (poll(2) on that file wakes on every mount, unmount and remount), never by a
//! request to the mount itself (which would wait on this daemon). What they say goes to the
//! namespace's one access-time rule ([`Fs::set_access_times`]).

use super::mountinfo;
use crate::fs::{Atime, Fs};
use std::io::{Read, Seek};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;

const MOUNTINFO: &str = mountinfo::PATH;

/// The thread that follows the mount's flags; dropping it stops the thread.
pub(super) struct FlagWatch {
    /// Closed on drop: the thread's end then reads end of file and the thread returns.
    stop: Option<UnixStream>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FlagWatch {
    /// Finds the mount at `mountpoint` (the newest FUSE mount there) and follows its flags
    /// from then on. A connection `taken_over` from an earlier daemon takes them at once (a
    /// remount may have changed them since its options were given); a mount this daemon
    /// made keeps its options' rule until they change, since a mount through fusermount3
    /// cannot carry relatime, strictatime or nodiratime. None (said in the log) if the mount
    /// cannot be found: the rule then stays as the options set it.
    pub(super) fn start(fs: Arc<Fs>, mountpoint: &Path, taken_over: bool) -> Option<FlagWatch> {
        if !fs.follows_mount_flags() {
            return None; // a namespace that keeps no access times has nothing to follow
        }
        // As the kernel lists it: the parent resolved (a symbolic link in the path), never
        // the mount point itself, which may be a mount nobody serves yet.
        let point = match (mountpoint.parent(), mountpoint.file_name()) {
            (Some(p), Some(n)) => std::fs::canonicalize(p).map_or(mountpoint.into(), |p| p.join(n)),
            _ => mountpoint.to_path_buf(),
        };
        let started = (|| {
            let mut file = std::fs::File::open(MOUNTINFO)?;
            let text = read_all(&mut file)?;
            let not_found =
                || std::io::Error::other(format!("no FUSE mount at {}", point.display()));
            let id = find_mount(&text, &point).ok_or_else(not_found)?;
            let first = access_flags(&text, id).ok_or_else(not_found)?;
            let options = fs.access_times();
            if first != options {
                if taken_over {
                    fs.set_access_times(first.0, first.1);
                    log::info!(
                        "access times follow the mount's flags: {}",
                        rule_name(first)
                    );
                } else {
                    log::info!(
                        "the mount's flags say {}; the options' {} holds until a remount",
                        rule_name(first),
                        rule_name(options)
                    );
                }
            }
            let (stop, wake) = UnixStream::pair()?;
            let thread = std::thread::Builder::new()
                .name("mount-flags".into())
                .spawn(move || watch(&fs, file, wake, id, first))?;
            Ok::<_, std::io::Error>(FlagWatch {
                stop: Some(stop),
                thread: Some(thread),
            })
        })();
        started
            .inspect_err(|e| {
                log::warn!("access times will not follow a remount: reading {MOUNTINFO}: {e}")
            })
            .ok()
    }
}

impl Drop for FlagWatch {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The watching thread: waits for a change of the mount table (or the stop), then reads the
/// mount's flags again and, if they changed since `last`, makes them the rule; returns when
/// the mount is gone or the watch is dropped.
fn watch(fs: &Fs, mut file: std::fs::File, wake: UnixStream, id: u64, mut last: Flags) {
    loop {
        let mut fds = [
            libc::pollfd {
                fd: file.as_raw_fd(),
                events: libc::POLLPRI,
                revents: 0,
            },
            libc::pollfd {
                fd: wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfd for the length given, and both
        // descriptors stay open for the call (owned by `file` and `wake`).
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            log::warn!("access times stop following remounts: poll {MOUNTINFO} failed");
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        let flags = match read_all(&mut file) {
            Ok(text) => match access_flags(&text, id) {
                Some(f) => f,
                None => return, // unmounted
            },
            Err(e) => {
                log::warn!("access times stop following remounts: reading {MOUNTINFO}: {e}");
                return;
            }
        };
        if flags != last {
            fs.set_access_times(flags.0, flags.1);
            log::info!(
                "access times now follow the mount's flags: {}",
                rule_name(flags)
            );
        }
        last = flags;
    }
}

/// A file rule and whether directory reads count too.
type Flags = (Atime, bool);

fn rule_name((atime, dirs): Flags) -> String {
    crate::fs::access_flags_name(atime, dirs)
}

fn read_all(file: &mut std::fs::File) -> std::io::Result<String> {
    file.rewind()?;
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    Ok(text)
}

/// The mount ID of the newest FUSE mount at `mountpoint` (the table lists mounts in the
/// order they were made, so a mount over another comes after it).
fn find_mount(mountinfo: &str, mountpoint: &Path) -> Option<u64> {
    let fuse = |t: &str| t == "fuse" || t.starts_with("fuse.");
    mountinfo::topmost(mountinfo, mountpoint, |m| fuse(m.fstype).then_some(m.id)).flatten()
}

/// Mount `id`'s access-time rule and whether directory reads count, from its per-mount
/// options: `noatime`, else `relatime`, else (neither shown) `strictatime`; `nodiratime`.
fn access_flags(mountinfo: &str, id: u64) -> Option<Flags> {
    let m = mountinfo::mounts(mountinfo).find(|m| m.id == id)?;
    let atime = if m.has("noatime") {
        Atime::Never
    } else if m.has("relatime") {
        Atime::Relative
    } else {
        Atime::Strict
    };
    Some((atime, !m.has("nodiratime")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
41 22 0:40 / /mnt/my\\040pool rw,nosuid,nodev,relatime shared:20 - fuse.rmemfs rmemfs rw,user_id=0
42 22 0:41 / /mnt/other rw,noatime - tmpfs tmpfs rw
43 41 0:42 / /mnt/my\\040pool rw,nosuid,nodev,noatime,nodiratime shared:21 - fuse.rmemfs rmemfs rw
44 22 0:43 / /mnt/strict rw,nosuid - fuse.rmemfs rmemfs rw
45 22 0:44 / /mnt/under rw,relatime - fuse.rmemfs rmemfs rw
46 45 0:45 / /mnt/under rw,relatime - tmpfs tmpfs rw
";

    #[test]
    fn the_newest_fuse_mount_at_the_point_is_found_and_its_flags_read() {
        let id = find_mount(TABLE, Path::new("/mnt/my pool")).unwrap();
        assert_eq!(id, 43, "the mount over the first one");
        assert_eq!(
            find_mount(TABLE, Path::new("/mnt/under")),
            None,
            "under a tmpfs"
        );
        assert_eq!(access_flags(TABLE, id), Some((Atime::Never, false)));
        assert_eq!(access_flags(TABLE, 41), Some((Atime::Relative, true)));
        assert_eq!(access_flags(TABLE, 44), Some((Atime::Strict, true)));
        assert_eq!(find_mount(TABLE, Path::new("/mnt/other")), None, "not FUSE");
        assert_eq!(access_flags(TABLE, 99), None, "unmounted");
    }
}
