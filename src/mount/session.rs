//! The FUSE session of a mount: made by mounting, or taken over from a kept connection
//! (`keeper`), and served until it is unmounted.

use super::keeper::{self, Inherited, KeptState};
use super::options::{allow_io_uring, MountChoices};
use super::point::{connection_abort_file, lazy_unmount};
use crate::fs::Fs;
use crate::fuse::FuseFs;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;

/// What the mount does with its FUSE connection beyond serving it.
pub(super) enum Connection {
    /// Mounted here; ends with this daemon.
    Own,
    /// Mounted here and handed to a keeper, so that the next daemon takes it over.
    Keep,
    /// An earlier daemon's, taken over.
    TakeOver(Inherited),
}

/// Mounts `fs` at `mountpoint` (or takes over a kept connection): the FUSE session, with
/// the connection's abort file known to the adapter (a failed ring ends the connection) and
/// invalidations forwarded.
pub(super) fn attach_fuse(
    parts: &crate::report::Parts,
    mountpoint: &Path,
    fuse_config: &fuser::Config,
    choices: &MountChoices,
    connection: Connection,
) -> Result<fuser::Session<FuseFs>, String> {
    let fs = &parts.fs;
    let keeps = !matches!(connection, Connection::Own);
    let mut fuse_config = fuse_config.clone();
    if keeps {
        // Requests a daemon has read wait in the read descriptor's queue. A cloned
        // descriptor's queue is ended (ECONNABORTED) when the daemon that cloned it dies; the
        // kept descriptor's survives it, so the next daemon can have them sent again. And an
        // io_uring queue dies with the daemon that registered it.
        fuse_config.clone_fd = false;
        log::info!(
            "the connection is kept across daemons: requests come through the kept /dev/fuse \
             descriptor"
        );
    }
    let fuse_config = &fuse_config;
    let fuse_fs = FuseFs::new(
        fs.clone(),
        crate::fuse::Offers {
            readdirplus: choices.readdirplus,
            io_uring: choices.io_uring && !keeps && allow_io_uring(),
        },
        parts.adapter.clone(),
        parts.source(),
    );
    let connection_file = fuse_fs.connection();
    let session = match connection {
        Connection::TakeOver(inherited) => take_over(fs, fuse_fs, fuse_config, inherited)?,
        own_or_keep => {
            let session = mount(fuse_fs, mountpoint, fuse_config)?;
            if let Connection::Keep = own_or_keep {
                hand_to_keeper(&session)?;
            }
            session
        }
    };
    if let Some(abort) = connection_abort_file(mountpoint) {
        let _ = connection_file.set(abort);
    }
    FuseFs::forward_invalidations(fs, &session);
    Ok(session)
}

fn mount(
    fuse_fs: FuseFs,
    mountpoint: &Path,
    fuse_config: &fuser::Config,
) -> Result<fuser::Session<FuseFs>, String> {
    fuser::Session::new(fuse_fs, mountpoint, fuse_config)
        .map_err(|e| format!("cannot mount on {}: {e}", mountpoint.display()))
}

/// Gives the keeper the new connection and its state (the first daemon: incarnation 0,
/// generation 0 for every inode, as on a connection that is not kept).
fn hand_to_keeper(session: &fuser::Session<FuseFs>) -> Result<(), String> {
    let (_, minor) = session
        .proto_version()
        .ok_or("the FUSE connection was not initialized")?;
    let state = KeptState::create(minor)
        .and_then(|mut s| s.record_incarnation(0, 0).map(|()| s))
        .map_err(|e| format!("cannot make the kept connection's state: {e}"))?;
    keeper::store(session.as_fd(), &state)?;
    log::info!("the FUSE connection is kept: a daemon that dies is replaced without unmounting");
    Ok(())
}

