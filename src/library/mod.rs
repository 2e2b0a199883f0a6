//! rmemfs inside a program: a volume opened without FUSE (doc/LIBRARY.md).
//!
//! Why: a mount costs every read a FUSE round trip (about 18 µs here) on top of the fabric's,
//! and a program cannot put many reads on the wire at once through it. A [`Volume`] is the
//! same file system a mount serves (the same journal, records, fencing and upkeep threads,
//! built by `mount::build`), called directly: paths and handles, and [`Volume::read_many`],
//! a batch of reads sent together.
//!
//! Two modes, as a mount's: [`Mode::Follow`] is a follower (read-only at the servers, the
//! journal followed, any number beside the holder) and [`Mode::Hold`] the volume's one
//! writer, fenced as a holder mount is. Paths are resolved component by component from the
//! volume's root; symlinks are not followed (a path through one is ENOTDIR, a symlink opened
//! is ELOOP). Calls act as the process's user and group, as a mount's callers do.
//!
//! Fork: the volume's threads (heartbeats, the follower, the fabric's) do not survive a
//! fork, so a child's calls fail with EBADF saying to open the volume again in the child;
//! the parent goes on.

mod files;
mod names;

use crate::auth::Secret;
use crate::error::{Error, Result};
use crate::fs::{Caller, Fs};
use crate::meta::Ino;
use crate::mount::build::{build_fs, fabric_options, reach_servers, upkeep, Following, Servers};
use crate::mount::{MountConfig, Namespace};
use crate::sync::Mutex;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

pub use files::ReadRequest;

/// How a program opens a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Read-only beside the holder (or with none): the holder's commits are seen within a
    /// poll; nothing is written to the servers.
    Follow,
    /// The volume's one writer: refused while another holder lives (a mount or a program),
    /// as a second holder mount is.
    Hold,
}

/// What [`Volume::open`] needs: the servers, the volume, the secret and the mode.
#[derive(Debug, Clone)]
pub struct VolumeOptions {
    /// `host[:port]` of each memory server.
    pub servers: Vec<String>,
    pub name: String,
    /// The servers' shared secret file (`rmemfs keygen`); none: no secret.
    pub secret_file: Option<PathBuf>,
    pub mode: Mode,
    /// Make the volume if it does not exist (holders only).
    pub create: bool,
}

/// An open volume. Dropping it commits what the holder changed and lets the servers go.
pub struct Volume {
    fs: Arc<Fs>,
    journal: Option<Arc<crate::volume::VolumeJournal>>,
    /// Handles open on the volume: the inode each names, with the lookups that keep its
    /// path's inodes known, and the position of `read` and `write`.
    handles: Mutex<HashMap<u64, files::Handle>>,
    caller: Caller,
    /// The process that opened the volume (see the module doc on fork).
    pid: u32,
    /// Stopped first at close, before the journal's last commit (as a mount stops its
    /// upkeep before it).
    rebuilder: Option<crate::upkeep::rebuild::Rebuilder>,
    _following: Option<Following>,
    _servers: Servers,
}

/// Opens volume `options.name` on `options.servers` as `options.mode` says.
pub fn open_volume(options: &VolumeOptions) -> Result<Volume> {
    Volume::attach(options)
}

