//! `rmemfs-mrrc-sim`: replays registration traces through the registration caches (see
//! [`rmemfs_lab::mrrc_sim`]). A lab binary, apart from the product's `rmemfs`.

use clap::Parser;
use rmemfs_lab::mrrc_sim::{self, CostModel, LinearCost, SimConfig, Workload};
use std::path::PathBuf;
use std::process::ExitCode;

/// Replay a trace of registration requests through the registration caches (MRRC, LRU
/// pin-down, none) over a range of cache sizes, with the cost model of the MRRC paper.
///
/// Prints a table and writes OUT/<workload>.csv and OUT/<workload>.svg (hit ratio and
/// total registration cost against cache size). Each request is registered (looked up)
/// and released at once; the cost is formula (1) of the paper: a_r*pages + b_r per
/// registration plus a_d*pages + b_d per deregistration call (batch).
#[derive(Parser)]
#[command(name = "rmemfs-mrrc-sim", version)]
struct Cli {
    /// cello (Cello92-like: 1-2 page requests, ~80% 2 pages, strong locality), httpd
    /// (HTTPD-like: files of 1-32 pages, Zipf popularity) or file:PATH (a trace: one
    /// `ADDRESS LENGTH` in bytes a line, decimal or 0x-hex, `#` comments).
    #[arg(long)]
    workload: Workload,
    /// Requests to generate (default 100000); with file:PATH, the most to replay (default
    /// all).
    #[arg(long)]
    requests: Option<usize>,
    /// Seed of the generated workloads.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Cache sizes in pages (4 KiB), comma separated (default 32,64,...,16384).
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<u64>,
    /// Registration cost PER_PAGE,PER_CALL in microseconds.
    #[arg(long, default_value = "0.77,7.42")]
    reg_cost: LinearCost,
    /// Deregistration cost PER_PAGE,PER_CALL in microseconds (one call per batch).
    #[arg(long, default_value = "0.22,1.1")]
    dereg_cost: LinearCost,
    /// Directory for the CSV and SVG files.
    #[arg(long, default_value = "target/mrrc-sim")]
    out: PathBuf,
    /// Also write the replayed trace to this file (the file:PATH format).
    #[arg(long)]
    dump_trace: Option<PathBuf>,
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let result = mrrc_sim::run(&SimConfig {
        workload: cli.workload,
        requests: cli.requests,
        seed: cli.seed,
        sizes: cli.sizes,
        cost: CostModel {
            reg: cli.reg_cost,
            dereg: cli.dereg_cost,
        },
        out: cli.out,
        dump_trace: cli.dump_trace,
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("rmemfs-mrrc-sim: {msg}");
            ExitCode::FAILURE
        }
    }
}
