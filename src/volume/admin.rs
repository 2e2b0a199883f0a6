//! `rmemfs volume ls|status|rm`: what the servers hold of each volume, from any host with
//! the secret, without attaching.

use super::root::Root;
use super::{attach_then, transfer, AttachReport, Attached, JournalOptions};
use crate::client::control::ControlConn;
use crate::client::volume::{drop_volume, list_volumes, VolumeSpec};
use crate::client::{Pool, PoolConfig};
use crate::data::{DataStore, WritePath};
use crate::fs::{Fs, FsConfig};
use crate::proto::VolumeInfo;
use crate::regcache::{CacheConfig, Policy};
use crate::size::format_size;
use crate::sync::Arc;
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// One volume across the servers asked: each server's view of it.
struct Across {
    on: Vec<(SocketAddr, VolumeInfo)>,
}

fn gather(addrs: &[SocketAddr], config: &PoolConfig) -> Result<BTreeMap<String, Across>, String> {
    let mut all: BTreeMap<String, Across> = BTreeMap::new();
    for &a in addrs {
        for v in list_volumes(a, config).map_err(|e| e.to_string())? {
            all.entry(v.name.clone())
                .or_insert(Across { on: Vec::new() })
                .on
                .push((a, v));
        }
    }
    Ok(all)
}

impl Across {
    fn newest_root(&self) -> Option<Root> {
        self.on
            .iter()
            .filter_map(|(_, v)| Root::decode(&v.root).ok().flatten())
            .max_by_key(|r| r.order())
    }
    fn holder(&self) -> (&VolumeInfo, bool) {
        let newest = self
            .on
            .iter()
            .map(|(_, v)| v)
            .max_by_key(|v| v.epoch)
            .expect("listed on one server at least");
        (newest, self.on.iter().any(|(_, v)| v.live))
    }
}

/// `volume ls`: one line per volume.
pub fn ls(addrs: &[SocketAddr], config: &PoolConfig) -> Result<String, String> {
    let all = gather(addrs, config)?;
    if all.is_empty() {
        return Ok("no volumes on these servers\n".into());
    }
    let mut out = format!(
        "{:<20} {:>6} {:<9} {:>10} {:>9}  HOLDER\n",
        "NAME", "EPOCH", "STATE", "MEMORY", "FILES"
    );
    for (name, a) in &all {
        let (v, live) = a.holder();
        let bytes: u64 = a.on.iter().map(|(_, v)| v.bytes).sum();
        let files = a
            .newest_root()
            .map_or("-".to_string(), |r| r.files.to_string());
        out += &format!(
            "{name:<20} {:>6} {:<9} {:>10} {files:>9}  {}\n",
            v.epoch,
            if live { "attached" } else { "detached" },
            format_size(bytes),
            v.holder
        );
    }
    Ok(out)
}

/// `volume status NAME`: the volume on each server, and what its root says.
pub fn status(addrs: &[SocketAddr], config: &PoolConfig, name: &str) -> Result<String, String> {
    let all = gather(addrs, config)?;
    let Some(a) = all.get(name) else {
        return Err(unknown(name, &all));
    };
    let (v, live) = a.holder();
    let mut out = format!(
        "volume {name}\n  holder: {} ({}), epoch {}\n",
        v.holder,
        if live {
            "attached".to_string()
        } else {
            format!("detached {} s ago", v.idle_secs)
        },
        v.epoch
    );
    for (addr, v) in &a.on {
        out += &format!(
            "  server {addr}: epoch {}, {} extents, {}{}\n",
            v.epoch,
            v.extents,
            format_size(v.bytes),
            if v.live { ", holder connected" } else { "" }
        );
    }
    match a.newest_root() {
        Some(r) => {
            out += &format!(
                "  as of the last checkpoint ({} s since the epoch): {} files, {} of file data\n",
                r.checkpoint_unix,
                r.files,
                format_size(r.bytes)
            );
            out += &format!(
                "  checkpoint: {} bytes up to record {}, {} copies; journal ring: {} per copy, \
                 {} copies\n",
                r.checkpoint_len,
                r.checkpoint_lsn,
                r.checkpoint.len(),
                format_size(r.ring_len),
                r.ring.len()
            );
        }
        None => out += "  no root yet (its first holder died before its first checkpoint)\n",
    }
    Ok(out)
}

/// `volume rm NAME [--meta URL]`: frees every extent of it on every server (refused while
/// attached); a shared volume's namespace goes from its metadata engine `meta` first (a
/// shared volume without `meta` is refused: its namespace would name freed memory).
pub fn rm(
    addrs: &[SocketAddr],
    config: &PoolConfig,
    name: &str,
    meta: Option<&str>,
) -> Result<String, String> {
    let all = gather(addrs, config)?;
    let mut out = String::new();
    if let Some(url) = meta {
        let engine = crate::engine::open(url, name)?;
        if engine.servers().map_err(|e| e.to_string())?.is_some() {
            engine.remove_volume().map_err(|e| e.to_string())?;
            out += &format!("removed volume '{name}' from {}\n", engine.describe());
        }
    }
    let Some(a) = all.get(name) else {
        return match out.is_empty() {
            true => Err(unknown(name, &all)),
            false => Ok(out),
        };
    };
    let (v, live) = a.holder();
    if live {
        return Err(format!(
            "volume '{name}' is attached by {} (epoch {}): unmount it first",
            v.holder, v.epoch
        ));
    }
    let shared =
        a.on.iter()
            .any(|(_, v)| v.holder == crate::proto::SHARED_VOLUME_HOLDER);
    if shared && meta.is_none() {
        return Err(format!(
            "volume '{name}' is shared: its namespace is in its metadata engine, which would \
             name memory freed here; remove both with `rmemfs volume rm {name} --meta URL`"
        ));
    }
    let mut freed = 0;
    for (addr, v) in &a.on {
        drop_volume(*addr, config, name).map_err(|e| e.to_string())?;
        freed += v.bytes;
    }
    Ok(out
        + &format!(
            "removed volume '{name}': {} freed on {} servers\n",
            format_size(freed),
            a.on.len()
        ))
}

