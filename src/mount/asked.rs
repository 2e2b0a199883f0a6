//! What `rmemfs mount` was asked for ([`MountConfig`]), and what follows from it alone.

use super::*;

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
    pub reg_cache: crate::regcache::Policy,
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
    /// The volume to attach (`--volume`; none: a private namespace that dies with the
    /// daemon), made with `--create`, its live holder fenced with `--takeover`.
    pub volume: Option<String>,
    pub create: bool,
    pub takeover: bool,
    /// Follow the volume read-only beside its holder (`--read-only`, [`crate::volume::follow`]).
    pub follow: bool,
    /// Share the volume with other writers, its namespace in this engine (`--meta`,
    /// [`crate::volume::shared`]).
    pub meta: Option<String>,
    /// Servers of the volume gone for good, attached without (`--force-without`).
    pub force_without: Vec<String>,
    /// Keep the FUSE connection across this daemon's end (`--keep-connection`; volumes
    /// only): hand it to a keeper, or take over the one a keeper passed (see [`keeper`]).
    pub keep_connection: bool,
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
            reg_cache: crate::regcache::Policy::Mrrc,
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
            volume: None,
            create: false,
            takeover: false,
            follow: false,
            meta: None,
            force_without: Vec::new(),
            keep_connection: false,
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
