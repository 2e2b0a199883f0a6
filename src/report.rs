//! The mount's report: what `rmemfs stats` prints, `--json` gives, the stats attributes
//! read and Prometheus scrapes, built here, outside the core, from the file system, its data
//! store and pool, the upkeep's figures and the FUSE adapter's.

use crate::fs::Fs;
use crate::sync::atomic::Ordering;
use std::time::SystemTime;

/// What `stats_text` shows, as JSON: counts as numbers, states as strings, times as
/// seconds since the epoch.
pub fn mount_json(fs: &Fs) -> serde_json::Value {
    use serde_json::json;
    let c = fs.data().cache_stats();
    let pool = fs.data().pool();
    let f = pool.fabric().counters();
    let epoch = |t: SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    };
    let servers: Vec<serde_json::Value> = pool
        .status()
        .iter()
        .map(|s| {
            json!({
                "id": s.id.0,
                "addr": s.addr.to_string(),
                "state": match s.state {
                    crate::client::ServerState::Up => "up",
                    crate::client::ServerState::Down => "down",
                    crate::client::ServerState::Rejoining => "rejoining",
                },
                "since": epoch(s.since),
                "free_bytes": s.capacity.free,
                "total_bytes": s.capacity.total,
                // Granted ahead for new small files (counted as used, not free).
                "stocked_bytes": pool.stocked_bytes(s.id),
                "downs": s.downs,
            })
        })
        .collect();
    let h = fs.replica_health();
    let r = &fs.figures().rebuild;
    // Per operation name: count, mean, p50 and p99 in µs, and the time of all of them (for
    // exact means between two snapshots).
    let by_op = |summaries: Vec<crate::requests::OpSummary>| {
        summaries
            .into_iter()
            .map(|o| {
                let figures = json!({"count": o.count, "mean_us": o.mean_us,
                                     "p50_us": o.p50_us, "p99_us": o.p99_us,
                                     "total_ns": o.total_nanos});
                (o.op.to_string(), figures)
            })
            .collect::<serde_json::Map<String, serde_json::Value>>()
    };
    let requests = by_op(fs.figures().requests.summary());
    let batches = by_op(pool.batch_latency());
    json!({
        "registration_cache": {
            "policy": format!("{:?}", fs.data().cache_policy()).to_lowercase(),
            "lookups": c.lookups(),
            "hits": c.hits,
            "subset_hits": c.subset_hits,
            "overlaps": c.overlaps,
            "misses": c.misses,
            "registrations": c.registrations,
            "registered_pages": c.registered_pages,
            "deregistrations": c.deregistrations,
            "deregistration_batches": c.deregistration_batches,
            "deregistered_pages": c.deregistered_pages,
            "full_events": c.full_events,
            "regions": c.regions,
            "pinned_pages": c.pinned_pages,
        },
        "fabric": {
            "name": pool.fabric().name(),
            "reads": f.reads,
            "bytes_read": f.bytes_read,
            "writes": f.writes,
            "bytes_written": f.bytes_written,
            "failed": f.failed,
            "remote_errors": f.remote_errors,
            "remote_refused": f.remote_refused,
            "registrations": f.registrations,
            "deregistrations": f.deregistrations,
            "deregistration_batches": f.deregistration_batches,
            "pinned_bytes": pool.fabric().pinned_bytes(),
            "unpinned_bytes": pool.fabric().unpinned_bytes(),
        },
        "fuse": {"transport": fs.figures().fuse_transport.get().copied().unwrap_or("")},
        "writeback": {
            "cache": fs.writeback_enabled(),
            // New writable handles: through the kernel's cache, or written through.
            "new_handles": match (fs.writeback_enabled(), fs.direct_writes()) {
                (false, _) => "uncached",
                (true, true) => "direct",
                (true, false) => "cached",
            },
            "dirty_limit_bytes": fs.dirty_limit_bytes(),
            "free_room_bytes": fs.free_room(),
        },
        "fabric_batches": batches,
        "servers": servers,
        "chunks": {
            "copies": fs.data().replicas(),
            "healthy": h.healthy,
            "degraded": h.degraded,
            "lost": h.lost,
        },
        "rebuild": {
            "running": r.running.load(Ordering::Relaxed),
            "passes": r.passes.load(Ordering::Relaxed),
            "chunks_rebuilt": r.chunks_rebuilt.load(Ordering::Relaxed),
            "bytes_copied": r.bytes_copied.load(Ordering::Relaxed),
            "last_rate_bytes_per_s": r.last_rate.load(Ordering::Relaxed),
            "chunks_left_degraded": r.left_degraded.load(Ordering::Relaxed),
        },
        "inodes": fs.inode_count(),
        "contained_panics": fs.contained_panics(),
        "upkeep_panics": fs.upkeep_panics().to_json(),
        "requests": requests,
    })
}

/// What `rmemfs stats` prints: [`mount_json`] as text, so a figure is added once.
pub fn mount_text(fs: &Fs) -> String {
    stats_text_of(&mount_json(fs))
}

