//! Volumes: a namespace that outlives the daemon. The servers own the volume's extents and
//! fence old holders (`server::volume`); the pool claims the volume and holds frees back
//! until the journal has them (`client::volume`); this module replays a volume at attach and
//! runs its journal.
//!
//! Attach: take the newest root any server holds; read the checkpoint and the ring (every
//! copy: the longest valid run of records wins, so a copy that missed the last group before
//! a crash costs nothing); replay them into an empty table; forget copies on servers that
//! restarted without the volume (the rebuild restores them); drop orphans; make the copies
//! of files a crash may have cut mid-change agree (`fs::overwrite`); free every extent the
//! volume owns that nothing names (allocations that never reached the journal, stock
//! granted ahead); then write a fresh checkpoint and ring, which also repairs lagging journal
//! copies, and start the committer.

pub mod admin;
mod engine_image;
pub mod follow;
mod journal;
mod locks;
mod read;
pub mod root;
pub mod shared;
pub mod store;
pub mod transfer;

pub use journal::VolumeJournal;

use crate::client::volume::FreeGate;
use crate::data::DataStore;
use crate::fabric::{RemoteRegion, ServerId};
use crate::fs::{Fs, FsConfig};
use crate::meta::Meta;
use crate::sync::Arc;
use journal::Writer;
use root::Place;
use std::collections::HashMap;
use std::net::SocketAddr;

/// `host pid N` (and what it is doing, if not a mount): how a volume's holder is named
/// to a second daemon that is refused.
pub fn holder_name(doing: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into());
    let doing = if doing.is_empty() {
        String::new()
    } else {
        format!(" ({doing})")
    };
    format!("{host} pid {}{doing}", std::process::id())
}

