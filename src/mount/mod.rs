//! `rmemfs mount`: checks the mount point, connects to the memory servers (or starts an
//! embedded one), builds the file system and serves it through FUSE until it is unmounted
//! (`umount`, or SIGINT/SIGTERM, which unmount cleanly). Closing the connections gives every
//! server its memory back.

pub mod admin;
mod asked;
mod flags;
pub mod keeper;
mod mountinfo;
mod options;
mod point;
mod redundancy;
mod session;
mod stats;

pub use asked::{MountArgs, MountConfig, Namespace};
use options::{default_cache_bytes, dirty_allowance, fuser_config};
pub use options::{default_embedded_size, resolve_server, ENABLE_URING};
use point::{check_fuse_device, check_verbs_memlock, mount_device, raise_readahead};
pub use point::{check_mountpoint, lazy_unmount, prepare_mountpoint};
use session::{attach_fuse, serve_until_unmounted, Connection};
pub use stats::{print_stats, report_json, server_stats_text};

use crate::client::control::ControlConn;
use crate::client::{Pool, PoolConfig};
use crate::config;
use crate::data::DataStore;
use crate::fabric::mem::page_size;
use crate::fabric::{Fabric, FabricOptions};
use crate::fs::{Fs, FsConfig};
use crate::regcache::CacheConfig;
use crate::server::{MemoryServer, ServerConfig, DEFAULT_PORT};
use crate::size::format_size;
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

