//! `rmemfs mount`: checks the mount point, connects to the memory servers (or starts an
//! embedded one), builds the file system and serves it through FUSE until it is unmounted
//! (`umount`, or SIGINT/SIGTERM, which unmount cleanly). Closing the connections gives every
//! server its memory back.

pub mod admin;
mod asked;
pub(crate) mod build;
mod flags;
pub mod keeper;
mod mountinfo;
mod options;
mod point;
mod redundancy;
mod session;
mod stats;

pub use asked::{MountArgs, MountConfig, Namespace};
use build::{build_fs, reach_servers, Built};
pub(crate) use options::library_choices;
pub use options::{default_embedded_size, resolve_server, ENABLE_URING};
use options::{dirty_allowance, fuser_config};
use point::{check_fuse_device, mount_device, raise_readahead};
pub use point::{check_mountpoint, lazy_unmount, prepare_mountpoint};
use session::{attach_fuse, serve_until_unmounted, Connection};
pub use stats::{print_stats, report_json, server_stats_text};

use crate::client::control::ControlConn;
use crate::config;
use crate::fabric::{Fabric, FabricOptions};
use crate::fs::Fs;
use crate::server::DEFAULT_PORT;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

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

/// What keeps running beside the FUSE session: the upkeep threads and the metrics endpoint.
struct Upkeep {
    _metrics: Option<crate::report::metrics::MetricsServer>,
    _rebuilder: crate::upkeep::rebuild::Rebuilder,
}

fn run_mount(mount: Mount, ready: &mut dyn FnMut()) -> Result<(), String> {
    let config = &mount.config;
    let inherited = if config.keep_connection {
        if config.namespace.volume().is_none() {
            return Err(
                "--keep-connection needs --volume: a private namespace dies with its \
                        daemon, so the next one could not serve the files programs hold open"
                    .into(),
            );
        }
        keeper::inherited()?
    } else {
        None
    };
    let mountpoint = match inherited {
        // Mounted already, and served by nobody until this daemon is: not to be looked at.
        Some(_) => std::path::absolute(&config.mountpoint).map_err(|e| e.to_string())?,
        None => check_mountpoint(&config.mountpoint)?,
    };
    check_fuse_device()?;
    let mut options = config.options.clone();
    match config.namespace {
        // A follower writes nothing, and its kernel must see the holder's sizes and times.
        Namespace::Follower { .. } => {
            options.extend(["ro".to_string(), "no_writeback_cache".to_string()])
        }
        // The kernel must see other writers' sizes and times.
        Namespace::Shared { .. } => options.push("no_writeback_cache".to_string()),
        Namespace::Private | Namespace::Held { .. } => {}
    }
    let (fuse_config, choices) = fuser_config(&options, config.threads)?;
    let fabric_options = build::fabric_options(config);
    let (given_client, given_server) = match mount.fabrics {
        Some((c, s)) => (Some(c), Some(s)),
        None => (None, None),
    };
    // Bound first: a port in use fails the mount before anything is set up.
    let metrics_listener = config
        .metrics_listen
        .map(crate::report::metrics::MetricsServer::bind)
        .transpose()
        .map_err(|e| e.to_string())?;
    let servers = reach_servers(config, &fabric_options, given_server)?;
    let client_fabric = match given_client {
        Some(f) => f,
        None => {
            crate::fabric::open(&servers.fabric_name, &fabric_options).map_err(|e| e.to_string())?
        }
    };
    let taken_over = inherited.is_some();
    let Built {
        fs,
        journal,
        follower,
        follow_counters,
        standing,
    } = build_fs(
        config,
        &mountpoint,
        &servers,
        client_fabric,
        &choices,
        taken_over,
    )?;
    let connection = match inherited {
        Some(i) => Connection::TakeOver(i),
        None if config.keep_connection => Connection::Keep,
        None => Connection::Own,
    };
    let no_admin =
        |e: &String| log::warn!("no admin socket ({e}): `rmemfs admin` cannot reach this mount");
    let admin_socket = admin::Listening::bind().inspect_err(no_admin).ok();
    let parts = crate::report::Parts {
        fs: fs.clone(),
        adapter: Default::default(),
        upkeep: Default::default(),
        follower: follow_counters,
        shared: standing,
        admin_socket: admin_socket
            .as_ref()
            .map(|a| a.path().display().to_string())
            .unwrap_or_default(),
    };
    let session = attach_fuse(&parts, &mountpoint, &fuse_config, &choices, connection)?;
    let flag_watch = flags::FlagWatch::start(fs.clone(), &mountpoint, taken_over);
    let upkeep = start_upkeep(&parts, config, &mountpoint, metrics_listener)?;
    let admin = admin_socket.and_then(|a| {
        a.serve(admin::Target {
            fs: fs.clone(),
            upkeep: parts.upkeep.clone(),
            volume: config
                .namespace
                .volume()
                .map(str::to_string)
                .zip(journal.clone()),
            rebuild_rate: config.rebuild_rate,
        })
        .inspect_err(no_admin)
        .ok()
    });
    if let Some(f) = mount.on_mounted {
        f(fs.clone());
    }
    // A planned restart (SIGHUP, with a kept connection): every change committed, then
    // out without unmounting; the keeper starts the next daemon on the same connection.
    let restart = match (&journal, config.keep_connection) {
        (Some(j), true) => {
            let j = j.clone();
            Some(Box::new(move || {
                if let Err(e) = j.sync_all() {
                    log::error!("the last commit before the restart failed: {}", e.message);
                }
                std::process::exit(keeper::RESTART_EXIT);
            }) as Box<dyn FnOnce() + Send>)
        }
        _ => None,
    };
    let result = serve_until_unmounted(session, &mountpoint, ready, taken_over, restart);
    drop(flag_watch);
    drop(follower);
    log::info!(
        "unmounted {}; returning remote memory. Counters at unmount:\n{}",
        mountpoint.display(),
        parts.stats_text()
    );
    drop(admin);
    drop(upkeep);
    if let Some(j) = journal {
        // Every change committed before the pool says goodbye (the volume keeps its extents).
        if let Err(e) = j.stop() {
            log::error!("the volume's last commit failed: {}", e.message);
        }
    }
    drop(parts);
    drop(fs);
    drop(servers);
    result
}