fn unknown(name: &str, all: &BTreeMap<String, Across>) -> String {
    let known: Vec<&str> = all.keys().map(|k| k.as_str()).collect();
    format!(
        "no volume '{name}' on these servers (known volumes: {})",
        if known.is_empty() {
            "none".to_string()
        } else {
            known.join(", ")
        }
    )
}

/// Attaches volume `name` in this process, without a mount (export and import): over the
/// fabric the servers speak, `replicas` copies of new chunks, chunks of `chunk_size` bytes
/// (none: the volume's), `prepare` run before the fresh checkpoint.
fn open(
    addrs: &[SocketAddr],
    config: &PoolConfig,
    name: &str,
    create: bool,
    chunk_size: Option<u64>,
    doing: &str,
    prepare: impl FnOnce(&Fs, &AttachReport) -> Result<(), String>,
) -> Result<Attached, String> {
    let probe = ControlConn::connect(
        addrs[0],
        &config.client_name,
        config.timeout,
        &config.secret,
    )
    .map_err(|e| e.to_string())?;
    let fabric_name = probe.hello.fabric.clone();
    probe.goodbye();
    drop(probe);
    let fabric = crate::fabric::open(&fabric_name, &crate::fabric::FabricOptions::default())
        .map_err(|e| e.to_string())?;
    let spec = VolumeSpec {
        role: Default::default(),
        name: name.into(),
        holder: super::holder_name(doing),
        create,
        takeover: false,
    };
    let pool = Pool::connect(
        fabric,
        addrs,
        &PoolConfig {
            volume: Some(spec),
            ..config.clone()
        },
    )
    .map_err(|e| e.to_string())?;
    let from_root = pool
        .claims()
        .iter()
        .filter_map(|c| Root::decode(&c.root).ok().flatten())
        .max_by_key(|r| r.order())
        .map(|r| r.chunk_size);
    let chunk = chunk_size
        .or(from_root)
        .unwrap_or(crate::config::CHUNK_SIZE);
    let replicas = addrs.len().min(crate::config::DEFAULT_REPLICAS);
    let data = DataStore::new(
        Arc::new(pool),
        chunk,
        crate::config::READ_BUFFERS_PER_THREAD,
        Policy::Mrrc,
        CacheConfig::default(),
        WritePath::Frrwp,
    )
    .and_then(|d| d.replicated(replicas, 1))
    .map_err(|e| e.message)?;
    attach_then(
        data,
        FsConfig::default(),
        addrs,
        &[],
        JournalOptions::default(),
        prepare,
    )
}

/// An export's or import's figures, for its message.
pub fn rate(t: &transfer::Transferred) -> String {
    let mbs = if t.seconds > 0.0 {
        t.bytes as f64 / t.seconds / 1e6
    } else {
        0.0
    };
    format!(
        "{} files, {} chunks ({} of data) in {:.2} s, {mbs:.0} MB/s",
        t.files,
        t.chunks,
        format_size(t.bytes),
        t.seconds
    )
}

/// `volume export NAME DEST`: a consistent copy of a detached volume into `dest`, a
/// directory or `s3://BUCKET/PREFIX` ([`super::store`]).
pub fn export(
    addrs: &[SocketAddr],
    config: &PoolConfig,
    name: &str,
    dest: &str,
) -> Result<String, String> {
    let store = super::store::open(dest)?;
    let a = open(addrs, config, name, false, None, "export", |_, _| Ok(())).map_err(|e| {
        if e.contains("is held by") {
            format!(
                "{e}. To export an attached volume, run `rmemfs admin export MOUNTPOINT \
                 {dest}` on the holder's host"
            )
        } else {
            e
        }
    })?;
    let done = transfer::export(&a.fs, name, &*store);
    let stopped = a.journal.stop();
    let t = done?;
    stopped.map_err(|e| e.message)?;
    Ok(format!(
        "exported volume '{name}' to {}: {}; {} chunks copied (the rest were there)\n",
        store.describe(),
        rate(&t),
        t.chunks_copied
    ))
}

/// `volume import SRC NAME`: a new volume `name` holding the export in `src` (a directory
/// or `s3://BUCKET/PREFIX`).
pub fn import(
    addrs: &[SocketAddr],
    config: &PoolConfig,
    src: &str,
    name: &str,
) -> Result<String, String> {
    let store = super::store::open(src)?;
    let src = &*store;
    let m = transfer::read_manifest(src)?;
    let mut done = None;
    let a = open(
        addrs,
        config,
        name,
        true,
        Some(m.chunk_size),
        "import",
        |fs, _| {
            done = Some(transfer::import(fs, src)?);
            Ok(())
        },
    )?;
    a.journal.stop().map_err(|e| e.message)?;
    let t = done.expect("prepare ran");
    Ok(format!(
        "imported {} into volume '{name}': {} (every hash verified)\n",
        src.describe(),
        rate(&t)
    ))
}