impl Volume {
    fn attach(options: &VolumeOptions) -> Result<Volume> {
        let fail = |e: String| Error::new(libc::EIO, e);
        if options.servers.is_empty() {
            return Err(Error::new(
                libc::EINVAL,
                "a volume lives on memory servers: name at least one".to_string(),
            ));
        }
        if options.create && options.mode == Mode::Follow {
            return Err(Error::new(
                libc::EINVAL,
                "a follower cannot make a volume: open it to hold with create".to_string(),
            ));
        }
        let mut config = MountConfig::new(PathBuf::from(format!("library:{}", options.name)));
        config.servers = options.servers.clone();
        config.secret = Secret::from_option(options.secret_file.as_deref())
            .map_err(|e| Error::new(libc::EACCES, e))?;
        config.namespace = match options.mode {
            Mode::Follow => Namespace::Follower {
                name: options.name.clone(),
            },
            Mode::Hold => Namespace::Held {
                name: options.name.clone(),
                create: options.create,
                takeover: false,
                force_without: Vec::new(),
            },
        };
        let fabric_options = fabric_options(&config);
        let servers = reach_servers(&config, &fabric_options, None)
            .map_err(|e| Error::new(open_errno(&e), e))?;
        let fabric = crate::fabric::open(&servers.fabric_name, &fabric_options)
            .map_err(|e| fail(e.to_string()))?;
        let choices = crate::mount::library_choices(options.mode == Mode::Follow);
        let label = PathBuf::from(format!("library pid {}", std::process::id()));
        let built = build_fs(&config, &label, &servers, fabric, &choices, false)
            .map_err(|e| Error::new(open_errno(&e), e))?;
        let rebuilder = crate::upkeep::rebuild::Rebuilder::start(
            built.fs.clone(),
            upkeep(&config),
            Default::default(),
        )
        .map_err(|e| fail(format!("cannot start the upkeep threads: {e}")))?;
        // SAFETY: geteuid/getegid have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Ok(Volume {
            fs: built.fs,
            journal: built.journal,
            handles: Mutex::new(HashMap::new()),
            caller: Caller {
                uid,
                gid,
                pid: std::process::id(),
                umask: 0o022,
                cap_fsetid: uid == 0,
            },
            pid: std::process::id(),
            rebuilder: Some(rebuilder),
            _following: built.follower,
            _servers: servers,
        })
    }

    /// The file system under the volume (tests, and what the library does not wrap).
    pub fn fs(&self) -> &Arc<Fs> {
        &self.fs
    }

    /// Errors in a forked child (see the module doc).
    fn here(&self) -> Result<()> {
        match std::process::id() == self.pid {
            true => Ok(()),
            false => Err(Error::new(
                libc::EBADF,
                format!(
                    "this volume was opened by process {}; its threads do not survive a fork: \
                     open the volume again in the child",
                    self.pid
                ),
            )),
        }
    }

    /// Commits every change made so far to the volume's journal (a holder; a follower has
    /// none to commit).
    pub fn sync(&self) -> Result<()> {
        self.here()?;
        self.fs.sync().unwrap_or(Ok(()))
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            return;
        }
        let fhs: Vec<u64> = self.handles.lock().keys().copied().collect();
        for fh in fhs {
            let _ = self.close(fh);
        }
        drop(self.rebuilder.take());
        if let Some(j) = &self.journal {
            if let Err(e) = j.stop() {
                log::error!("the volume's last commit failed: {}", e.message);
            }
        }
    }
}

/// The errno for a volume the servers would not open, from what they said (the mount's
/// words: the builder's refusals are text for a user).
fn open_errno(refusal: &str) -> i32 {
    if refusal.contains("is held by") || refusal.contains("writers attached") {
        libc::EBUSY
    } else if refusal.contains("no volume '") {
        libc::ENOENT
    } else if refusal.contains("exists already") {
        libc::EEXIST
    } else if refusal.contains("secret") {
        libc::EACCES
    } else {
        libc::EIO
    }
}

/// Inodes looked up on the way to a path, forgotten when done (as the kernel forgets what it
/// looked up).
struct Looked<'v> {
    fs: &'v Fs,
    inos: Vec<Ino>,
}

impl Looked<'_> {
    /// The inode the path ends at.
    fn ino(&self) -> Ino {
        self.inos.last().copied().unwrap_or(crate::meta::ROOT_INO)
    }
}

impl Drop for Looked<'_> {
    fn drop(&mut self) {
        for ino in self.inos.drain(..) {
            self.fs.forget(ino, 1);
        }
    }
}

/// A path's components, `.` and empty ones dropped; `..` refused (paths are from the root).
fn components(path: &str) -> Result<Vec<&[u8]>> {
    let parts: Vec<&[u8]> = path
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .map(str::as_bytes)
        .collect();
    if parts.iter().any(|p| *p == b"..") {
        return Err(Error::new(
            libc::EINVAL,
            format!("{path}: paths are from the volume's root, without '..'"),
        ));
    }
    Ok(parts)
}

impl Volume {
    /// Looks up every component of `parts` from the root.
    fn walk(&self, parts: &[&[u8]]) -> Result<Looked<'_>> {
        let mut looked = Looked {
            fs: &self.fs,
            inos: Vec::with_capacity(parts.len()),
        };
        for part in parts {
            let attr = self.fs.lookup(looked.ino(), part)?;
            looked.inos.push(attr.ino);
        }
        Ok(looked)
    }

    /// The inode `path` names.
    fn resolve(&self, path: &str) -> Result<Looked<'_>> {
        self.here()?;
        self.walk(&components(path)?)
    }

    /// The directory holding `path`'s last component, and that component.
    fn parent<'p>(&self, path: &'p str) -> Result<(Looked<'_>, &'p [u8])> {
        self.here()?;
        let parts = components(path)?;
        let Some((last, dirs)) = parts.split_last() else {
            return Err(Error::new(
                libc::EINVAL,
                format!("{path}: names the root, not an entry in it"),
            ));
        };
        Ok((self.walk(dirs)?, last))
    }
}