/// The memory servers a mount uses: the addresses, their fabric, and the embedded server
/// when the mount runs one.
struct Servers {
    addrs: Vec<SocketAddr>,
    fabric_name: String,
    /// Kept until the mount ends (dropping it stops the server).
    _embedded: Option<MemoryServer>,
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
    let fabric_options = FabricOptions {
        op_timeout: config.op_timeout,
        ..config.fabric_options.clone()
    };
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

/// Starts the embedded memory server (without `--servers`), or resolves the servers given
/// and learns their fabric (from the first one's hello unless `--fabric` names it).
fn reach_servers(
    config: &MountConfig,
    fabric_options: &FabricOptions,
    given_server: Option<Arc<dyn Fabric>>,
) -> Result<Servers, String> {
    let servers = if config.servers.is_empty() {
        let fabric_name = config.fabric.clone().unwrap_or_else(|| "tcp".into());
        let size = config.size.unwrap_or_else(default_embedded_size);
        let server_fabric = match given_server {
            Some(f) => f,
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
        Servers {
            addrs: vec![server.local_addr()],
            fabric_name,
            _embedded: Some(server),
        }
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
        Servers {
            addrs,
            fabric_name,
            _embedded: None,
        }
    };
    config.check_redundancy(servers.addrs.len())?;
    if servers.fabric_name == "verbs" {
        check_verbs_memlock()?;
    }
    Ok(servers)
}

/// The file system a mount serves, with the volume's journal (a holder) or its follower.
struct Built {
    fs: Arc<Fs>,
    journal: Option<Arc<crate::volume::VolumeJournal>>,
    follower: Option<Following>,
    /// What a follower has done, for the report.
    follow_counters: Option<Arc<crate::volume::follow::FollowCounters>>,
}

/// What keeps a follower's or a shared volume's table in step (dropped at unmount).
enum Following {
    Journal {
        _follower: crate::volume::follow::Follower,
    },
    Shared {
        _client: crate::volume::shared::SharedClient,
    },
}

/// Connects the pool and builds the data store and the file system over it.
fn build_fs(
    config: &MountConfig,
    mountpoint: &Path,
    servers: &Servers,
    fabric: Arc<dyn Fabric>,
    choices: &options::MountChoices,
    taken_over: bool,
) -> Result<Built, String> {
    // What this daemon claims the volume as; a shared volume's member is named as its engine
    // session, unique to this daemon's life.
    let namespace = &config.namespace;
    let holder = match namespace {
        Namespace::Shared { .. } => format!(
            "{} session {:016x}",
            crate::volume::holder_name(""),
            crate::fabric::random_u64()
        ),
        _ => crate::volume::holder_name(""),
    };
    use crate::client::volume::{VolumeRole, VolumeSpec};
    let spec = |name: &str, create, takeover, role| VolumeSpec {
        name: name.to_string(),
        holder: holder.clone(),
        create,
        takeover,
        role,
    };
    let volume = match namespace {
        Namespace::Private => None,
        _ if servers._embedded.is_some() => {
            return Err(
                "--volume needs --servers: an embedded memory server dies with this daemon, \
                 and the volume with it"
                    .into(),
            )
        }
        // A daemon taking over a kept connection runs the first one's command line: the
        // volume exists by then.
        Namespace::Held {
            name,
            create,
            takeover,
            ..
        } => Some(spec(
            name,
            *create && !taken_over,
            *takeover,
            VolumeRole::Hold,
        )),
        Namespace::Follower { name } => Some(spec(name, false, false, VolumeRole::Follow)),
        // Made in the engine (below); the servers make its memory's record as members join.
        Namespace::Shared { name, .. } => Some(spec(name, false, false, VolumeRole::Share)),
    };
    // The engine first: one that cannot be reached fails the mount before any server
    // counts this daemon as a member.
    let engine = match namespace {
        Namespace::Shared { name, meta, create } => {
            let engine = crate::engine::open(meta, name)?;
            Some((engine, name, *create))
        }
        _ => None,
    };
    // A shared volume's servers in its own order (its chunk maps name them by place).
    let addrs = match &engine {
        Some((e, name, create)) => {
            let given: Vec<String> = servers.addrs.iter().map(|a| a.to_string()).collect();
            let order = crate::volume::shared::server_order(&**e, name, &given, *create)?;
            // The same servers (checked), placed as the volume orders them.
            order
                .iter()
                .filter_map(|s| given.iter().position(|g| g == s))
                .map(|i| servers.addrs[i])
                .collect()
        }
        None => servers.addrs.clone(),
    };
    let pool = Pool::connect(
        fabric,
        &addrs,
        &PoolConfig {
            client_name: format!("rmemfs-mount@{}", mountpoint.display()),
            timeout: config.op_timeout,
            secret: config.secret.clone(),
            busy_poll: config.busy_poll,
            volume,
        },
    )
    .map_err(|e| e.to_string())?;
    let cache = CacheConfig {
        capacity_pages: config
            .reg_cache_size
            .unwrap_or_else(|| default_cache_bytes(servers.fabric_name == "verbs"))
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
    .and_then(|d| {
        d.replicated(
            config.replicas_for(servers.addrs.len()),
            config.min_replicas,
        )
    })
    .map(|d| match config.coding {
        Some(coding) => d.encoded(coding),
        None => d,
    })
    .map_err(|e| e.message)?;
    // SAFETY: geteuid/getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let fs_config = FsConfig {
        root_uid: uid,
        root_gid: gid,
        read_only: choices.read_only,
        atime: choices.atime,
        dir_atime: choices.dir_atime,
        fixed_access_times: false,
        acl: choices.acl,
        writeback: choices.writeback,
        writeback_low_water: config.writeback_low_water.unwrap_or_else(dirty_allowance),
    };
    let (fs, journal, follower, follow_counters) = match namespace {
        Namespace::Shared { .. } => {
            let (engine, _, _) = engine.expect("a shared volume's engine is open");
            let (fs, client) = crate::volume::shared::join(data, fs_config, engine, holder)?;
            (fs, None, Some(Following::Shared { _client: client }), None)
        }
        Namespace::Follower { .. } => {
            let (fs, follower) = crate::volume::follow::follow(data, fs_config, &servers.addrs)?;
            let counters = follower.figures();
            (
                fs,
                None,
                Some(Following::Journal {
                    _follower: follower,
                }),
                Some(counters),
            )
        }
        Namespace::Held { force_without, .. } => {
            let without: Vec<SocketAddr> = force_without
                .iter()
                .map(|s| resolve_server(s))
                .collect::<Result<_, _>>()?;
            let options = crate::volume::JournalOptions {
                // The kernel of a connection taken over may still hold unlinked files open.
                keep_orphans: taken_over,
                ..Default::default()
            };
            // Written behind as on a private mount, in the journal's order: a record is
            // written after the bytes it names (see `data::behind`).
            let data = write_behind(data, choices)?;
            let a = crate::volume::attach_with(data, fs_config, &servers.addrs, &without, options)?;
            log::info!("volume attached: {:?}", a.report);
            (a.fs, Some(a.journal), None, None)
        }
        Namespace::Private => {
            // A private mount: nothing outside this daemon sees its bytes, so a write may be
            // answered before they are remote (see `data::behind`).
            let data = write_behind(data, choices)?;
            (Arc::new(Fs::new(data, fs_config)), None, None, None)
        }
    };
    Ok(Built {
        fs,
        journal,
        follower,
        follow_counters,
    })
}

/// `data`, writing behind unless `-o no_write_behind` says not to.
fn write_behind(data: DataStore, choices: &options::MountChoices) -> Result<DataStore, String> {
    if choices.write_behind {
        data.write_behind().map_err(|e| e.message)
    } else {
        Ok(data)
    }
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
        crate::upkeep::rebuild::Upkeep {
            rate: config.rebuild_rate,
            delay: config.rebuild_delay,
            detection: config.op_timeout,
            // A follower's copies are the holder's to keep; a shared volume's are made again
            // by one member at a time (`Fs::may_rebuild`), each file in its turn.
            rebuild: !matches!(config.namespace, Namespace::Follower { .. }),
        },
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
