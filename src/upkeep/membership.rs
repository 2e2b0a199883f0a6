//! Changing a live mount's servers (`rmemfs admin add-server`, `drain`, `remove`): the
//! steps in their order, over the pool (who is in it), the rebuild (which moves copies) and
//! the volume's journal (which names the servers its records use).
//!
//! Why a drain never leaves a chunk short: the draining server leaves placement at once, but
//! what it holds stays readable and writable; the rebuild writes each chunk's new copy
//! before it lets go of the one there (see `DataStore::rebuild_copies`), so a chunk has its
//! full count of live copies throughout. The drain is done when the server itself says it
//! holds none of the mount's extents (chunks, the volume's journal and checkpoint, stock).

use super::figures::{DrainRun, UpkeepFigures};
use crate::fabric::ServerId;
use crate::fs::Fs;
use crate::upkeep::rebuild::{pass, Stop};
use crate::volume::VolumeJournal;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How often a drain reports its progress to the admin command, and every how many of
/// those reports it also logs one (a long drain leaves a trace in the daemon's log without
/// flooding it).
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
const LOG_EVERY_TICKS: u32 = 10;
/// Width of the progress bar in a drain's progress lines.
const BAR_WIDTH: u64 = 20;

/// `[#####-----] 50% ` for `done` of `all`.
fn bar(done: u64, all: u64) -> String {
    let filled = (done.min(all) * BAR_WIDTH)
        .checked_div(all)
        .unwrap_or(BAR_WIDTH);
    let percent = (done.min(all) * 100).checked_div(all).unwrap_or(100);
    format!(
        "[{}{}] {percent:>3}% ",
        "#".repeat(filled as usize),
        "-".repeat((BAR_WIDTH - filled) as usize)
    )
}
/// Passes in a row that move nothing before a drain gives up (no room elsewhere, or a chunk
/// whose only copies are on the draining server and a dead one).
const PASSES_WITHOUT_PROGRESS: u32 = 3;
/// How long a drain waits for the frees it caused to be answered before it asks the server
/// what it still holds.
const FREES_SETTLE: Duration = Duration::from_secs(5);

/// What a finished drain did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Drained {
    pub bytes_moved: u64,
    pub chunks_moved: u64,
    pub seconds: f64,
}

fn find(fs: &Fs, addr: SocketAddr) -> Result<ServerId, String> {
    fs.data().pool().server_at(addr).ok_or_else(|| {
        let known: Vec<String> = fs
            .data()
            .pool()
            .status()
            .iter()
            .filter(|s| s.state != crate::client::ServerState::Removed)
            .map(|s| s.addr.to_string())
            .collect();
        format!(
            "memory server {addr} is not in this mount (its servers: {})",
            known.join(", ")
        )
    })
}

/// Adds the server at `addr`: connected, named in the volume's root (with a volume, at the
/// volume's epoch) and only then put into placement.
pub fn add_server(
    fs: &Fs,
    journal: Option<&VolumeJournal>,
    addr: SocketAddr,
) -> Result<ServerId, String> {
    let pool = fs.data().pool();
    // A server being drained (or whose drain stopped) goes back into placement: the way to
    // call a drain off. Its copies stay where they are.
    if let Some(id) = pool.server_at(addr).filter(|&id| pool.is_draining(id)) {
        pool.set_draining(id, false).map_err(|e| e.to_string())?;
        log::warn!("memory server {addr} ({id}) is back in placement (its drain called off)");
        return Ok(id);
    }
    let id = pool.add_server(addr).map_err(|e| e.to_string())?;
    if let Some(j) = journal {
        if let Err(e) = j.add_member(id.0, &addr.to_string()) {
            // Out of placement it stays: nothing of the volume may land where the root does
            // not name it.
            return Err(format!(
                "{addr} joined, but the volume's root could not name it ({}); it stays out \
                 of placement",
                e.message
            ));
        }
    }
    pool.set_draining(id, false).map_err(|e| e.to_string())?;
    Ok(id)
}

/// What moves or counts every file's copies needs every file: a shared client that holds
/// part of the namespace (it joined holding the root alone, or it is not the keeper of a
/// large volume: `volume::shared`'s loads) loads the rest first, and holds it from then on.
fn whole_namespace(fs: &Fs) -> Result<(), String> {
    fs.load_whole_shared().map_err(|e| {
        format!(
            "this client could not load the whole shared namespace, which this needs: {}",
            e.message
        )
    })
}

