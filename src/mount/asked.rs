//! What `rmemfs mount` was asked for: its options as the command line spells them
//! ([`MountArgs`], clap's grammar and the help users read), turned in one place
//! ([`MountArgs::config`]) into [`MountConfig`], with the namespace mode decided once
//! ([`Namespace`]). A new option is a field here and its use where it is consumed.

use super::*;

/// Every option of `rmemfs mount`.
#[derive(clap::Args, Debug, Clone)]
pub struct MountArgs {
    /// Where to mount (an existing, empty directory that is not a mount point).
    pub mountpoint: PathBuf,
    #[command(flatten)]
    pub fabric: crate::fabric::FabricArgs,
    /// Memory servers, `host[:port]` separated by commas (port 7471 when omitted).
    #[arg(long, value_delimiter = ',')]
    pub servers: Vec<String>,
    /// Arena of the embedded memory server (only without --servers); default a quarter of
    /// the available RAM, 64M to 8G.
    #[arg(long, value_parser = crate::size::parse_size)]
    pub size: Option<u64>,
    /// Stay in the foreground (logs go to stderr).
    #[arg(short, long)]
    pub foreground: bool,
    /// Mount options, comma separated: allow_other, allow_root, ro, rw, auto_unmount,
    /// nodev, nosuid, noexec (and dev, suid, exec), fsname=NAME, subtype=NAME; access
    /// times relatime (the default), strictatime, noatime, nodiratime; acl (the default)
    /// or noacl; writeback_cache (the default) or no_writeback_cache; rdirplus (the
    /// default: directory reads carry attributes) or nordirplus; write_behind (the
    /// default on a private mount and a volume's holder, asked for on a shared volume's
    /// client: small writes answered before they are remote, a failed send reported by the
    /// next fsync) or no_write_behind; io_uring
    /// (requests through FUSE over io_uring, Linux 6.14+: turns the fuse module's
    /// enable_uring on if it is off; without kernel support the mount says so and uses
    /// /dev/fuse).
    #[arg(short = 'o', value_delimiter = ',')]
    pub options: Vec<String>,
    /// Size of the chunks files are cut into (a power of two); each chunk lives on one
    /// server, chosen by free memory.
    #[arg(long, default_value_t = crate::config::CHUNK_SIZE, value_parser = crate::size::parse_size)]
    pub chunk_size: u64,
    /// FUSE worker threads.
    #[arg(long, default_value_t = crate::config::FUSE_THREADS)]
    pub threads: usize,
    /// Seconds without progress after which an operation on a server fails (EIO).
    #[arg(long, default_value_t = crate::config::OP_TIMEOUT_SECS)]
    pub op_timeout: u64,
    /// In the background, write logs here (default: discarded).
    #[arg(long)]
    pub log_file: Option<PathBuf>,
    /// Registration cache for the buffers handed to the fabric: mrrc (the region cache
    /// with MRE replacement), lru (a pin-down cache) or none (register per operation).
    #[arg(long, default_value = "mrrc")]
    pub reg_cache: crate::regcache::Policy,
    /// Most memory the registration cache keeps registered (default: 1G; on verbs, for a
    /// user, what the memlock limit allows past 32M, at most 1G).
    #[arg(long, value_parser = crate::size::parse_size)]
    pub reg_cache_size: Option<u64>,
    /// How writes reach fresh remote memory: frrwp (tagged allocation first, local
    /// registration meanwhile, conditional writes posted when the rkey arrives) or serial
    /// (allocate, wait, register, write).
    #[arg(long, default_value = "frrwp")]
    pub write_path: crate::data::WritePath,
    /// File with the memory servers' shared secret (`rmemfs keygen`); also from
    /// $RMEMFS_SECRET_FILE. The embedded server uses it too.
    #[arg(long, value_name = "PATH")]
    pub secret_file: Option<PathBuf>,
    /// Copies of every chunk, each on a different memory server (1 to 4): a file survives
    /// the loss of all but one. Default: 2 with two or more servers, else 1.
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=4))]
    pub replicas: Option<u8>,
    /// Fewest copies a write may land on when servers are down or full (fewer: EIO).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=4))]
    pub min_replicas: u8,
    /// Erasure-code cold data: `ec:K+M` (K data and M parity fragments on K+M servers, as
    /// in ec:4+2; M servers may be lost for (K+M)/K times the data). Data being written
    /// keeps M+1 copies; chunks of files left unwritten for 5 s are encoded in the
    /// background (doc/FAILURES.md). Private mounts and volumes; not with --replicas.
    #[arg(long, value_name = "ec:K+M", value_parser = parse_redundancy, conflicts_with_all = ["replicas", "read_only", "meta"])]
    pub redundancy: Option<crate::meta::Coding>,
    /// Bytes per second (K, M, G suffixes) the background rebuild copies at most while it
    /// restores the copies a dead server held; 0: no limit.
    #[arg(long, default_value_t = crate::config::REBUILD_RATE, value_parser = crate::size::parse_size)]
    pub rebuild_rate: u64,
    /// Seconds the rebuild waits after a server goes down or comes back before it copies:
    /// a server back within it resumes with its copies intact.
    #[arg(long, default_value_t = crate::config::REBUILD_DELAY.as_secs_f64())]
    pub rebuild_delay: f64,
    /// With the writeback cache: free pool bytes (K, M, G) below which files opened for
    /// writing bypass it, so a full pool is ENOSPC at `write` rather than at `fsync` or
    /// `close`. Default: as root, the kernel's dirty data for the mount is kept below the
    /// pool's free room (the bdi's max_bytes) and files bypass the cache only when the
    /// pool is nearly full (64M); else the dirty page cache this mount may hold.
    #[arg(long, value_parser = crate::size::parse_size)]
    pub writeback_low_water: Option<u64>,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics (off by default; give a
    /// loopback address unless the scraper is elsewhere).
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics_listen: Option<SocketAddr>,
    /// On the tcp fabric, spin up to 0.1 ms for a small read's or write's completion
    /// before sleeping: a lower median latency for small I/O, for CPU spent spinning
    /// (verbs always polls, up to 0.5 ms).
    #[arg(long)]
    pub busy_poll: bool,
    /// Detach (lazy unmount) whatever is mounted at MOUNTPOINT and mount over it. Without
    /// it, only an rmemfs mount whose daemon is gone (killed: ENOTCONN) is cleaned up.
    #[arg(long)]
    pub force: bool,
    /// Attach the named volume: a namespace journaled into the memory servers, which
    /// outlives this daemon (a crash, kill -9 or upgrade loses nothing fsynced) and can be
    /// attached again from any host with the secret. Needs --servers.
    #[arg(long, value_name = "NAME", requires = "servers")]
    pub volume: Option<String>,
    /// Make the volume (without it, an unknown name fails and lists the known ones).
    #[arg(long, requires = "volume")]
    pub create: bool,
    /// Fence the volume's live holder and take it over (its next operation fails with EIO).
    #[arg(long, requires = "volume")]
    pub takeover: bool,
    /// Follow the volume read-only beside its holder (any number of hosts at once): the
    /// mount replays the holder's journal as it commits, within about 0.1 s, and writes
    /// nothing. Not the holder mounted `-o ro` (which fences any other holder).
    #[arg(long, requires = "volume", conflicts_with_all = ["create", "takeover", "keep_connection", "supervise"])]
    pub read_only: bool,
    /// Share the volume with other clients writing it at once, its namespace kept in this
    /// metadata engine (`redis://HOST:PORT[/DB]`, `rediss://…` over TLS, its authority in
    /// RMEMFS_META_CA; `redis+unix:///PATH`) instead of one holder's journal
    /// (doc/VOLUMES.md).
    #[arg(long, value_name = "URL", requires = "volume", conflicts_with_all = ["read_only", "takeover", "keep_connection", "supervise"])]
    pub meta: Option<String>,
    /// Attach without these servers of the volume (host[:port], commas), gone for good:
    /// their copies are forgotten and the rebuild makes new ones elsewhere.
    #[arg(long, value_delimiter = ',', value_name = "HOST", requires = "volume")]
    pub force_without: Vec<String>,
    /// Keep the FUSE connection open across this daemon's end, so that programs keep
    /// their open files while the next daemon re-attaches the volume: the connection is
    /// handed to the keeper on $NOTIFY_SOCKET (systemd's file descriptor store,
    /// FileDescriptorStoreMax=2), and taken over when the keeper passes it back
    /// ($LISTEN_FDS). SIGHUP then ends the daemon without unmounting.
    #[arg(long, requires = "volume")]
    pub keep_connection: bool,
    /// Run under a small supervisor that keeps the FUSE connection and starts the daemon
    /// again when it dies (crash, kill -9, OOM) or is restarted with SIGHUP (an
    /// upgrade): programs keep their open files (implies --keep-connection).
    #[arg(long, requires = "volume")]
    pub supervise: bool,
}

