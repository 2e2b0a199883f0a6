//! The `rmemfs` command line: parses arguments, picks the fabric, and calls the library.

use clap::{Parser, Subcommand};
use rmemfs::bench::{self, BenchConfig};
use rmemfs::fabric::tcp::{TcpConfig, TcpFabric};
use rmemfs::fabric::Fabric;
use rmemfs::server::{MemoryServer, ServerConfig, DEFAULT_PORT};
use rmemfs::size::{format_size, parse_size};
use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

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
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a memory server: lend SIZE bytes of this machine's RAM to rmemfs clients.
    Serve {
        /// Address and port to listen on for control connections. The TCP fabric's data
        /// connections use a second, ephemeral port on the same address. The default listens on
        /// loopback only; give a routable address to serve other machines.
        #[arg(long, default_value_t = SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT)))]
        listen: SocketAddr,
        /// Size of the memory arena to lend, e.g. 512M, 8G. Pages are only used (and pinned)
        /// where clients allocate.
        #[arg(long, default_value = "1G", value_parser = parse_size)]
        size: u64,
        /// Data fabric: `tcp` (software RDMA over TCP). `verbs` arrives with the verbs fabric.
        #[arg(long, default_value = "tcp")]
        fabric: String,
        /// Seconds without progress after which a one-sided operation fails.
        #[arg(long, default_value_t = 10)]
        op_timeout: u64,
    },
    /// Measure the TCP fabric against plain TCP on loopback (throughput and latency ratios).
    BenchFabric {
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
    /// (benchmark helper) the plain-TCP peer that bench-fabric compares against.
    #[command(hide = true)]
    BenchPeer {
        #[arg(long)]
        listen: SocketAddr,
    },
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Serve {
            listen,
            size,
            fabric,
            op_timeout,
        } => serve(listen, size, &fabric, Duration::from_secs(op_timeout)),
        Cmd::BenchFabric {
            sizes,
            depths,
            bytes,
            latency_iters,
            clients,
        } => bench::run(&BenchConfig {
            sizes,
            depths,
            bytes,
            latency_iters,
            clients,
        })
        .map_err(|e| format!("benchmark failed: {e}")),
        Cmd::BenchPeer { listen } => bench::run_peer(listen).map_err(|e| e.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("rmemfs: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn make_fabric(name: &str, op_timeout: Duration) -> Result<Arc<dyn Fabric>, String> {
    match name {
        "tcp" => Ok(TcpFabric::new(TcpConfig {
            op_timeout,
            ..TcpConfig::default()
        })),
        "verbs" => {
            Err("the verbs fabric is not built into this binary yet; use --fabric tcp".into())
        }
        other => Err(format!("unknown fabric '{other}' (expected tcp or verbs)")),
    }
}

fn serve(listen: SocketAddr, size: u64, fabric: &str, op_timeout: Duration) -> Result<(), String> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let fabric = make_fabric(fabric, op_timeout)?;
    let fabric_name = fabric.name();
    // Register the signal handlers before announcing readiness, so a signal sent right after
    // the "listening" line is never missed.
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let mut server =
        MemoryServer::start(&ServerConfig { listen, size }, fabric).map_err(|e| e.to_string())?;
    println!(
        "rmemfs serve: listening on {} (arena {}, fabric {fabric_name}, memlock limit {})",
        server.local_addr(),
        format_size(server.capacity().total),
        rmemfs::fabric::mem::memlock_limit_text()
    );
    let _ = std::io::stdout().flush();
    if let Some(sig) = signals.forever().next() {
        log::warn!("signal {sig}: shutting down");
    }
    server.shutdown();
    eprintln!("rmemfs serve: stopped");
    Ok(())
}
