//! `rmemfs-shared-sim`: many clients of one shared volume, on paper (see
//! [`rmemfs_lab::shared_sim`]). A lab binary, apart from the product's `rmemfs`.

use clap::Parser;
use rmemfs_lab::shared_sim::{self, Costs};
use std::path::PathBuf;
use std::process::ExitCode;

/// Creates per second of 1 to 128 clients on one shared volume (own directories and one
/// shared directory), rmemfs's protocol beside JuiceFS's, at several round trips to the
/// engine; then the model at this machine's round trip beside the figures measured here.
///
/// Prints the tables and writes OUT/shared-sim.csv.
#[derive(Parser)]
#[command(name = "rmemfs-shared-sim", version)]
struct Cli {
    /// Round trips to the engine, in milliseconds, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.2,1")]
    rtt_ms: Vec<f64>,
    /// Client counts, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,8,16,32,64,128")]
    clients: Vec<usize>,
    /// This machine's round trip to Redis on loopback, in milliseconds (for the check).
    #[arg(long, default_value_t = 0.07)]
    local_rtt_ms: f64,
    /// Figures measured here (bench-shared.sh, medians of three rounds, 2026-12-05, format
    /// 5): rmemfs creates/s with 1 and 3 clients in their own directories, and with 3 in one
    /// directory.
    #[arg(long, value_delimiter = ',', default_value = "4208,7933,5188")]
    measured_rmemfs: Vec<f64>,
    /// The same for JuiceFS on the same Redis.
    #[arg(long, value_delimiter = ',', default_value = "1431,2410,1887")]
    measured_juicefs: Vec<f64>,
    /// Directory for the CSV.
    #[arg(long, default_value = "target/shared-sim")]
    out: PathBuf,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let costs = Costs::default();
    let (text, csv) = shared_sim::tables(&costs, &cli.rtt_ms, &cli.clients);
    print!("{text}");
    println!(
        "this machine (round trip {} ms, two cores shared by every process): model | measured",
        cli.local_rtt_ms
    );
    println!(
        "{:>24}{:>12}{:>12}{:>14}{:>12}",
        "", "1 client", "3 clients", "3 in one dir", "gain x3"
    );
    let at = |n| shared_sim::on_this_machine(&costs, n, cli.local_rtt_ms * 1000.0);
    let (one, three) = (at(1), at(3));
    let rows = [
        (
            "rmemfs model",
            [one.rmemfs_own, three.rmemfs_own, three.rmemfs_one_dir],
        ),
        (
            "rmemfs measured",
            [
                cli.measured_rmemfs[0],
                cli.measured_rmemfs[1],
                cli.measured_rmemfs[2],
            ],
        ),
        (
            "juicefs model",
            [one.juicefs_own, three.juicefs_own, three.juicefs_one_dir],
        ),
        (
            "juicefs measured",
            [
                cli.measured_juicefs[0],
                cli.measured_juicefs[1],
                cli.measured_juicefs[2],
            ],
        ),
    ];
    for (name, [a, b, c]) in rows {
        println!("{name:>24}{a:>12.0}{b:>12.0}{c:>14.0}{:>12.2}", b / a);
    }
    if let Err(e) = std::fs::create_dir_all(&cli.out)
        .and_then(|()| std::fs::write(cli.out.join("shared-sim.csv"), csv))
    {
        eprintln!("rmemfs-shared-sim: writing {}: {e}", cli.out.display());
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