/// `--redundancy`'s grammar: `ec:K+M`.
fn parse_redundancy(s: &str) -> Result<crate::meta::Coding, String> {
    match s.split_once(':') {
        Some(("ec", code)) => code.parse(),
        _ => Err(format!(
            "'{s}': --redundancy takes ec:K+M (as in ec:4+2); copies are --replicas N"
        )),
    }
}

impl MountArgs {
    /// What the mount is asked for: the secret read from its file (or
    /// `$RMEMFS_SECRET_FILE`), the namespace mode decided.
    pub fn config(&self) -> Result<MountConfig, String> {
        let secret = crate::auth::Secret::from_option(self.secret_file.as_deref())
            .map_err(|e| e.to_string())?;
        Ok(self.config_with(secret))
    }

    fn config_with(&self, secret: crate::auth::Secret) -> MountConfig {
        let op_timeout = Duration::from_secs(self.op_timeout);
        MountConfig {
            mountpoint: self.mountpoint.clone(),
            fabric: self.fabric.fabric.clone(),
            fabric_options: self.fabric.options(op_timeout),
            servers: self.servers.clone(),
            size: self.size,
            options: self.options.clone(),
            chunk_size: self.chunk_size,
            threads: self.threads,
            op_timeout,
            reg_cache: self.reg_cache,
            reg_cache_size: self.reg_cache_size,
            write_path: self.write_path,
            secret,
            replicas: self.replicas.map(usize::from),
            coding: self.redundancy,
            min_replicas: usize::from(self.min_replicas),
            rebuild_rate: self.rebuild_rate,
            rebuild_delay: Duration::try_from_secs_f64(self.rebuild_delay)
                .unwrap_or(config::REBUILD_DELAY),
            writeback_low_water: self.writeback_low_water,
            metrics_listen: self.metrics_listen,
            busy_poll: self.busy_poll,
            namespace: self.namespace(),
            keep_connection: self.keep_connection || self.supervise,
        }
    }