/// Starts what runs beside the session: heartbeats, reconnects and the rebuild; the dirty
/// limit kept for the mounted bdi; the metrics endpoint.
fn start_upkeep(
    parts: &crate::report::Parts,
    config: &MountConfig,
    mountpoint: &Path,
    metrics_listener: Option<std::net::TcpListener>,
) -> Result<Upkeep, String> {
    let fs = &parts.fs;
    let rebuilder = crate::upkeep::rebuild::Rebuilder::start(
        fs.clone(),
        build::upkeep(config),
        parts.upkeep.clone(),
    )
    .map_err(|e| format!("cannot start the rebuild thread: {e}"))?;
    raise_readahead(mountpoint);
    // The kernel's dirty data for the mount kept below the pool's room (root: the bdi's
    // max_bytes, Linux 6.2+; after raise_readahead, whose max_ratio is the same setting),
    // so the writeback cache can stay on until the pool is nearly full. An explicit
    // --writeback-low-water keeps its rule instead.
    if config.writeback_low_water.is_none() {
        let bdi = mount_device(mountpoint)
            .map(|dev| PathBuf::from(format!("/sys/class/bdi/{dev}/max_bytes")));
        fs.keep_dirty_limit(crate::fs::dirty_limit::DirtyLimit::new(
            bdi,
            dirty_allowance(),
        ));
    }
    let metrics = metrics_listener
        .map(|listener| {
            let (a, b, c) = (parts.clone(), parts.adapter.clone(), fs.clone());
            let collector = crate::report::metrics::MountCollector {
                report: Arc::new(move || crate::report::MountReport::gather(&a)),
                requests: Arc::new(move || b.requests.summary()),
                batches: Arc::new(move || c.data().pool().batch_latency()),
            };
            crate::report::metrics::serve(listener, Box::new(collector))
        })
        .transpose()?;
    Ok(Upkeep {
        _metrics: metrics,
        _rebuilder: rebuilder,
    })
}

#[cfg(test)]
mod tests;