/// An attached volume's file system and its running journal.
pub struct Attached {
    pub fs: Arc<Fs>,
    pub journal: Arc<VolumeJournal>,
    /// What attach found and did (for the log and the tests).
    pub report: AttachReport,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttachReport {
    pub epoch: u64,
    pub created: bool,
    pub inodes: usize,
    /// Records replayed from the ring after the checkpoint.
    pub replayed: usize,
    /// Servers that had restarted without the volume (their copies forgotten).
    pub restarted: usize,
    /// Servers of the volume attached without (`--force-without`: their copies forgotten).
    pub without: usize,
    pub orphans: usize,
    /// Files marked as changed in place when the last holder stopped, whose copies were
    /// made to agree (see `fs::overwrite`), and the chunks among theirs that had copies
    /// written.
    pub reconciled: usize,
    pub reconciled_chunks: u64,
    /// Extents freed because nothing named them.
    pub collected: usize,
}

/// Attaches the pool's claimed volume (see the module doc). `addrs` are the mount's servers
/// in the pool's order; `without` are servers of the volume gone for good
/// (`--force-without`), whose copies are forgotten.
pub fn attach(
    data: DataStore,
    config: FsConfig,
    addrs: &[SocketAddr],
    without: &[SocketAddr],
) -> Result<Attached, String> {
    attach_with(data, config, addrs, without, JournalOptions::default())
}

/// The journal's sizes ([`crate::config`]'s; tests fill a small ring and cut checkpoints
/// into small slices).
#[derive(Debug, Clone, Copy)]
pub struct JournalOptions {
    pub ring_bytes: u64,
    pub checkpoint_slice: usize,
    /// Leave files unlinked while open where they are: a daemon taking over a kept FUSE
    /// connection, whose kernel may still hold them (the next fresh attach reaps them).
    pub keep_orphans: bool,
}

impl Default for JournalOptions {
    fn default() -> Self {
        JournalOptions {
            ring_bytes: crate::config::JOURNAL_RING_BYTES,
            checkpoint_slice: crate::config::CHECKPOINT_SLICE,
            keep_orphans: false,
        }
    }
}

/// [`attach`], with journal sizes of `options`.
pub fn attach_with(
    data: DataStore,
    config: FsConfig,
    addrs: &[SocketAddr],
    without: &[SocketAddr],
    options: JournalOptions,
) -> Result<Attached, String> {
    attach_then(data, config, addrs, without, options, |_, _| Ok(()))
}

/// [`attach_with`], running `prepare` on the replayed file system before its fresh
/// checkpoint (an import loads the export there, so the checkpoint holds it).
pub fn attach_then(
    data: DataStore,
    config: FsConfig,
    addrs: &[SocketAddr],
    without: &[SocketAddr],
    options: JournalOptions,
    prepare: impl FnOnce(&Fs, &AttachReport) -> Result<(), String>,
) -> Result<Attached, String> {
    let pool = data.pool().clone();
    let claims = pool.claims();
    let servers: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
    let best = read::newest_root(claims.iter().map(|c| c.root.as_slice()))?;
    let mut report = AttachReport {
        epoch: pool.epoch(),
        created: best.is_none(),
        ..Default::default()
    };
    // Servers that restarted without the volume hold none of its copies.
    let restarted: Vec<u32> = if best.is_some() {
        claims
            .iter()
            .enumerate()
            .filter(|(_, c)| c.created)
            .map(|(i, _)| i as u32)
            .collect()
    } else {
        Vec::new()
    };
    report.restarted = restarted.len();
    let mut meta = Meta::new(0o755, config.root_uid, config.root_gid);
    let mut last_lsn = 0;
    let (mut old_ckpt, mut old_ring): (Vec<Place>, Vec<Place>) = (Vec::new(), Vec::new());
    let mut keys: HashMap<u32, HashMap<u64, u64>> = HashMap::new();
    // Each live server's extent lengths by address: what the old checkpoint's copies hold.
    let mut lens: HashMap<(u32, u64), u64> = HashMap::new();
    if let Some(root) = &best {
        if root.chunk_size != data.chunk_size() {
            return Err(format!(
                "the volume's chunks are {} bytes; this mount's are {} (attach with \
                 --chunk-size {})",
                root.chunk_size,
                data.chunk_size(),
                root.chunk_size
            ));
        }
        let without: Vec<String> = without.iter().map(|a| a.to_string()).collect();
        let perm = read::permutation(root, &servers, &without)?;
        report.without = without.iter().filter(|w| root.servers.contains(w)).count();
        // Each live server's keys by address: a server restarted from its backing file on a
        // fabric whose device issues keys gave the volume's extents new ones, which no record
        // names (elsewhere every key is what the records say).
        for id in 0..claims.len() as u32 {
            if restarted.contains(&id) || !pool.is_live(ServerId(id)) {
                continue;
            }
            let list = pool
                .session_extents(ServerId(id))
                .map_err(|e| format!("cannot list the volume's extents on server {id}: {e}"))?;
            lens.extend(list.iter().map(|&(a, len, _)| ((id, a), len)));
            keys.insert(id, list.into_iter().map(|(a, _, k)| (a, k)).collect());
        }
        let rekey = |id: u32, p: &Place| -> u64 {
            keys.get(&id)
                .and_then(|k| k.get(&p.addr))
                .copied()
                .unwrap_or(p.rkey)
        };
        let usable = |p: &Place| {
            read::place_region(
                p,
                &perm,
                |id| !restarted.contains(&id) && pool.is_live(ServerId(id)),
                rekey,
            )
        };
        if let Some(records) = read::read_checkpoint(&data, root, usable)? {
            read::apply_all(&mut meta, records, &perm)?;
        }
        meta.number_from(root.next_ino);
        let (ring, _) = read::read_ring(&data, root, usable)?;
        last_lsn = root.checkpoint_lsn + ring.len() as u64;
        report.replayed = read::apply_all(&mut meta, ring, &perm)?;
        let renumber = |p: &Place| {
            let server = perm[p.server as usize]?;
            Some(Place {
                server,
                rkey: rekey(server, p),
                ..*p
            })
        };
        old_ckpt = root.checkpoint.iter().filter_map(renumber).collect();
        old_ring = root.ring.iter().filter_map(renumber).collect();
    }
    report.inodes = meta.len();
    // Shared once the journal is its barrier (below).
    let fs = Fs::with_meta(data, config, meta);
    for &s in &restarted {
        crate::upkeep::rebuild::forget_server(&fs, ServerId(s));
    }
    for (&s, k) in &keys {
        let n = crate::upkeep::rebuild::rekey_server(&fs, ServerId(s), k);
        if n > 0 {
            log::warn!("volume attach: {n} chunk copies on server {s} took its new keys");
        }
    }
    // What attach frees (orphans, memory no record names) was dropped by records up to
    // `last_lsn`, which a follower may not have applied yet: it still maps that memory, as
    // it would a running holder's frees. So they go through the gate as those do, released
    // at once where every follower is past `last_lsn` (or none follows), else held until
    // they are (the committer keeps asking).
    let gate = Arc::new(FreeGate::default());
    gate.assigned
        .store(last_lsn, crate::sync::atomic::Ordering::SeqCst);
    pool.set_free_gate(gate.clone());
    if !options.keep_orphans {
        report.orphans = fs.reap_orphans();
    }
    // Before the checkpoint, which then holds the copies as they agree and no marks.
    (report.reconciled, report.reconciled_chunks) = fs.reconcile_overwritten();
    if report.reconciled > 0 {
        log::warn!(
            "volume attach: {} files were being changed in place when the last holder \
             stopped; their copies now agree ({} chunks written)",
            report.reconciled,
            report.reconciled_chunks
        );
    }
    let keep: Vec<Place> = old_ckpt.iter().chain(&old_ring).copied().collect();
    report.collected = collect(&fs, &keep)?;
    // Before the checkpoint: on a full pool it needs the room these frees make.
    pool.release_frees(&gate, last_lsn);
    prepare(&fs, &report)?;
    // A fresh checkpoint and ring (the old ones freed once the root names the new).
    let mut writer = Writer {
        view: fs.journal_view(),
        pool: pool.clone(),
        root: best.unwrap_or_default(),
        tail: 0,
        options,
        written: Default::default(),
        heal_after: None,
        checkpoint_cap: 0,
        checkpoint_marks: Vec::new(),
        spare: Default::default(),
        reserve: Default::default(),
    };
    // The old places, renumbered to this pool's servers, are what the writer frees (not
    // those on restarted servers: that memory went with the restart).
    writer.root.servers = servers;
    old_ckpt.retain(|p| !restarted.contains(&p.server));
    old_ring.retain(|p| !restarted.contains(&p.server));
    // What the old checkpoint's copies hold (the next checkpoint's spare, if large enough).
    writer.checkpoint_cap = old_ckpt
        .iter()
        .map(|p| lens.get(&(p.server, p.addr)).copied().unwrap_or(0))
        .min()
        .unwrap_or(0);
    writer.checkpoint_marks = journal::session_marks(&pool, &old_ckpt);
    writer.root.checkpoint = old_ckpt;
    writer.root.ring = old_ring;
    writer.checkpoint(&gate, true)?;
    let (journal, recorder) = VolumeJournal::start(writer, gate, last_lsn)
        .map_err(|e| format!("cannot start the volume's committer: {e}"))?;
    let journal = Arc::new(journal);
    fs.set_journal(Box::new(recorder));
    let fs = Arc::new(fs.joined(crate::fs::VolumeHooks {
        barrier: Some(journal.clone()),
        ..Default::default()
    }));
    Ok(Attached {
        fs,
        journal,
        report,
    })
}

/// Frees every extent the volume owns on a live server that no chunk names and that is not
/// one of `keep` (the old checkpoint and ring, freed once the new root is set). Returns how
/// many.
fn collect(fs: &Fs, keep: &[Place]) -> Result<usize, String> {
    let mut named = fs.named_extents();
    named.extend(keep.iter().map(|p| (p.server, p.addr)));
    let pool = fs.data().pool();
    let mut freed = 0;
    for s in pool.status().iter().filter(|s| !s.failed) {
        let extents = pool
            .session_extents(s.id)
            .map_err(|e| format!("cannot list the volume's extents on {}: {e}", s.addr))?;
        for (addr, len, rkey) in extents {
            if !named.contains(&(s.id.0, addr)) {
                let _ = pool.free(RemoteRegion {
                    server: s.id,
                    addr,
                    len,
                    rkey,
                });
                freed += 1;
            }
        }
    }
    if freed > 0 {
        log::info!("volume attach: freed {freed} extents nothing names");
    }
    Ok(freed)
}
