//! A model of many clients changing one shared volume (#44): how many creates per second N
//! clients make together, for rmemfs's shared format 5 and for JuiceFS's protocol on the same
//! engine, at a given round-trip time to the engine.
//!
//! Why a model and not a cluster: this machine has two cores, so three clients already share
//! the CPU with the engine; the question is where the curve bends at 8, 32 or 128 clients,
//! each on a node of its own. The model is a closed queueing network solved exactly by Mean
//! Value Analysis (MVA): each client thinks (its own CPU, FUSE, the network's delay) and then
//! queues at the engine, one single-threaded server (Redis), for the engine's work of one
//! operation; N clients circulate. What each protocol puts on the engine:
//! - rmemfs, own directories: one append script per create (the lookup of a name in a
//!   directory whose turn the client holds needs no catch-up), plus every other client
//!   reading the change once (its poller's range read): engine work `append + (N-1) *
//!   read_entry`. Every client also applies every change: a client's daemon spends
//!   `apply` per change of the whole volume, a ceiling of `1 / apply` changes per second
//!   (one core for it).
//! - rmemfs, one shared directory (format 5): clients add names there at once (each name a
//!   key of its own, the directory touched shared), but none holds the directory's turn, so
//!   a create's lookup that finds nothing catches up first: two round trips per create (the
//!   catch-up's range read, `read_call`, then the append), the engine's work `append +
//!   name_key + read_call + (N-1) * read_entry`. At one client, the client holds the turn
//!   (one round trip, as in its own directory). Before format 5 the turn passed between
//!   clients, a holder keeping it 10 ms once asked: `one_dir_passing`, kept for the record.
//! - JuiceFS, own directories: a create is a lookup and a transaction watching the parent
//!   (`pkg/meta/redis.go` doMknod: WATCH, reads, MULTI/EXEC): `juicefs_calls` round trips and
//!   as many engine calls, no replay (clients cache with a TTL).
//! - JuiceFS, one shared directory: the transactions watch the same parent, so at most one
//!   commits per transaction window (its last two round trips); the others retry.
//!
//! Calibrated on this machine (loopback Redis, `lab/scripts/bench-shared.sh` and the
//! engine's own `INFO commandstats`), and checked against its 1- and 3-client figures: there
//! the clients share two cores with Redis, so rmemfs's figures are capped by the machine's
//! CPU per create (`machine_cpu`, measured), which clients on nodes of their own do not
//! share. Where the check misses, the model is optimistic: three clients in one directory
//! make 5,188 creates/s here against its 9,560 (each create's catch-up reads and applies
//! the others' changes on the same two cores, which the cap, measured in clients' own
//! directories, does not count), and JuiceFS's three clients 2,410 against 4,240 (its CPU
//! per create was not measured, so not capped).

use std::fmt::Write as _;

/// What one operation costs, in microseconds.
#[derive(Debug, Clone, Copy)]
pub struct Costs {
    /// A client's own time per create besides the network: its CPU and FUSE's round trips.
    pub client: f64,
    /// The engine's work for rmemfs's append script.
    pub append: f64,
    /// The engine's work per change read by another client's poller.
    pub read_entry: f64,
    /// A client's work to apply another client's change (a ceiling: one core applies at most
    /// `1e6 / apply` changes per second).
    pub apply: f64,
    /// The engine's extra work for a change that touches a name's key too (format 5: one
    /// more key, and a second version read for each exclusive one): Redis's own time per
    /// create went from 45.5 to 54.0 µs with it (`lab/scripts/ab-shared.sh`, 2026-12-05).
    pub name_key: f64,
    /// The engine's work for one catch-up's range read of the log, besides the changes read.
    pub read_call: f64,
    /// How long a wanted directory turn is kept (`TURN_MIN_HOLD`; before format 5).
    pub hold: f64,
    /// JuiceFS's client time per create besides the network.
    pub juicefs_client: f64,
    /// JuiceFS's engine calls (and round trips) per create.
    pub juicefs_calls: f64,
    /// The engine's work per JuiceFS call.
    pub juicefs_call: f64,
    /// This machine's CPU per create, all processes together, measured (`/proc/stat` during
    /// three rmemfs clients' creates), for the check against the figures measured here.
    /// JuiceFS's was not measured: its check is not capped.
    pub machine_cpu: f64,
    pub machine_cores: f64,
}

impl Default for Costs {
    /// Calibrated here on 2026-12-05 (format 5; `lab/scripts/shared-cpu.sh`, medians of
    /// three rounds): one rmemfs client made 4,508 creates/s (222 µs each: a loopback round
    /// trip about 70 µs, Redis's own time per script 35 to 47 µs, the rest the client), three
    /// used 193 µs of CPU per create over all processes; one JuiceFS client 1,336/s (748 µs:
    /// five round trips, Go and FUSE included; 2026-11-30). On 2026-11-30 (format 2) a script
    /// took 16 µs and the machine 127 µs per create: the scripts have grown since (open
    /// marks, servers' births, names' keys) and the day was faster.
    fn default() -> Costs {
        Costs {
            client: 110.0,
            append: 32.0,
            read_entry: 1.0,
            name_key: 8.0,
            read_call: 5.0,
            apply: 8.0,
            hold: 10_000.0,
            juicefs_client: 300.0,
            juicefs_calls: 5.0,
            juicefs_call: 10.0,
            machine_cpu: 193.0,
            machine_cores: 2.0,
        }
    }
}

/// Throughput (operations per second) of `n` clients, each thinking `think` µs, at one
/// queueing server with `demand(n)` µs of work per operation: exact MVA.
fn mva(n: usize, think: f64, demand: impl Fn(usize) -> f64) -> f64 {
    let mut queue = 0.0;
    let mut x = 0.0;
    let d = demand(n);
    for k in 1..=n {
        let response = d * (1.0 + queue);
        x = k as f64 / (think + response);
        queue = x * response;
    }
    x * 1e6
}