/// The report as the stats attributes read it: text, or JSON (`json`).
pub fn render(fs: &Fs, json: bool) -> Vec<u8> {
    if json {
        mount_json(fs).to_string().into_bytes()
    } else {
        mount_text(fs).into_bytes()
    }
}

/// Serves the report through `fs`'s stats attributes (a weak reference: the file system
/// owns the source, which must not keep it alive).
pub fn attach(fs: &std::sync::Arc<Fs>) {
    let weak = std::sync::Arc::downgrade(fs);
    fs.set_stats_source(Box::new(move |json| {
        weak.upgrade().map_or_else(Vec::new, |fs| render(&fs, json))
    }));
}

/// The report as methods of the file system (`fs.stats_json()`), for tests and tools.
pub trait Report {
    fn stats_json(&self) -> serde_json::Value;
    fn stats_text(&self) -> String;
}

impl Report for Fs {
    fn stats_json(&self) -> serde_json::Value {
        mount_json(self)
    }
    fn stats_text(&self) -> String {
        mount_text(self)
    }
}

/// The text of `rmemfs stats` from the object [`mount_json`] builds.
fn stats_text_of(v: &serde_json::Value) -> String {
    use std::fmt::Write;
    // Field `path` ("a.b") as a number, or as text; absent fields read 0 and "".
    let field = |path: &str| path.split('.').try_fold(v, |v, k| v.get(k));
    let n = |path: &str| field(path).and_then(serde_json::Value::as_u64).unwrap_or(0);
    let t = |path: &str| {
        field(path)
            .and_then(serde_json::Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let mut out = String::new();
    let rc = |k: &str| n(&format!("registration_cache.{k}"));
    let (lookups, hits) = (rc("lookups"), rc("hits") + rc("subset_hits"));
    let _ = writeln!(
        out,
        "registration cache: {}",
        t("registration_cache.policy")
    );
    let _ = writeln!(
        out,
        "  lookups {lookups} (hits {}, subset hits {}, overlaps {}, misses {}), hit ratio {:.1}%",
        rc("hits"),
        rc("subset_hits"),
        rc("overlaps"),
        rc("misses"),
        if lookups == 0 {
            0.0
        } else {
            100.0 * hits as f64 / lookups as f64
        }
    );
    let _ = writeln!(
        out,
        "  registrations {} ({} pages), deregistrations {} in {} batches ({} pages), \
         full-cache events {}",
        rc("registrations"),
        rc("registered_pages"),
        rc("deregistrations"),
        rc("deregistration_batches"),
        rc("deregistered_pages"),
        rc("full_events")
    );
    let _ = writeln!(
        out,
        "  cached regions {}, pinned {} pages",
        rc("regions"),
        rc("pinned_pages")
    );
    let fab = |k: &str| n(&format!("fabric.{k}"));
    if !t("fuse.transport").is_empty() {
        let _ = writeln!(out, "fuse: {}", t("fuse.transport"));
    }
    let _ = writeln!(
        out,
        "writeback: new writable handles {}; dirty limit {} bytes (0: not kept); pool room {} \
         bytes",
        t("writeback.new_handles"),
        n("writeback.dirty_limit_bytes"),
        n("writeback.free_room_bytes")
    );
    let _ = writeln!(out, "fabric: {}", t("fabric.name"));
    let _ = writeln!(
        out,
        "  reads {} ({} bytes), writes {} ({} bytes), failed {} (remote access errors {}); \
         remote requests refused here {}",
        fab("reads"),
        fab("bytes_read"),
        fab("writes"),
        fab("bytes_written"),
        fab("failed"),
        fab("remote_errors"),
        fab("remote_refused")
    );
    let _ = writeln!(
        out,
        "  registrations {}, deregistrations {} in {} batches, pinned {} bytes{}",
        fab("registrations"),
        fab("deregistrations"),
        fab("deregistration_batches"),
        fab("pinned_bytes"),
        match fab("unpinned_bytes") {
            0 => String::new(),
            n => format!(", unpinned {n} bytes (the memlock limit, `ulimit -l`, refused more)"),
        }
    );
    // Per operation: count, mean, p50 and p99 in µs (by name: JSON objects keep keys sorted).
    let by_op = |out: &mut String, key: &str, indent: &str| {
        for (op, f) in v.get(key).and_then(|o| o.as_object()).into_iter().flatten() {
            let g = |k: &str| f.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
            let _ = writeln!(
                out,
                "{indent}{op} {} {} {} {}",
                g("count"),
                g("mean_us"),
                g("p50_us"),
                g("p99_us")
            );
        }
    };
    let _ = writeln!(
        out,
        "  batches, post to last completion: kind count mean_us p50_us p99_us"
    );
    by_op(&mut out, "fabric_batches", "    ");
    let now = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    for s in v
        .get("servers")
        .and_then(|s| s.as_array())
        .into_iter()
        .flatten()
    {
        let g = |k: &str| s.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
        let state = s.get("state").and_then(|x| x.as_str()).unwrap_or("");
        let _ = writeln!(
            out,
            "server server#{} {}: {}, since {} ({} s); {} of {} bytes free; down {} times",
            g("id"),
            s.get("addr").and_then(|x| x.as_str()).unwrap_or(""),
            // Trouble in capitals, to stand out.
            if state == "up" {
                state.to_string()
            } else {
                state.to_uppercase()
            },
            utc(g("since")),
            now.saturating_sub(g("since")),
            g("free_bytes"),
            g("total_bytes"),
            g("downs")
        );
    }
    let _ = writeln!(
        out,
        "chunks: {} copies each; healthy {}, degraded {}, lost {}",
        n("chunks.copies"),
        n("chunks.healthy"),
        n("chunks.degraded"),
        n("chunks.lost")
    );
    let rb = |k: &str| n(&format!("rebuild.{k}"));
    let running = field("rebuild.running").and_then(serde_json::Value::as_bool) == Some(true);
    let _ = writeln!(
        out,
        "rebuild: {}; {} passes, {} chunks ({} bytes) copied, last rate {} bytes/s, {} \
         chunks left short of copies",
        if running { "running" } else { "idle" },
        rb("passes"),
        rb("chunks_rebuilt"),
        rb("bytes_copied"),
        rb("last_rate_bytes_per_s"),
        rb("chunks_left_degraded")
    );
    let _ = writeln!(out, "inodes: {}", n("inodes"));
    let _ = writeln!(
        out,
        "requests failed by a contained panic: {}",
        n("contained_panics")
    );
    let _ = writeln!(
        out,
        "upkeep threads started again after a panic: {}",
        crate::rebuild::UPKEEP_THREADS
            .map(|t| format!("{t} {}", n(&format!("upkeep_panics.{t}"))))
            .join(", ")
    );
    let _ = writeln!(out, "requests: op count mean_us p50_us p99_us");
    by_op(&mut out, "requests", "  ");
    out
}

/// `YYYY-MM-DD HH:MM:SS UTC` (days to a civil date: H. Hinnant's algorithm), for `stats`.
fn utc(secs: u64) -> String {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod stats_text_tests {
    use super::{stats_text_of, utc};

    #[test]
    fn the_text_renders_every_section_of_the_json() {
        let v = serde_json::json!({
            "registration_cache": {"policy": "mrrc", "lookups": 4, "hits": 2, "subset_hits": 1,
                                   "overlaps": 0, "misses": 1, "regions": 3},
            "fabric": {"name": "tcp", "reads": 7, "bytes_read": 28672, "unpinned_bytes": 4096},
            "fabric_batches": {"read": {"count": 7, "mean_us": 45, "p50_us": 64, "p99_us": 128}},
            "servers": [
                {"id": 0, "addr": "127.0.0.1:7471", "state": "up", "since": 0,
                 "free_bytes": 10, "total_bytes": 20, "downs": 0},
                {"id": 1, "addr": "127.0.0.1:7472", "state": "down", "since": 86_400,
                 "free_bytes": 0, "total_bytes": 20, "downs": 2}
            ],
            "chunks": {"copies": 2, "healthy": 5, "degraded": 1, "lost": 0},
            "rebuild": {"running": true, "passes": 1},
            "inodes": 9,
            "contained_panics": 0,
            "upkeep_panics": {"heartbeat": 0, "reconnect": 2, "rebuild": 1},
            "requests": {"read": {"count": 7, "mean_us": 70, "p50_us": 64, "p99_us": 128},
                         "lookup": {"count": 2, "mean_us": 10, "p50_us": 16, "p99_us": 16}}
        });
        let text = stats_text_of(&v);
        for line in [
            "registration cache: mrrc",
            "  lookups 4 (hits 2, subset hits 1, overlaps 0, misses 1), hit ratio 75.0%",
            "  cached regions 3, pinned 0 pages",
            "fabric: tcp",
            "  reads 7 (28672 bytes), writes 0 (0 bytes), failed 0 (remote access errors 0); \
             remote requests refused here 0",
            "    read 7 45 64 128",
            "chunks: 2 copies each; healthy 5, degraded 1, lost 0",
            "inodes: 9",
            "upkeep threads started again after a panic: heartbeat 0, reconnect 2, rebuild 1",
            "  lookup 2 10 16 16",
            "  read 7 70 64 128",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line:?} missing from\n{text}"
            );
        }
        assert!(text.contains("unpinned 4096 bytes"), "{text}");
        assert!(text.contains("rebuild: running; 1 passes"), "{text}");
        assert!(text.contains("server server#0 127.0.0.1:7471: up, since 1970-01-01 00:00:00 UTC"));
        assert!(
            text.contains("server server#1 127.0.0.1:7472: DOWN, since 1970-01-02 00:00:00 UTC")
        );
        assert!(text.contains("0 of 20 bytes free; down 2 times"), "{text}");
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        // 2024-02-29 12:34:56 UTC, a leap day.
        assert_eq!(utc(1_709_210_096), "2024-02-29 12:34:56 UTC");
    }
}
