//! The command line's grammar (clap): every subcommand and option, with the help text
//! users read. What each command does is in `main.rs`.

use clap::{Parser, Subcommand};
use rmemfs::fabric::FabricArgs;
use rmemfs::mount::MountArgs;
use rmemfs::server::DEFAULT_PORT;
use rmemfs::size::parse_size;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "rmemfs",
    version,
    about = "A POSIX file system over the spare DRAM of memory servers, moved by one-sided RDMA",
    long_about = "rmemfs turns the memory of a set of memory servers into a file system. \
                  Memory servers run `rmemfs serve`; file data lives in their RAM and moves by \
                  one-sided RDMA READ/WRITE (real verbs, or the TCP software fabric on machines \
                  without an RDMA NIC). Set RUST_LOG=info (or debug) for logs."
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Cmd,
}

#[derive(Subcommand)]
pub(crate) enum AdminCmd {
    /// A point-in-time copy of the volume MOUNTPOINT has attached into DEST (a directory or
    /// s3://BUCKET/PREFIX), while it stays mounted: the mount's dirty pages are flushed,
    /// then its changes wait while the copy is made (reads go on).
    Export { mountpoint: PathBuf, dest: String },
    /// Keep COPIES copies of every chunk from now on: the rebuild adds or drops copies in the
    /// background while reads and writes go on (progress in `rmemfs stats`). Fewer than
    /// --min-replicas, or more than the live servers, is refused.
    SetReplicas { mountpoint: PathBuf, copies: usize },
    /// Put the memory server HOST[:PORT] into the mount's pool: new chunks may land there
    /// (with a volume, it is named in the volume's root first, at the volume's epoch).
    AddServer {
        mountpoint: PathBuf,
        #[arg(value_name = "HOST[:PORT]")]
        server: String,
        /// Then move copies from the fullest servers to the emptiest until every server's
        /// used fraction is within 5% of the mean (at the mount's --rebuild-rate); returns
        /// when done.
        #[arg(long)]
        rebalance: bool,
    },
    /// Move every copy off the memory server HOST[:PORT] while reads and writes go on (each
    /// chunk keeps its full copy count: the new copy is written before the old one goes),
    /// and the volume's journal too; returns once it holds nothing of the mount. Progress on
    /// stderr, and in `rmemfs stats`.
    Drain {
        mountpoint: PathBuf,
        #[arg(value_name = "HOST[:PORT]")]
        server: String,
    },
    /// Forget the drained memory server HOST[:PORT].
    Remove {
        mountpoint: PathBuf,
        #[arg(value_name = "HOST[:PORT]")]
        server: String,
    },
    /// Move copies from the fullest servers to the emptiest until every server's used
    /// fraction is within 5% of the mean (at the mount's --rebuild-rate); returns when done.
    Rebalance { mountpoint: PathBuf },
}

#[derive(Subcommand)]
pub(crate) enum VolumeCmd {
    /// List the volumes: epoch, attached or not, memory, files, holder.
    Ls,
    /// One volume in detail: its holder, each server's share, its checkpoint and journal.
    Status { name: String },
    /// Remove a detached volume, freeing every extent of it on every server (a shared
    /// volume's namespace too, from its metadata engine, named by --meta).
    Rm {
        name: String,
        /// The metadata engine of a shared volume (redis://HOST:PORT[/DB]): its keys are
        /// removed first (refused while clients are mounted).
        #[arg(long, value_name = "URL")]
        meta: Option<String>,
    },
    /// Copy a detached volume into DEST, a directory or s3://BUCKET/PREFIX (content-addressed
    /// chunks and a manifest written last; a second export into DEST copies only what
    /// changed). S3 takes AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION and
    /// AWS_ENDPOINT_URL from the environment.
    Export { name: String, dest: String },
    /// Make volume NAME from the export in SRC, a directory or s3://BUCKET/PREFIX (every hash
    /// verified).
    Import { src: String, name: String },
}