/// The four curves' figures at `n` clients and round trip `rtt` µs.
#[derive(Debug, Clone, Copy)]
pub struct Point {
    pub clients: usize,
    pub rmemfs_own: f64,
    pub rmemfs_one_dir: f64,
    /// One directory before format 5 (its turn passing between clients).
    pub rmemfs_one_dir_passing: f64,
    pub juicefs_own: f64,
    pub juicefs_one_dir: f64,
}

pub fn point(c: &Costs, n: usize, rtt: f64) -> Point {
    let append = c.append + c.name_key;
    let own = mva(n, c.client + rtt, |n| {
        append + (n as f64 - 1.0) * c.read_entry
    })
    .min(1e6 / c.apply);
    // One directory: side by side, each create a catch-up and an append.
    let one_dir = if n == 1 {
        own
    } else {
        mva(n, c.client + 2.0 * rtt, |n| {
            append + c.read_call + (n as f64 - 1.0) * c.read_entry
        })
        .min(1e6 / c.apply)
    };
    // Before format 5: creates at one client's speed while the turn is held, a pass (four
    // round trips and scripts) per hold once several clients ask.
    let single = 1e6 / (c.client + rtt + c.append);
    let passing = if n == 1 {
        single
    } else {
        let pass = 4.0 * (rtt + c.append);
        single * c.hold / (c.hold + pass)
    };
    let jfs_think = c.juicefs_client + c.juicefs_calls * rtt;
    let jfs_own = mva(n, jfs_think, |_| c.juicefs_calls * c.juicefs_call);
    // One committed transaction per window of its last two round trips (WATCH … EXEC).
    let window = 2.0 * rtt + 2.0 * c.juicefs_call;
    let jfs_one = jfs_own.min(if n == 1 { jfs_own } else { 1e6 / window });
    Point {
        clients: n,
        rmemfs_own: own,
        rmemfs_one_dir: one_dir,
        rmemfs_one_dir_passing: passing,
        juicefs_own: jfs_own,
        juicefs_one_dir: jfs_one,
    }
}

/// The model at this machine's round trip, capped by its cores (for the check).
pub fn on_this_machine(c: &Costs, n: usize, rtt: f64) -> Point {
    let p = point(c, n, rtt);
    let cap = c.machine_cores * 1e6 / c.machine_cpu;
    Point {
        rmemfs_own: p.rmemfs_own.min(cap),
        rmemfs_one_dir: p.rmemfs_one_dir.min(cap),
        rmemfs_one_dir_passing: p.rmemfs_one_dir_passing.min(cap),
        ..p
    }
}

/// The table of every round trip and client count, as text and as CSV.
pub fn tables(c: &Costs, rtts_ms: &[f64], clients: &[usize]) -> (String, String) {
    let mut text = String::new();
    let mut csv =
        String::from("rtt_ms,clients,rmemfs_own,rmemfs_one_dir,juicefs_own,juicefs_one_dir\n");
    for &rtt in rtts_ms {
        let _ = writeln!(
            text,
            "round trip {rtt} ms: creates/s\n{:>8}{:>14}{:>16}{:>14}{:>14}{:>16}{:>10}",
            "clients",
            "rmemfs own",
            "rmemfs one-dir",
            "(format 4)",
            "juicefs own",
            "juicefs one-dir",
            "own x"
        );
        for &n in clients {
            let p = point(c, n, rtt * 1000.0);
            let _ = writeln!(
                text,
                "{n:>8}{:>14.0}{:>16.0}{:>14.0}{:>14.0}{:>16.0}{:>10.1}",
                p.rmemfs_own,
                p.rmemfs_one_dir,
                p.rmemfs_one_dir_passing,
                p.juicefs_own,
                p.juicefs_one_dir,
                p.rmemfs_own / p.juicefs_own
            );
            let _ = writeln!(
                csv,
                "{rtt},{n},{:.0},{:.0},{:.0},{:.0}",
                p.rmemfs_own, p.rmemfs_one_dir, p.juicefs_own, p.juicefs_one_dir
            );
        }
        let _ = writeln!(text);
    }
    (text, csv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mva_of_one_client_is_its_cycle() {
        assert!((mva(1, 80.0, |_| 20.0) - 10_000.0).abs() < 1e-6);
        // Many clients saturate the server: at most one operation per demand.
        assert!(mva(1000, 80.0, |_| 20.0) <= 50_000.0 + 1e-6);
    }

    #[test]
    fn curves_bend_where_the_engine_fills() {
        let c = Costs::default();
        let at = |n| point(&c, n, 200.0);
        let counts = [1, 2, 4, 8, 16, 32, 64, 128];
        let best = counts
            .iter()
            .copied()
            .max_by(|a, b| at(*a).rmemfs_own.total_cmp(&at(*b).rmemfs_own))
            .unwrap();
        // Clients scale until the engine fills; then every client reading every change
        // makes each change dearer, and the aggregate falls.
        assert!((4..=64).contains(&best), "{best}");
        assert!(at(best).rmemfs_own > 5.0 * at(1).rmemfs_own);
        assert!(at(128).rmemfs_own < at(best).rmemfs_own);
        assert!(at(128).rmemfs_one_dir <= at(128).rmemfs_own);
        // In one directory, clients side by side gain on one; the turn passing did not.
        assert!(at(3).rmemfs_one_dir > 1.5 * at(1).rmemfs_one_dir);
        assert!(at(3).rmemfs_one_dir_passing <= at(1).rmemfs_one_dir_passing);
        assert!(at(128).juicefs_one_dir <= at(128).juicefs_own);
    }
}