/// Drains the server at `addr`: out of placement now, every copy moved off it (at most
/// `rate` bytes per second, 0: no limit), the journal and checkpoint too; returns once it
/// holds nothing of the mount. `progress` hears every [`PROGRESS_EVERY`]; `figures` show
/// the drain and its rebuild passes. Refused when the other servers cannot keep the copy
/// count.
pub fn drain(
    fs: &Fs,
    journal: Option<&VolumeJournal>,
    figures: &UpkeepFigures,
    addr: SocketAddr,
    rate: u64,
    stop: &Stop,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Drained, String> {
    whole_namespace(fs)?;
    let pool = fs.data().pool();
    let id = find(fs, addr)?;
    if !pool.is_live(id) {
        return Err(format!(
            "memory server {addr} is down: nothing can be read off it (the rebuild restores \
             its copies elsewhere)"
        ));
    }
    let copies = fs.data().replicas();
    let others = pool.placeable_servers() - usize::from(!pool.is_draining(id));
    if others < copies {
        return Err(format!(
            "without {addr}, {others} servers would hold {copies} copies of each chunk: add a \
             server or lower the count (`rmemfs admin set-replicas`) first"
        ));
    }
    pool.set_draining(id, true).map_err(|e| e.to_string())?;
    let start = Instant::now();
    let at_start = fs.replica_health().moving_bytes;
    *figures.drain.lock() = Some(DrainRun {
        server: addr.to_string(),
        started: start,
        bytes_at_start: at_start,
    });
    log::warn!("draining memory server {addr} ({id}): {at_start} bytes of copies to move");
    let done = Stop::default();
    let outcome = std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut ticks = 0u32;
            while !done.wait(PROGRESS_EVERY) && !stop.is_stopped() {
                ticks += 1;
                let left = fs.replica_health().moving_bytes;
                let moved = at_start.saturating_sub(left);
                let secs = start.elapsed().as_secs_f64();
                let rate = moved as f64 / secs.max(1e-3);
                let eta = if rate > 0.0 {
                    format!(", about {:.0} s to go", left as f64 / rate)
                } else {
                    String::new()
                };
                let line = format!(
                    "{}{moved} of {at_start} bytes moved off {addr} ({:.0} MB/s){eta}",
                    bar(moved, at_start),
                    rate / 1e6
                );
                if ticks.is_multiple_of(LOG_EVERY_TICKS) {
                    log::info!("drain: {line}");
                }
                progress(&line);
            }
        });
        let r = move_everything(fs, journal, &figures.rebuild, id, rate, stop);
        done.stop();
        r
    });
    *figures.drain.lock() = None;
    let (chunks_moved, bytes_moved) = outcome?;
    let seconds = start.elapsed().as_secs_f64();
    log::warn!(
        "drained memory server {addr} ({id}): {chunks_moved} chunks ({bytes_moved} bytes) \
         moved in {seconds:.1} s; it holds nothing of this mount"
    );
    Ok(Drained {
        bytes_moved,
        chunks_moved,
        seconds,
    })
}

/// Passes until server `id` holds none of the mount's extents; (chunks, bytes) copied.
fn move_everything(
    fs: &Fs,
    journal: Option<&VolumeJournal>,
    shown: &super::figures::RebuildStats,
    id: ServerId,
    rate: u64,
    stop: &Stop,
) -> Result<(u64, u64), String> {
    let pool = fs.data().pool();
    let (mut chunks, mut bytes, mut idle) = (0, 0, 0);
    loop {
        if stop.is_stopped() {
            return Err(
                "the mount is ending: the drain stopped (the server stays out of \
                        placement until the next mount)"
                    .into(),
            );
        }
        let before = fs.replica_health().moving_bytes;
        let out = pass(fs, rate, stop, shown);
        chunks += out.chunks_rebuilt;
        bytes += out.bytes_copied;
        let moved_journal = match journal {
            Some(j) => j.move_off_draining().map_err(|e| e.message)?,
            None => false,
        };
        // Frees of a volume wait for the record that drops their extent.
        if let Some(r) = fs.sync() {
            r.map_err(|e| e.message)?;
        }
        pool.settle_frees(FREES_SETTLE);
        let held = pool.held_on(id).map_err(|e| e.to_string())?;
        if held.extents == 0 {
            return Ok((chunks, bytes));
        }
        let after = fs.replica_health().moving_bytes;
        if after < before || out.bytes_copied > 0 || moved_journal {
            idle = 0;
            continue;
        }
        idle += 1;
        if idle >= PASSES_WITHOUT_PROGRESS {
            let h = fs.replica_health();
            return Err(format!(
                "the drain is stuck: {} extents ({} bytes) are still there, {} chunks with a \
                 copy to move ({} bytes); the other servers have no room for them, or their \
                 other copies are on servers that are down. The server stays out of placement",
                held.extents, held.bytes, h.moving, h.moving_bytes
            ));
        }
    }
}

