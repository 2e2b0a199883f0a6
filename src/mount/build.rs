//! Opening a namespace over the memory servers, FUSE aside: the servers reached (or the
//! embedded one started), the pool connected, the data store built, and the file system over
//! it (private, or a volume held, followed or shared). The mount serves what this builds
//! through FUSE; the library (`crate::library`) serves it to a program.

use super::asked::{MountConfig, Namespace};
use super::options::{
    self, default_cache_bytes, default_embedded_size, dirty_allowance, resolve_server,
};
use super::point::check_verbs_memlock;
use crate::client::control::ControlConn;
use crate::client::{Pool, PoolConfig};
use crate::data::DataStore;
use crate::fabric::mem::page_size;
use crate::fabric::{Fabric, FabricOptions};
use crate::fs::{Fs, FsConfig};
use crate::regcache::CacheConfig;
use crate::server::{MemoryServer, ServerConfig};
use crate::size::format_size;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

/// The memory servers a mount uses: the addresses, their fabric, and the embedded server
/// when the mount runs one.
pub(crate) struct Servers {
    pub(crate) addrs: Vec<SocketAddr>,
    pub(crate) fabric_name: String,
    /// Kept until the mount ends (dropping it stops the server).
    _embedded: Option<MemoryServer>,
}

/// The client fabric's options: the configuration's, with its op timeout.
pub(crate) fn fabric_options(config: &MountConfig) -> FabricOptions {
    FabricOptions {
        op_timeout: config.op_timeout,
        ..config.fabric_options.clone()
    }
}

/// What the upkeep threads keep for the namespace `config` serves.
pub(crate) fn upkeep(config: &MountConfig) -> crate::upkeep::rebuild::Upkeep {
    crate::upkeep::rebuild::Upkeep {
        rate: config.rebuild_rate,
        delay: config.rebuild_delay,
        detection: config.op_timeout,
        // A follower's copies are the holder's to keep; a shared volume's are made again by
        // one member at a time (`Fs::may_rebuild`), each file in its turn.
        rebuild: !matches!(config.namespace, Namespace::Follower { .. }),
    }
}

/// Starts the embedded memory server (without `--servers`), or resolves the servers given
/// and learns their fabric (from the first one's hello unless `--fabric` names it).
pub(crate) fn reach_servers(
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
pub(crate) struct Built {
    pub(crate) fs: Arc<Fs>,
    pub(crate) journal: Option<Arc<crate::volume::VolumeJournal>>,
    pub(crate) follower: Option<Following>,
    /// What a follower has done, for the report.
    pub(crate) follow_counters: Option<Arc<crate::volume::follow::FollowCounters>>,
    /// Where a shared volume's client stands, for the report.
    pub(crate) standing: Option<crate::volume::shared::StandingSource>,
}

/// What keeps a follower's or a shared volume's table in step (dropped at unmount).
pub(crate) enum Following {
    Journal {
        _follower: crate::volume::follow::Follower,
    },
    Shared {
        _client: crate::volume::shared::SharedClient,
    },
}

/// Connects the pool and builds the data store and the file system over it.
pub(crate) fn build_fs(
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
    let mut standing = None;
    let (fs, journal, follower, follow_counters) = match namespace {
        Namespace::Shared { .. } => {
            let (engine, _, _) = engine.expect("a shared volume's engine is open");
            // Written behind only when asked (`-o write_behind`), in the engine's order: an
            // append that names a write's chunks goes after its bytes (see
            // `volume::shared::behind`). Not by default: measured on two cores it made
            // `tar x` about 5% faster and fio's 4 KiB random and 1 MiB sequential writes
            // 12 to 16% slower (doc/BENCHMARKING.md).
            let data = write_behind(data, choices, false)?;
            let (fs, client) = crate::volume::shared::join(data, fs_config, engine, holder)?;
            standing = Some(client.standing());
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
            let data = write_behind(data, choices, true)?;
            let a = crate::volume::attach_with(data, fs_config, &servers.addrs, &without, options)?;
            log::info!("volume attached: {:?}", a.report);
            (a.fs, Some(a.journal), None, None)
        }
        Namespace::Private => {
            // A private mount: nothing outside this daemon sees its bytes, so a write may be
            // answered before they are remote (see `data::behind`).
            let data = write_behind(data, choices, true)?;
            (Arc::new(Fs::new(data, fs_config)), None, None, None)
        }
    };
    Ok(Built {
        fs,
        journal,
        follower,
        follow_counters,
        standing,
    })
}

/// `data`, writing behind if `-o write_behind` says so, not if `-o no_write_behind` does, and
/// else as `by_default`.
fn write_behind(
    data: DataStore,
    choices: &options::MountChoices,
    by_default: bool,
) -> Result<DataStore, String> {
    if choices.write_behind.unwrap_or(by_default) {
        data.write_behind().map_err(|e| e.message)
    } else {
        Ok(data)
    }
}