/// Takes over a kept connection: this daemon's incarnation recorded (before any request is
/// served) with the first inode number it issues, handles and inodes of earlier daemons
/// taken on, and what the dead daemon read but never answered queued again.
fn take_over(
    fs: &Arc<Fs>,
    fuse_fs: FuseFs,
    fuse_config: &fuser::Config,
    inherited: Inherited,
) -> Result<fuser::Session<FuseFs>, String> {
    let Inherited { fuse, mut state } = inherited;
    let before = state.read()?;
    let incarnation = before.next_incarnation();
    let first = fs.inspect_meta(|m| m.next_ino());
    state
        .record_incarnation(incarnation, first)
        .map_err(|e| format!("cannot record this daemon in the kept state: {e}"))?;
    let record = state.read()?;
    fs.take_over_connection(incarnation);
    let fuse_fs = fuse_fs.with_generations(Box::new(move |ino| record.generation(ino)));
    fuse_fs.resumed_on_dev_fuse();
    let session = fuser::Session::resume_fd(
        fuse_fs,
        fuse,
        fuse_config.acl,
        fuse_config.clone(),
        before.proto_minor,
    );
    match session.notifier().resend() {
        Ok(()) => log::info!(
            "took over the kept FUSE connection as incarnation {incarnation} (inodes from \
             {first} on are this daemon's); the kernel sends again what the last daemon left \
             unanswered"
        ),
        Err(e) => log::warn!(
            "took over the kept FUSE connection as incarnation {incarnation}, but the kernel \
             refused to send unanswered requests again ({e}; Linux 6.9+ does): programs \
             waiting on one stay blocked until interrupted"
        ),
    }
    Ok(session)
}

/// Serves the session until it is unmounted. SIGINT/SIGTERM unmount; the session then ends
/// as with `umount`. An unmount refused (files open: EBUSY) leaves the mount serving; a
/// second signal then detaches it (lazy unmount) and ends the process at once: open files
/// see ENOTCONN, nothing waits on them. With `restart` (a kept connection), SIGHUP runs it:
/// the daemon ends without unmounting, and its keeper starts the next one; without, SIGHUP
/// is ignored.
pub(super) fn serve_until_unmounted(
    mut session: fuser::Session<FuseFs>,
    mountpoint: &Path,
    ready: &mut dyn FnMut(),
    taken_over: bool,
    restart: Option<Box<dyn FnOnce() + Send>>,
) -> Result<(), String> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    // A session taken over was mounted by an earlier daemon: fuser holds no mount to undo,
    // so it is unmounted by path.
    let mut unmounter = session.unmount_callable();
    let at = mountpoint.to_path_buf();
    let mut unmount = move || {
        if taken_over {
            super::point::unmount(&at, false)
        } else {
            unmounter.unmount().map_err(|e| e.to_string())
        }
    };
    let detach_at = mountpoint.to_path_buf();
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let signal_handle = signals.handle();
    let mut restart = restart;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut unmounting = false;
            for sig in signals.forever() {
                if sig == SIGHUP {
                    match restart.take() {
                        Some(restart) => {
                            log::info!(
                                "SIGHUP: ending this daemon; the kept connection stays mounted"
                            );
                            restart();
                        }
                        // Not the default action (ending the process would end the mount).
                        None => log::warn!(
                            "SIGHUP ignored: a restart in place needs --keep-connection (or \
                             --supervise) and --volume"
                        ),
                    }
                } else if !unmounting {
                    unmounting = true;
                    log::info!("signal {sig}: unmounting");
                    if let Err(e) = unmount() {
                        log::error!(
                            "unmount failed: {e}; a second SIGTERM or SIGINT detaches the mount \
                             and exits"
                        );
                    }
                } else {
                    log::warn!("signal {sig} again: detaching the mount and exiting");
                    if let Err(e) = lazy_unmount(&detach_at) {
                        log::error!("detaching {} failed: {e}", detach_at.display());
                    }
                    std::process::exit(1);
                }
            }
        })
        .map_err(|e| e.to_string())?;
    ready();
    let result = session.run();
    signal_handle.close();
    result.map_err(|e| format!("FUSE session failed: {e}"))
}