/// A rebalance stops once every server in placement is this close (relative) to the mean
/// used fraction: inside the 10% an admin is promised, with room for what changes meanwhile.
pub const REBALANCE_TOLERANCE: f64 = 0.05;

/// What a rebalance did.
#[derive(Debug, Clone, PartialEq)]
pub struct Rebalanced {
    pub chunks_moved: u64,
    pub bytes_moved: u64,
    pub seconds: f64,
    /// Each server's used fraction at the end (none: not in placement).
    pub fractions: Vec<Option<f64>>,
}

/// Moves copies from the fullest servers to the emptiest until every server in placement is
/// within [`REBALANCE_TOLERANCE`] of the mean used fraction (or no move helps), at most
/// `rate` bytes per second (0: no limit).
pub fn rebalance(
    fs: &Fs,
    rate: u64,
    stop: &Stop,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Rebalanced, String> {
    whole_namespace(fs)?;
    let pool = fs.data().pool();
    pool.refresh();
    let mut ledger = crate::data::Ledger::of(pool);
    let start = Instant::now();
    let mut last_told = start;
    let (mut chunks_moved, mut bytes_moved) = (0u64, 0u64);
    'passes: loop {
        let before = bytes_moved;
        for (ino, file) in fs.files_by_ino() {
            let indexes: Vec<u64> = fs.data().view(&file).iter().map(|(i, _)| *i).collect();
            for idx in indexes {
                if ledger.balanced(REBALANCE_TOLERANCE) || stop.is_stopped() {
                    break 'passes;
                }
                let moved = {
                    let mut io = fs.data().lock(&file);
                    let moved = io.balance_chunk(idx, &mut ledger);
                    fs.commit_extents(ino, &mut io);
                    moved
                };
                if moved == 0 {
                    continue;
                }
                chunks_moved += 1;
                bytes_moved += moved;
                if last_told.elapsed() >= PROGRESS_EVERY {
                    last_told = Instant::now();
                    progress(&format!(
                        "rebalance: {bytes_moved} bytes moved ({:.0} MB/s); mean use {:.1}%",
                        bytes_moved as f64 / start.elapsed().as_secs_f64() / 1e6,
                        ledger.mean() * 100.0
                    ));
                }
                if rate > 0 {
                    let due = Duration::from_secs_f64(bytes_moved as f64 / rate as f64);
                    if let Some(ahead) = due.checked_sub(start.elapsed()) {
                        stop.wait(ahead);
                    }
                }
            }
        }
        if bytes_moved == before {
            break; // a whole pass found no move that helps
        }
    }
    if let Some(r) = fs.sync() {
        r.map_err(|e| e.message)?;
    }
    pool.settle_frees(FREES_SETTLE);
    pool.refresh();
    let out = Rebalanced {
        chunks_moved,
        bytes_moved,
        seconds: start.elapsed().as_secs_f64(),
        fractions: crate::data::Ledger::of(pool).fractions(),
    };
    log::warn!(
        "rebalance: {chunks_moved} chunk copies ({bytes_moved} bytes) moved in {:.1} s",
        out.seconds
    );
    Ok(out)
}

/// Forgets drained server `addr`: the volume's root stops naming it (after a checkpoint, so
/// no record does), then the pool lets it go.
pub fn remove(fs: &Fs, journal: Option<&VolumeJournal>, addr: SocketAddr) -> Result<(), String> {
    whole_namespace(fs)?;
    let pool = fs.data().pool();
    let id = find(fs, addr)?;
    // Checked before the journal forgets it, and again by the pool as it lets it go.
    pool.check_removable(id).map_err(|e| match e {
        crate::client::PoolError::Invalid(why) => why,
        e => e.to_string(),
    })?;
    if let Some(j) = journal {
        j.forget_member(id.0).map_err(|e| e.message)?;
    }
    pool.remove_server(id).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_progress_bar_fills_with_the_bytes_moved() {
        assert_eq!(super::bar(0, 100), "[--------------------]   0% ");
        assert_eq!(super::bar(50, 100), "[##########----------]  50% ");
        assert_eq!(super::bar(100, 100), "[####################] 100% ");
        assert_eq!(super::bar(0, 0), "[####################] 100% ");
    }
}
