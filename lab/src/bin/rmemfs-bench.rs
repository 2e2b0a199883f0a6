//! `rmemfs-bench`: the fabric and FRRWP benchmarks (see [`rmemfs_lab::bench`]).
//!
//! A separate binary from `rmemfs` so the product's command line holds only product commands;
//! the memory server it measures is still the product binary, started as a child process.

use clap::{Args, Parser, Subcommand};
use rmemfs::fabric::FabricOptions;
use rmemfs::size::parse_size;
use rmemfs_lab::bench::{self, BenchConfig};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "rmemfs-bench",
    version,
    about = "rmemfs benchmarks: the TCP fabric against plain TCP, serial writes against FRRWP",
    long_about = "rmemfs benchmarks: the TCP fabric against plain TCP, serial writes against \
                  FRRWP. The memory server runs as a child process of the product binary \
                  (`rmemfs serve`): --rmemfs PATH, else $RMEMFS_BIN, else the `rmemfs` next to \
                  this executable. Set RUST_LOG for this process's logs; the server's are \
                  limited to errors."
)]
struct Cli {
    /// The rmemfs binary that runs the memory server (default: $RMEMFS_BIN, else `rmemfs` in
    /// the directory of this executable).
    #[arg(long, global = true, value_name = "PATH")]
    rmemfs: Option<PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

/// Which data fabric to use, and the RDMA device for `verbs`.
#[derive(Args, Clone)]
struct FabricArgs {
    /// Data fabric: `tcp` (software RDMA over TCP, works everywhere) or `verbs` (real RDMA
    /// through libibverbs; needs a build with the `verbs` feature, on both binaries).
    #[arg(long, default_value = "tcp")]
    fabric: String,
    /// RDMA device for the verbs fabric (e.g. rxe0, mlx5_0); default: the first active one.
    #[arg(long)]
    device: Option<String>,
    /// GID table index for the verbs fabric; default: a RoCE v2 GID (IPv4-mapped first).
    #[arg(long)]
    gid_index: Option<u32>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Draw lab/scripts/bench-fio.sh's summary.json as an SVG chart (grouped bars per job).
    Chart {
        /// The summary.json bench-fio.sh wrote.
        summary: PathBuf,
        /// Where to write the SVG.
        out: PathBuf,
    },
    /// Draw a benchmark script's chart spec (JSON: title, series, panels of bar groups) as an
    /// SVG of grouped bars; see the lab's `bars` module for the format.
    Bars {
        /// The chart spec the script wrote.
        spec: PathBuf,
        /// Where to write the SVG.
        out: PathBuf,
    },
    /// Measure the TCP fabric against plain TCP on loopback (throughput and latency ratios).
    Fabric {
        /// Operation sizes.
        #[arg(long, value_delimiter = ',', default_value = "4K,64K,1M,4M", value_parser = parse_size)]
        sizes: Vec<u64>,
        /// Operations kept in flight.
        #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
        depths: Vec<usize>,
        /// Bytes moved per throughput point.
        #[arg(long, default_value = "256M", value_parser = parse_size)]
        bytes: u64,
        /// Round trips per latency point.
        #[arg(long, default_value_t = 2000)]
        latency_iters: usize,
        /// Clients connected for the server-memory measurement.
        #[arg(long, default_value_t = 64)]
        clients: usize,
    },
    /// Measure write latency to fresh remote memory: serial allocation-then-write against
    /// FRRWP, over the TCP fabric, beside the paper's model of the saving.
    Frrwp {
        /// Write sizes.
        #[arg(long, value_delimiter = ',', default_value = "64K,256K,1M,4M,16M", value_parser = parse_size)]
        sizes: Vec<u64>,
        /// Writes per size and path.
        #[arg(long, default_value_t = 100)]
        iters: usize,
        #[command(flatten)]
        fabric: FabricArgs,
    },
    /// Mount rmemfs over the in-process fabric: an embedded memory server in this process and
    /// no network on the data path, so the mount measures rmemfs's own code plus FUSE (the
    /// ceiling for the real fabrics). Stays in the foreground and prints `ready` once
    /// mounted; `umount MOUNTPOINT` (or SIGINT/SIGTERM) ends it.
    Mount {
        /// Where to mount (an existing, empty directory).
        mountpoint: PathBuf,
        /// The embedded server's arena.
        #[arg(long, default_value = "1G", value_parser = parse_size)]
        size: u64,
        /// Mount options, as for `rmemfs mount -o`.
        #[arg(short = 'o', value_delimiter = ',')]
        options: Vec<String>,
    },
    /// An in-memory FUSE file system with the kernel's writeback cache (no rmemfs code):
    /// the peer bench-fio sets beside rmemfs. Foreground; prints `ready` once mounted;
    /// `umount MOUNTPOINT` ends it.
    Memfs {
        /// Where to mount (an existing, empty directory).
        mountpoint: PathBuf,
        /// FUSE threads (as an rmemfs mount has).
        #[arg(long, default_value_t = rmemfs::config::FUSE_THREADS)]
        threads: usize,
    },
    /// What the authenticated handshake costs: control connections to a server with a
    /// secret against one without, side by side.
    Handshake {
        /// Connections to each server.
        #[arg(long, default_value_t = 200)]
        iters: usize,
    },
    /// What FUSE's cheapest round trip costs here: a null file system (no rmemfs code)
    /// answering getxattr with ENODATA, and the same request on an rmemfs file (--against),
    /// measured one after the other in this process. Needs root (or fusermount3).
    FuseFloor {
        /// Round trips per file system.
        #[arg(long, default_value_t = 20000)]
        iters: usize,
        /// The null file system's FUSE threads (default: as many as an rmemfs mount).
        #[arg(long, default_value_t = rmemfs::config::FUSE_THREADS)]
        threads: usize,
        /// A file on an rmemfs mount to measure the same request on.
        #[arg(long, value_name = "FILE")]
        against: Option<PathBuf>,
        /// Also the null file system served through FUSE over io_uring (Linux 6.14+; turns
        /// the fuse module's enable_uring on for the mount, then back as it was).
        #[arg(long)]
        uring: bool,
        /// Also write the figures to FILE as JSON (per measure and target: p50, p99, mean).
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
    },
    /// (benchmark helper) the plain-TCP peer that `fabric` compares against.
    #[command(hide = true)]
    Peer {
        #[arg(long)]
        listen: SocketAddr,
    },
}

/// `rmemfs-bench mount`: the product's mount over two nodes of one in-process network.
fn mount_inprocess(mountpoint: PathBuf, size: u64, options: Vec<String>) -> Result<(), String> {
    use rmemfs::fabric::local::LocalNetwork;
    use std::io::Write;
    let net = LocalNetwork::new();
    let mut config = rmemfs::mount::MountConfig::new(mountpoint);
    config.size = Some(size);
    config.options = options;
    rmemfs::mount::Mount::new(config)
        .fabrics(net.node(), net.node())
        .run(&mut || {
            println!("ready");
            let _ = std::io::stdout().flush();
        })
}

/// The bench-fio targets, in the order their bars are drawn.
const FIO_TARGETS: [&str; 7] = [
    "tmpfs",
    "memfs",
    "sshfs",
    "rmemfs-inproc",
    "rmemfs-1",
    "rmemfs-2r1",
    "rmemfs-2",
];

fn chart(summary: &std::path::Path, out: &std::path::Path) -> Result<(), String> {
    let text = std::fs::read_to_string(summary)
        .map_err(|e| format!("cannot read {}: {e}", summary.display()))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not JSON: {e}", summary.display()))?;
    let svg = rmemfs_lab::fio_chart::render(&value, &FIO_TARGETS)?;
    std::fs::write(out, svg).map_err(|e| format!("cannot write {}: {e}", out.display()))
}

fn main() -> ExitCode {
    // Warnings only by default: the tables are the output.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Chart { summary, out } => chart(&summary, &out),
        Cmd::Bars { spec, out } => rmemfs_lab::bars::render_file(&spec, &out),
        Cmd::FuseFloor {
            iters,
            threads,
            against,
            uring,
            json,
        } => {
            rmemfs_lab::fuse_floor::run(iters, threads, against.as_deref(), uring, json.as_deref())
        }
        Cmd::Peer { listen } => bench::run_peer(listen).map_err(|e| e.to_string()),
        Cmd::Handshake { iters } => bench::find_rmemfs(cli.rmemfs.as_deref()).and_then(|rmemfs| {
            bench::run_handshake(&rmemfs, iters).map_err(|e| format!("benchmark failed: {e}"))
        }),
        Cmd::Mount {
            mountpoint,
            size,
            options,
        } => mount_inprocess(mountpoint, size, options),
        Cmd::Memfs {
            mountpoint,
            threads,
        } => rmemfs_lab::memfs::run(&mountpoint, threads),
        Cmd::Fabric {
            sizes,
            depths,
            bytes,
            latency_iters,
            clients,
        } => bench::find_rmemfs(cli.rmemfs.as_deref()).and_then(|rmemfs| {
            bench::run(&BenchConfig {
                rmemfs,
                sizes,
                depths,
                bytes,
                latency_iters,
                clients,
            })
            .map_err(|e| format!("benchmark failed: {e}"))
        }),
        Cmd::Frrwp {
            sizes,
            iters,
            fabric,
        } => bench::find_rmemfs(cli.rmemfs.as_deref()).and_then(|rmemfs| {
            let options = FabricOptions {
                op_timeout: Duration::from_secs(10),
                device: fabric.device,
                gid_index: fabric.gid_index,
            };
            bench::run_frrwp(&rmemfs, &sizes, iters, &fabric.fabric, &options)
                .map_err(|e| format!("benchmark failed: {e}"))
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("rmemfs-bench: {msg}");
            ExitCode::FAILURE
        }
    }
}