    /// The one place the mode is decided (clap has refused the combinations that mean
    /// nothing: `--read-only` with `--create`, `--meta` with `--takeover`).
    fn namespace(&self) -> Namespace {
        let Some(name) = self.volume.clone() else {
            return Namespace::Private;
        };
        match (&self.meta, self.read_only) {
            (Some(meta), _) => Namespace::Shared {
                name,
                meta: meta.clone(),
                create: self.create,
            },
            (None, true) => Namespace::Follower { name },
            (None, false) => Namespace::Held {
                name,
                create: self.create,
                takeover: self.takeover,
                force_without: self.force_without.clone(),
            },
        }
    }
}

/// The namespace a mount serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Namespace {
    /// Dies with the daemon (no `--volume`).
    Private,
    /// A volume this daemon holds alone, journaled into the memory servers: made with
    /// `create`, its live holder fenced with `takeover`, attached without the servers in
    /// `force_without` (gone for good).
    Held {
        name: String,
        create: bool,
        takeover: bool,
        force_without: Vec<String>,
    },
    /// A holder's volume, followed read-only beside it (`--read-only`,
    /// [`crate::volume::follow`]).
    Follower { name: String },
    /// A volume many clients write at once, its namespace in the metadata engine at `meta`
    /// (`--meta`, [`crate::volume::shared`]); made with `create`.
    Shared {
        name: String,
        meta: String,
        create: bool,
    },
}

impl Namespace {
    /// The volume's name; none for a private namespace.
    pub fn volume(&self) -> Option<&str> {
        match self {
            Namespace::Private => None,
            Namespace::Held { name, .. }
            | Namespace::Follower { name }
            | Namespace::Shared { name, .. } => Some(name),
        }
    }
}

/// `rmemfs mount`'s grammar on its own, to read the defaults from (and, in tests, any
/// command line).
#[derive(clap::Parser)]
pub(super) struct Defaults {
    #[command(flatten)]
    pub(super) args: MountArgs,
}

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
    /// Copies of every chunk; `None`: 2 with two or more servers, else 1 (M+1 with an
    /// erasure code).
    pub replicas: Option<usize>,
    /// The erasure code cold chunks are encoded with (`--redundancy ec:K+M`), if any.
    pub coding: Option<crate::meta::Coding>,
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
    /// The namespace served: private, or a volume held, followed or shared.
    pub namespace: Namespace,
    /// Keep the FUSE connection across this daemon's end (`--keep-connection`; volumes
    /// only): hand it to a keeper, or take over the one a keeper passed (see [`keeper`]).
    pub keep_connection: bool,
}

impl MountConfig {
    /// A mount at `mountpoint` with every option at its default (an embedded server, a
    /// private namespace, no secret).
    pub fn new(mountpoint: PathBuf) -> MountConfig {
        let argv = [
            std::ffi::OsStr::new("mount"),
            "--".as_ref(),
            mountpoint.as_os_str(),
        ];
        let defaults = <Defaults as clap::Parser>::parse_from(argv).args;
        defaults.config_with(crate::auth::Secret::none())
    }

    /// The copies each chunk gets over `servers` memory servers.
    pub fn replicas_for(&self, servers: usize) -> usize {
        if let Some(coding) = self.coding {
            // The same faults survived while the data is copies as once it is a stripe.
            return coding.m as usize + 1;
        }
        self.replicas.unwrap_or(if servers >= 2 {
            config::DEFAULT_REPLICAS
        } else {
            1
        })
    }
}
