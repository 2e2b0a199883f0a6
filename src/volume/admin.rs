//! `rmemfs volume ls|status|rm`: what the servers hold of each volume, from any host with
//! the secret, without attaching.

use super::root::Root;
use crate::client::volume::{drop_volume, list_volumes};
use crate::client::PoolConfig;
use crate::proto::VolumeInfo;
use crate::size::format_size;
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
            .max_by_key(|r| r.generation)
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

/// `volume rm NAME`: frees every extent of it on every server (refused while attached).
pub fn rm(addrs: &[SocketAddr], config: &PoolConfig, name: &str) -> Result<String, String> {
    let all = gather(addrs, config)?;
    let Some(a) = all.get(name) else {
        return Err(unknown(name, &all));
    };
    let (v, live) = a.holder();
    if live {
        return Err(format!(
            "volume '{name}' is attached by {} (epoch {}): unmount it first",
            v.holder, v.epoch
        ));
    }
    let mut freed = 0;
    for (addr, v) in &a.on {
        drop_volume(*addr, config, name).map_err(|e| e.to_string())?;
        freed += v.bytes;
    }
    Ok(format!(
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