#[derive(Subcommand)]
pub(crate) enum Cmd {
    /// Run a memory server: lend SIZE bytes of this machine's RAM to rmemfs clients.
    Serve {
        /// Address and port to listen on for control connections. The TCP fabric's data
        /// connections use a second, ephemeral port on the same address. The default listens on
        /// loopback only; give a routable address to serve other machines.
        #[arg(long, default_value_t = SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT)))]
        listen: SocketAddr,
        /// Size of the memory arena to lend, e.g. 512M, 8G. It is reserved at start: every
        /// page faulted in (and locked in RAM where the memlock limit allows) before the
        /// server listens, so first writes are as fast as later ones and the host cannot
        /// take the memory back; a size the host cannot hold fails at start.
        #[arg(long, default_value = "1G", value_parser = parse_size)]
        size: u64,
        /// Take the arena's pages only as clients first write them (and pin them), as a
        /// lender of spare memory may prefer: the server starts at once and costs RAM only
        /// where used, but first writes run slower and the host may be short when asked.
        #[arg(long)]
        lazy: bool,
        /// Keep the arena, and the table of every extent lent and to whom, in this file (a
        /// DAX device, persistent memory, tmpfs, hugetlbfs or any local file): a restart
        /// (a crash, SIGTERM, an upgrade) comes back with every extent, so clients resume
        /// and nothing is rebuilt (on verbs they learn the extents' new keys, and the file
        /// must be on devdax, tmpfs or hugetlbfs). doc/OPERATIONS.md says what survives a
        /// power loss on each medium.
        #[arg(long, value_name = "PATH")]
        backing: Option<PathBuf>,
        /// The host's boot as the backing file records it, instead of the kernel's boot_id:
        /// a test plays a host restart after a power loss with it (tools/chaos.sh).
        #[arg(long, value_name = "ID", hide = true)]
        boot_id: Option<String>,
        #[command(flatten)]
        fabric: FabricArgs,
        /// File with the shared secret clients must prove they hold (`rmemfs keygen`); also
        /// from $RMEMFS_SECRET_FILE. Required to listen on anything but loopback, unless
        /// --insecure.
        #[arg(long, value_name = "PATH")]
        secret_file: Option<PathBuf>,
        /// Serve a non-loopback address without a secret: anyone who reaches the port may
        /// allocate this server's memory. Only on a network where every host is trusted.
        #[arg(long)]
        insecure: bool,
        /// Most memory one client may hold, e.g. 4G (beyond it, its allocations are refused
        /// and its writes get ENOSPC while other clients go on).
        #[arg(long, value_parser = parse_size, value_name = "SIZE")]
        max_client_memory: Option<u64>,
        /// Most clients served at once.
        #[arg(long, default_value_t = rmemfs::config::MAX_CLIENTS)]
        max_clients: u32,
        /// Most control connections from one peer address at once.
        #[arg(long, default_value_t = rmemfs::config::MAX_CONNECTIONS_PER_PEER)]
        max_connections_per_peer: u32,
        /// The op timeout of this server's clients, in seconds: the server's own timeouts
        /// (a stalled one-sided operation, a client's handshake) are derived from it and
        /// shorter, so the server gives up first and clients see a clean error.
        #[arg(long, default_value_t = rmemfs::config::OP_TIMEOUT_SECS)]
        op_timeout: u64,
        /// Seconds a client's extents are kept after its connection drops without a goodbye
        /// (a cut link, a paused client), so it can reconnect and resume with its data
        /// intact; 0 frees them at once.
        #[arg(long, default_value_t = rmemfs::config::LEASE_SECS)]
        lease: u64,
        /// Serve Prometheus metrics at http://ADDR:PORT/metrics (off by default; give a
        /// loopback address unless the scraper is elsewhere).
        #[arg(long, value_name = "ADDR:PORT")]
        metrics_listen: Option<SocketAddr>,
    },
    /// Mount the pool of memory servers as a file system at MOUNTPOINT.
    ///
    /// Without --servers, an embedded memory server is started in this process. By default
    /// the command returns once the mount is ready and the file system keeps running in the
    /// background; `umount MOUNTPOINT` (or SIGINT/SIGTERM to the daemon) unmounts it and gives
    /// the remote memory back.
    Mount(MountArgs),
    /// Manage volumes on a set of memory servers.
    Volume {
        #[command(subcommand)]
        action: VolumeCmd,
        /// The memory servers, `host[:port]` separated by commas.
        #[arg(long, value_delimiter = ',', global = true)]
        servers: Vec<String>,
        /// The servers' secret file; also from $RMEMFS_SECRET_FILE.
        #[arg(long, value_name = "PATH", global = true)]
        secret_file: Option<PathBuf>,
    },
    /// Ask a running mount daemon (through its admin socket; root or the mount's owner).
    Admin {
        #[command(subcommand)]
        action: AdminCmd,
    },
    /// Write a fresh random shared secret to PATH (mode 0600), for `serve --secret-file` on
    /// every memory server and `mount --secret-file` on every client.
    Keygen {
        /// The file to create.
        path: PathBuf,
        /// Replace PATH if it exists.
        #[arg(long)]
        force: bool,
    },
    /// Print the counters of a live mount (registration cache, fabric operations, servers,
    /// copies), or with --server those of a memory server (memory, clients, refusals).
    Stats {
        /// The mount point of a running `rmemfs mount`.
        #[arg(required_unless_present = "server", conflicts_with = "server")]
        mountpoint: Option<PathBuf>,
        /// A memory server (host[:port]) to ask instead, over an authenticated session.
        #[arg(long, value_name = "HOST[:PORT]")]
        server: Option<String>,
        /// The server's secret file (with --server); also from $RMEMFS_SECRET_FILE.
        #[arg(long, value_name = "PATH", requires = "server")]
        secret_file: Option<PathBuf>,
        /// One JSON object instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script for SHELL, e.g.
    /// `rmemfs completions bash > /etc/bash_completion.d/rmemfs`.
    Completions { shell: clap_complete::Shell },
    /// Write the man pages (rmemfs.1 and one per subcommand) into DIR, for packaging.
    #[command(hide = true)]
    Manpages { dir: PathBuf },
}
