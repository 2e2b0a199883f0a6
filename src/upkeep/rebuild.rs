//! Background rebuild: chunks that lost a copy (its server died) get it back on another
//! server with room, so the pool can lose the next server without losing data.
//!
//! Writes already repair the chunks they touch; the rebuild covers the rest. One pass visits
//! every file and, in each, every chunk short of copies: the chunk's copy happens with that
//! file's chunk map locked for writing, so no write races it (a write either lands before the
//! copy, and is copied, or after, and goes to every copy), and foreground I/O on the file
//! waits at most one chunk copy. Passes run when the set of live servers changes, and again
//! after [`RETRY`] while a pass left chunks degraded (no room anywhere). The copy rate is
//! held to `--rebuild-rate` so foreground traffic keeps the rest of the link.

use crate::client::Rejoin;
use crate::fabric::ServerId;
use crate::fs::Fs;
use crate::sync::atomic::Ordering;
use crate::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How often the rebuild thread looks at the live servers (more often when the rebuild
/// delay is shorter, but never busier than [`SCAN_MIN`]).
const SCAN_INTERVAL: Duration = Duration::from_secs(1);
const SCAN_MIN: Duration = Duration::from_millis(100);
/// A pass that left chunks degraded (no server with room) is tried again this often: room
/// comes back when files are removed, without any server changing state.
const RETRY: Duration = Duration::from_secs(30);
/// A shared volume's member that is not its rebuilder asks for the role again this often
/// while chunks are short: it takes over within this once the rebuilder's lease ran out.
const ROLE_RETRY: Duration = Duration::from_secs(2);

use super::figures::{RebuildStats, UpkeepFigures, UpkeepPanics};

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PassOutcome {
    pub chunks_rebuilt: u64,
    pub bytes_copied: u64,
    pub left_degraded: u64,
    /// Another member of a shared volume is its rebuilder: this pass copied nothing.
    pub left_to_another: bool,
}

/// A stop signal the rebuild waits on (so unmount does not wait out a pause).
#[derive(Default)]
pub struct Stop {
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl Stop {
    pub fn stop(&self) {
        *self.stopped.lock() = true;
        self.wake.notify_all();
    }
    pub fn is_stopped(&self) -> bool {
        *self.stopped.lock()
    }
    /// Waits up to `d`; true if stopped.
    pub fn wait(&self, d: Duration) -> bool {
        let deadline = Instant::now() + d;
        let mut stopped = self.stopped.lock();
        while !*stopped {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            stopped = self.wake.wait_timeout(stopped, left).0;
        }
        *stopped
    }
}

/// One rebuild pass over every file, copying at most `rate` bytes per second (0: as fast as
/// it goes), its progress shown in `stats`. Stops early when `stop` is signalled.
pub fn pass(fs: &Fs, rate: u64, stop: &Stop, stats: &RebuildStats) -> PassOutcome {
    let data = fs.data();
    stats.running.store(true, Ordering::Relaxed);
    let start = Instant::now();
    let mut last_progress = start;
    let mut out = PassOutcome::default();
    for (ino, file) in fs.files_by_ino() {
        if data.view(&file).out_of_step().is_empty() {
            continue;
        }
        // On a shared volume one member rebuilds (the role renewed before each file), each
        // file in its turn: caught up with it, and no other client writes it meanwhile.
        if out.left_to_another || !fs.may_rebuild() {
            out.left_to_another = true;
            out.left_degraded += data.view(&file).degraded().len() as u64;
            continue;
        }
        let _turn = match fs.take_file_turn(ino) {
            Ok(turn) => turn,
            Err(e) => {
                log::warn!("rebuild: inode {ino} waits for the next pass: {e}");
                out.left_degraded += data.view(&file).degraded().len() as u64;
                continue;
            }
        };
        let todo = data.view(&file).out_of_step();
        for idx in todo {
            if stop.is_stopped() {
                break;
            }
            let copied = {
                let mut io = data.lock(&file);
                let copied = io.rebuild_chunk(idx);
                fs.commit_extents(ino, &mut io);
                copied
            };
            if copied == 0 {
                continue;
            }
            out.chunks_rebuilt += 1;
            out.bytes_copied += copied;
            stats.chunks_rebuilt.fetch_add(1, Ordering::Relaxed);
            stats.bytes_copied.fetch_add(copied, Ordering::Relaxed);
            if last_progress.elapsed() >= crate::config::REBUILD_PROGRESS_EVERY {
                last_progress = Instant::now();
                log::info!(
                    "rebuild: {} chunks ({} bytes) copied so far in {:.0} s",
                    out.chunks_rebuilt,
                    out.bytes_copied,
                    start.elapsed().as_secs_f64()
                );
            }
            if rate > 0 {
                // Pace: the bytes so far may take no less than bytes / rate.
                let due = Duration::from_secs_f64(out.bytes_copied as f64 / rate as f64);
                if let Some(ahead) = due.checked_sub(start.elapsed()) {
                    stop.wait(ahead);
                }
            }
        }
        out.left_degraded += data.view(&file).degraded().len() as u64;
    }
    if out.bytes_copied > 0 {
        let secs = start.elapsed().as_secs_f64().max(1e-6);
        stats
            .last_rate
            .store((out.bytes_copied as f64 / secs) as u64, Ordering::Relaxed);
        log::info!(
            "rebuild: {} chunks ({} bytes) copied in {:.1} s; {} still short of copies",
            out.chunks_rebuilt,
            out.bytes_copied,
            secs,
            out.left_degraded
        );
    }
    stats
        .left_degraded
        .store(out.left_degraded, Ordering::Relaxed);
    stats.passes.fetch_add(1, Ordering::Relaxed);
    stats.running.store(false, Ordering::Relaxed);
    out
}

/// The upkeep of a mount's connections and copies.
#[derive(Debug, Clone, Copy)]
pub struct Upkeep {
    /// Most bytes per second a rebuild copies (0: no limit).
    pub rate: u64,
    /// How long the live servers must stay unchanged before a rebuild pass.
    pub delay: Duration,
    /// How long a server may leave a heartbeat unanswered before it is marked down.
    pub detection: Duration,
    /// Copies are made again and the chunk maps kept (false: a volume's follower, whose
    /// maps only the holder's records change; it only reconnects).
    pub rebuild: bool,
}

/// The upkeep threads of a mount: heartbeats to every server (a dead, frozen or cut-off one
/// is marked down within the detection time, the op timeout, even while idle); reconnects to
/// servers that are down, with backoff (one that resumes this mount's session is up again
/// with its copies; one that comes back empty has every copy listed on it forgotten first);
/// and the rebuild, once the live servers have held still for the rebuild delay. A panic in
/// one of them is contained and the thread goes on (see [`supervised`]). All stop (and are
/// joined) on drop.
pub struct Rebuilder {
    stop: Arc<Stop>,
    figures: Arc<UpkeepFigures>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// Heartbeats per detection time: a server is given up on between 3/4 and 1 of it after it
/// stops answering.
const BEATS_PER_DETECTION: u32 = 4;

/// How often the reconnect thread looks for servers due for an attempt (attempts themselves
/// back off from [`crate::config::RECONNECT_BACKOFF_MIN`]).
const RECONNECT_TICK: Duration = Duration::from_millis(100);

/// Forgets every copy listed on `server` (it came back empty): chunks keep their other
/// copies, and a chunk that had none elsewhere is lost (reads of it fail with EIO, never
/// see the empty server's zeros). Returns the copies forgotten.
pub fn forget_server(fs: &Fs, server: ServerId) -> u64 {
    over_chunk_maps(fs, server, |io| io.forget_copies(server))
}

/// A shared volume's server `server`, back empty, is admitted once its birth is in the
/// history ([`Fs::server_reborn`]); false if that failed (tried again next round).
fn admit_reborn(fs: &Fs, server: ServerId) -> bool {
    match fs.server_reborn(server) {
        Some(Err(e)) => {
            log::error!("{server} stays out of use until its birth is in the history: {e}");
            false
        }
        _ => {
            fs.data().pool().admit(server);
            true
        }
    }
}

/// Server `server` came back from a backing file that may hold less than was written to it
/// ([`Rejoin::Behind`]): each chunk with a copy elsewhere lets go of its copy there (the
/// rebuild makes a new one); the rest keep theirs, under the new keys if `keys`, as do the
/// journal's places there. Then the server is admitted and the copies let go of are freed
/// there (held, on a volume, until the records that dropped them commit). Returns (copies
/// let go of, copies kept).
pub fn let_go_of_behind_server(
    fs: &Fs,
    server: ServerId,
    keys: Option<&std::collections::HashMap<u64, u64>>,
) -> (u64, u64) {
    let mut gone = Vec::new();
    let kept = over_chunk_maps(fs, server, |io| {
        io.let_go_of_behind_copies(server, keys, &mut gone)
    });
    if let Some(keys) = keys {
        rekey_journal(fs, server, keys);
    }
    let pool = fs.data().pool();
    pool.admit(server);
    for region in &gone {
        if let Err(e) = pool.free(*region) {
            log::warn!("a stale copy on {server} stays allocated until the next attach: {e}");
        }
    }
    (gone.len() as u64, kept)
}

/// Runs `change` over the chunk map of every file with a copy on `server`, committing what
/// it changed (journaled on a volume; on a shared volume in the file's turn, caught up with
/// it); the sum of what it returns.
fn over_chunk_maps(
    fs: &Fs,
    server: ServerId,
    mut change: impl FnMut(&mut crate::data::FileIo) -> u64,
) -> u64 {
    // Every file's map: a shared client that holds part of the namespace loads the rest.
    if let Err(e) = fs.load_whole_shared() {
        log::error!("the files not loaded here keep their copies on {server} as they are: {e}");
    }
    let on_server =
        |f: &crate::meta::FileData| fs.data().view(f).values().any(|c| c.on(server.0).is_some());
    fs.files_by_ino()
        .iter()
        .filter(|(_, f)| on_server(f))
        .map(|(ino, f)| {
            let _turn = match fs.take_file_turn(*ino) {
                Ok(turn) => turn,
                Err(e) => {
                    log::error!("inode {ino}'s copies on {server} stay as they are: {e}");
                    return 0;
                }
            };
            let mut io = fs.data().lock(f);
            let n = change(&mut io);
            fs.commit_extents(*ino, &mut io);
            n
        })
        .sum()
}

/// Server `server` came back from its backing file with new keys ([`Rejoin::Rekeyed`]):
/// every chunk copy there and the journal's places there take them (journaled like any
/// change of a chunk map). Returns how many chunk copies changed.
pub fn rekey_server(fs: &Fs, server: ServerId, keys: &std::collections::HashMap<u64, u64>) -> u64 {
    let n = over_chunk_maps(fs, server, |io| io.rekey_copies(server, keys));
    rekey_journal(fs, server, keys);
    n
}

/// The journal's places on `server` take its new keys. If they cannot, its journal copies
/// there fail their next write and are dropped (and restored on a fresh ring): nothing is
/// lost.
fn rekey_journal(fs: &Fs, server: ServerId, keys: &std::collections::HashMap<u64, u64>) {
    if let Err(e) = fs.rekey_journal(server.0, keys) {
        log::warn!("the journal's places on {server} keep their old keys: {e}");
    }
}

/// Runs `round` every `tick` until `stop`, as upkeep thread `thread`. A round that panics (a
/// bug) is contained as a FUSE handler's is: logged, counted in `panics`, and the rounds go
/// on, after a pause that doubles while rounds keep panicking one after another (see
/// [`crate::config::UPKEEP_PANIC_BACKOFF_MIN`]). So one panic does not end failure detection,
/// reconnects or rebuilds for the mount's life, and a round that always panics does not
/// spin. What a round keeps from one round to the next lives in `round` and survives a
/// panic; the locks a panic left poisoned are taken over (see [`crate::sync`]).
fn supervised(
    thread: &str,
    stop: &Stop,
    tick: Duration,
    panics: &UpkeepPanics,
    mut round: impl FnMut(),
) {
    use crate::config::{UPKEEP_PANIC_BACKOFF_MAX, UPKEEP_PANIC_BACKOFF_MIN};
    let mut backoff = crate::sync::Backoff::new(UPKEEP_PANIC_BACKOFF_MIN, UPKEEP_PANIC_BACKOFF_MAX);
    while !stop.wait(tick) {
        let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&mut round)) else {
            backoff.reset();
            continue;
        };
        panics.count(thread);
        log::error!(
            "bug: a round of the {thread} thread panicked: {}; the next one in {:?}",
            crate::error::panic_message(&*panic),
            backoff.current()
        );
        if stop.wait(backoff.current()) {
            break;
        }
        backoff.grow();
    }
}

impl Rebuilder {
    /// Starts the upkeep of `fs`, its figures kept in `figures`. Nothing is rebuilt with one
    /// copy per chunk.
    pub fn start(
        fs: Arc<Fs>,
        upkeep: Upkeep,
        figures: Arc<UpkeepFigures>,
    ) -> std::io::Result<Rebuilder> {
        let stop = Arc::new(Stop::default());
        // The live servers the rebuild starts from, read before any thread runs: a server
        // lost before the rebuild thread's first look is a change it must see.
        let mut seen = fs.data().pool().generation();
        let (s, f, g) = (stop.clone(), fs.clone(), figures.clone());
        let detection = upkeep.detection;
        let heartbeat = std::thread::Builder::new()
            .name("heartbeat".into())
            .spawn(move || {
                let tick = detection / BEATS_PER_DETECTION;
                supervised("heartbeat", &s, tick, &g.panics, || {
                    f.fault_point("heartbeat");
                    f.data().pool().heartbeat(detection);
                    // The room just heard of bounds the kernel's dirty data for the mount.
                    f.follow_room();
                });
            })?;
        let (s, f, g) = (stop.clone(), fs.clone(), figures.clone());
        let reconnect = std::thread::Builder::new()
            .name("reconnect".into())
            .spawn(move || {
                // Servers back empty whose birth the shared history does not hold yet.
                let mut unborn: Vec<ServerId> = Vec::new();
                supervised("reconnect", &s, RECONNECT_TICK, &g.panics, || {
                    f.fault_point("reconnect");
                    let pool = f.data().pool();
                    unborn.retain(|&id| !admit_reborn(&f, id));
                    for id in pool.due_for_reconnect() {
                        if s.is_stopped() {
                            return;
                        }
                        match pool.try_reconnect(id) {
                            // The holder forgets or re-keys the copies there, and says so.
                            Some(
                                Rejoin::Empty | Rejoin::Rekeyed { .. } | Rejoin::Behind { .. },
                            ) if !upkeep.rebuild => pool.admit(id),
                            Some(Rejoin::Empty) if f.is_shared() && !admit_reborn(&f, id) => {
                                unborn.push(id)
                            }
                            Some(Rejoin::Empty) if f.is_shared() => {}
                            Some(Rejoin::Empty) => {
                                let n = forget_server(&f, id);
                                log::warn!("forgot {n} chunk copies the restarted {id} held");
                                pool.admit(id);
                            }
                            Some(Rejoin::Behind { keys }) => {
                                let (gone, kept) = let_go_of_behind_server(&f, id, keys.as_ref());
                                log::warn!(
                                    "{id} came back behind what was written to it: let go of \
                                     {gone} chunk copies there for the rebuild to make again; \
                                     {kept} kept (no other copy)"
                                );
                            }
                            Some(Rejoin::Rekeyed { keys }) => {
                                let n = rekey_server(&f, id, &keys);
                                log::warn!("{n} chunk copies on {id} took its new keys");
                                pool.admit(id);
                            }
                            _ => {}
                        }
                    }
                });
            })?;
        // Sends the writes a private mount answered before they were remote (see
        // `data::behind`); each round waits for work itself, so the tick is nothing.
        let (s, f, g) = (stop.clone(), fs.clone(), figures.clone());
        let behind = f
            .data()
            .writes_behind()
            .then(|| {
                std::thread::Builder::new()
                    .name("write-behind".into())
                    .spawn(move || {
                        supervised("write-behind", &s, Duration::ZERO, &g.panics, || {
                            f.data().flush_queued(crate::config::WRITE_BEHIND_IDLE);
                        });
                    })
            })
            .transpose()?;
        let (s, f, g) = (stop.clone(), fs.clone(), figures.clone());
        // Shared volumes keep copies (their clients would each encode chunks another may
        // be writing); a follower's maps are its holder's.
        let encode = (upkeep.rebuild && !f.is_shared())
            .then(|| {
                let scan = match f.data().coding() {
                    Some(_) => super::encode::ENCODE_SCAN,
                    None => super::encode::ENCODE_SCAN_UNASKED,
                };
                std::thread::Builder::new()
                    .name("encode".into())
                    .spawn(move || {
                        supervised("encode", &s, scan, &g.panics, || {
                            f.fault_point("encode");
                            super::encode::pass(&f, &s, &g.encode);
                        });
                    })
            })
            .transpose()?;
        let (s, g) = (stop.clone(), figures.clone());
        let rebuild = upkeep
            .rebuild
            .then(|| {
                std::thread::Builder::new()
                    .name("rebuild".into())
                    .spawn(move || {
                        // When the live servers last changed, while a pass for that is owed (still
                        // owed if the pass panicked, so it is tried again).
                        let mut changed_at: Option<Instant> = None;
                        // The copy count the last pass worked to (`set-replicas` changes it live: a
                        // pass is owed at once).
                        let mut seen_copies = fs.data().replicas();
                        let mut retry_at: Option<Instant> = None;
                        let tick = SCAN_INTERVAL.min(upkeep.delay.max(SCAN_MIN));
                        supervised("rebuild", &s, tick, &g.panics, || {
                            fs.fault_point("rebuild");
                            let now_gen = fs.data().pool().generation();
                            // With one copy there is nothing to rebuild from.
                            if now_gen != seen && fs.data().replicas() > 1 {
                                seen = now_gen;
                                changed_at = Some(Instant::now());
                            }
                            let copies = fs.data().replicas();
                            let recount = copies != seen_copies;
                            seen_copies = copies;
                            let settled =
                                recount || changed_at.is_some_and(|t| t.elapsed() >= upkeep.delay);
                            if settled || retry_at.is_some_and(|t| Instant::now() >= t) {
                                let out = pass(&fs, upkeep.rate, &s, &g.rebuild);
                                changed_at = None;
                                let wait = match out.left_to_another {
                                    true => ROLE_RETRY,
                                    false => RETRY,
                                };
                                retry_at = (out.left_degraded > 0).then(|| Instant::now() + wait);
                            }
                        });
                    })
            })
            .transpose()?;
        let mut threads = vec![heartbeat, reconnect];
        threads.extend(encode);
        threads.extend(rebuild);
        threads.extend(behind);
        Ok(Rebuilder {
            stop,
            figures,
            threads,
        })
    }

    /// What the upkeep threads have done.
    pub fn figures(&self) -> &UpkeepFigures {
        &self.figures
    }
}

impl Drop for Rebuilder {
    fn drop(&mut self) {
        self.stop.stop();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::UPKEEP_PANIC_BACKOFF_MIN;

    /// Five rounds that panic at once: four pauses between them, each twice the one before
    /// (the fifth round stops the thread, which then ends without a pause).
    #[test]
    fn rounds_that_keep_panicking_are_paused_ever_longer() {
        let (stop, panics) = (Stop::default(), UpkeepPanics::default());
        let mut rounds = 0;
        let start = Instant::now();
        supervised("rebuild", &stop, Duration::ZERO, &panics, || {
            rounds += 1;
            if rounds == 5 {
                stop.stop();
            }
            panic!("round {rounds}");
        });
        assert_eq!((rounds, panics.of("rebuild")), (5, 5));
        let least = UPKEEP_PANIC_BACKOFF_MIN * (1 + 2 + 4 + 8);
        assert!(
            start.elapsed() >= least,
            "{:?} for five panicking rounds",
            start.elapsed()
        );
        assert_eq!(panics.of("heartbeat"), 0);
    }
}
