//! `rmemfs stats` as text, from the typed report: the sections people and scripts read line
//! by line (servers, chunks, the fabric) in their own words, the generic sections
//! ([`super::Figures`]) as `section: key value, ...`.

use super::{MountReport, OpFigures};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::SystemTime;

/// Per operation: `name count mean_us p50_us p99_us max_us`, by name.
fn by_op(out: &mut String, ops: &BTreeMap<String, OpFigures>, indent: &str) {
    for (op, f) in ops {
        let _ = writeln!(
            out,
            "{indent}{op} {} {} {} {} {}",
            f.count, f.mean_us, f.p50_us, f.p99_us, f.max_us
        );
    }
}

/// The text of `rmemfs stats`.
pub fn render(r: &MountReport) -> String {
    let mut out = String::new();
    let (policy, lookups, rc) = (
        &r.registration_cache.policy,
        r.registration_cache.lookups,
        &r.registration_cache.counters,
    );
    let _ = writeln!(out, "registration cache: {policy}");
    let _ = writeln!(
        out,
        "  lookups {} (hits {}, subset hits {}, overlaps {}, misses {}), hit ratio {:.1}%",
        lookups,
        rc.hits,
        rc.subset_hits,
        rc.overlaps,
        rc.misses,
        100.0 * rc.hit_ratio()
    );
    let _ = writeln!(
        out,
        "  registrations {} ({} pages), deregistrations {} in {} batches ({} pages), \
         full-cache events {}",
        rc.registrations,
        rc.registered_pages,
        rc.deregistrations,
        rc.deregistration_batches,
        rc.deregistered_pages,
        rc.full_events
    );
    let _ = writeln!(
        out,
        "  cached regions {}, pinned {} pages",
        rc.regions, rc.pinned_pages
    );
    if !r.fuse.transport.is_empty() {
        let _ = writeln!(out, "fuse: {}", r.fuse.transport);
        let _ = writeln!(
            out,
            "  requests in flight {}, answered after a daemon restart {}",
            r.fuse.in_flight, r.fuse.resent
        );
    }
    let _ = writeln!(out, "access times: {}", r.fuse.access_times);
    let wb = &r.writeback;
    let _ = writeln!(
        out,
        "writeback: new writable handles {}; dirty limit {} bytes (0: not kept); pool room {} \
         bytes",
        wb.new_handles, wb.dirty_limit_bytes, wb.free_room_bytes
    );
    let b = &wb.behind;
    let _ = writeln!(
        out,
        "write-behind: {} writes answered before they were sent ({} sent by the worker, {} by \
         the next operation on the file), {} failed",
        b.deferred, b.sent_by_worker, b.sent_inline, b.failed
    );
    let (name, fab) = (&r.fabric.name, &r.fabric.ops);
    let _ = writeln!(out, "fabric: {name}");
    let _ = writeln!(
        out,
        "  reads {} ({} bytes), writes {} ({} bytes), failed {} (remote access errors {}); \
         remote requests refused here {}",
        fab.reads,
        fab.bytes_read,
        fab.writes,
        fab.bytes_written,
        fab.failed,
        fab.remote_errors,
        fab.remote_refused
    );
    let _ = writeln!(
        out,
        "  registrations {}, deregistrations {} in {} batches, pinned {} bytes{}",
        fab.registrations,
        fab.deregistrations,
        fab.deregistration_batches,
        r.fabric.pinned_bytes,
        match r.fabric.unpinned_bytes {
            0 => String::new(),
            n => format!(", unpinned {n} bytes (the memlock limit, `ulimit -l`, refused more)"),
        }
    );
    let _ = writeln!(
        out,
        "  batches, post to last completion: kind count mean_us p50_us p99_us max_us"
    );
    by_op(&mut out, &r.fabric_batches, "    ");
    let now = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    for s in &r.servers {
        let _ = writeln!(
            out,
            "server server#{} {}: {}, since {} ({} s); {} of {} bytes free; down {} times",
            s.id,
            s.addr,
            // Trouble in capitals, to stand out.
            if matches!(s.state.as_str(), "up" | "draining" | "removed") {
                s.state.clone()
            } else {
                s.state.to_uppercase()
            },
            utc(s.since),
            now.saturating_sub(s.since),
            s.free_bytes,
            s.total_bytes,
            s.downs
        );
    }
    let ch = &r.chunks;
    let _ = write!(
        out,
        "chunks: {} copies each; healthy {}, degraded {}, lost {}",
        ch.copies, ch.healthy, ch.degraded, ch.lost
    );
    if ch.surplus > 0 {
        let _ = write!(out, "; {} with extra copies", ch.surplus);
    }
    if ch.moving > 0 {
        let _ = write!(
            out,
            "; {} with a copy to move off a draining server ({} bytes)",
            ch.moving, ch.moving_bytes
        );
    }
    out.push('\n');
    if let Some(d) = &r.drain {
        let _ = writeln!(
            out,
            "drain of {}: {} bytes moved, {} left, {} B/s, {} s so far{}",
            d.server,
            d.bytes_moved,
            d.bytes_left,
            d.rate_bytes_per_s,
            d.seconds,
            d.eta_seconds
                .map_or(String::new(), |e| format!(", about {e} s to go"))
        );
    }
    let rb = &r.rebuild;
    let _ = writeln!(
        out,
        "rebuild: {}; {} passes, {} chunks ({} bytes) copied, last rate {} bytes/s, {} \
         chunks left short of copies; {} chunks copied on write",
        if rb.running { "running" } else { "idle" },
        rb.passes,
        rb.chunks_rebuilt,
        rb.bytes_copied,
        rb.last_rate_bytes_per_s,
        rb.chunks_left_degraded,
        rb.chunks_copied_on_write
    );
    for (name, figures) in r.sections() {
        let list: Vec<String> = figures
            .iter()
            .map(|f| format!("{} {}", f.key, f.value))
            .collect();
        let _ = writeln!(out, "{name}: {}", list.join(", "));
    }
    let _ = writeln!(out, "inodes: {}", r.inodes);
    let _ = writeln!(
        out,
        "requests failed by a contained panic: {}",
        r.contained_panics
    );
    let panics: Vec<String> = r
        .upkeep_panics
        .iter()
        .map(|(t, n)| format!("{t} {n}"))
        .collect();
    let _ = writeln!(
        out,
        "upkeep threads started again after a panic: {}",
        panics.join(", ")
    );
    let _ = writeln!(out, "requests: op count mean_us p50_us p99_us max_us");
    by_op(&mut out, &r.requests, "  ");
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
mod tests {
    use super::super::*;
    use super::{render, utc};

    fn sample() -> MountReport {
        let op = |count, mean_us, p50_us, p99_us| OpFigures {
            count,
            mean_us,
            p50_us,
            p99_us,
            max_us: p99_us + 1,
            total_ns: 0,
        };
        MountReport {
            registration_cache: CacheFigures {
                policy: "mrrc".into(),
                lookups: 4,
                counters: CacheStats {
                    hits: 2,
                    subset_hits: 1,
                    misses: 1,
                    regions: 3,
                    ..Default::default()
                },
            },
            fabric: FabricFigures {
                name: "tcp".into(),
                ops: crate::fabric::OpCounters {
                    reads: 7,
                    bytes_read: 28672,
                    ..Default::default()
                },
                unpinned_bytes: 4096,
                ..Default::default()
            },
            fabric_batches: [("read".to_string(), op(7, 45, 64, 128))].into(),
            servers: vec![
                ServerFigures {
                    id: 0,
                    addr: "127.0.0.1:7471".into(),
                    state: "up".into(),
                    free_bytes: 10,
                    total_bytes: 20,
                    ..Default::default()
                },
                ServerFigures {
                    id: 1,
                    addr: "127.0.0.1:7472".into(),
                    state: "down".into(),
                    since: 86_400,
                    total_bytes: 20,
                    downs: 2,
                    ..Default::default()
                },
            ],
            chunks: ChunkFigures {
                copies: 2,
                healthy: 5,
                degraded: 1,
                lost: 0,
                surplus: 0,
                moving: 0,
                moving_bytes: 0,
            },
            rebuild: RebuildFigures {
                running: true,
                passes: 1,
                ..Default::default()
            },
            namespace: NamespaceFigures {
                commits: 12,
                changes: 40,
            },
            inodes: 9,
            upkeep_panics: [
                ("heartbeat".to_string(), 0),
                ("reconnect".to_string(), 2),
                ("rebuild".to_string(), 1),
            ]
            .into(),
            requests: [
                ("read".to_string(), op(7, 70, 64, 128)),
                ("lookup".to_string(), op(2, 10, 16, 16)),
            ]
            .into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_text_renders_every_section_of_the_report() {
        let text = render(&sample());
        for line in [
            "registration cache: mrrc",
            "  lookups 4 (hits 2, subset hits 1, overlaps 0, misses 1), hit ratio 75.0%",
            "  cached regions 3, pinned 0 pages",
            "fabric: tcp",
            "  reads 7 (28672 bytes), writes 0 (0 bytes), failed 0 (remote access errors 0); \
             remote requests refused here 0",
            "    read 7 45 64 128 129",
            "chunks: 2 copies each; healthy 5, degraded 1, lost 0",
            "namespace: commits 12, changes 40",
            "inodes: 9",
            "upkeep threads started again after a panic: heartbeat 0, rebuild 1, reconnect 2",
            "  lookup 2 10 16 16 17",
            "  read 7 70 64 128 129",
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

    /// Scripts read these keys (`chunks.degraded`, `rebuild.bytes_copied`, ...): the JSON
    /// keeps them, with their nesting.
    #[test]
    fn the_json_keeps_the_keys_scripts_read() {
        let v = sample().to_json();
        for path in [
            "chunks.degraded",
            "chunks.lost",
            "chunks.healthy",
            "chunks.copies",
            "rebuild.bytes_copied",
            "rebuild.running",
            "rebuild.chunks_rebuilt",
            "fabric.unpinned_bytes",
            "fabric.name",
            "fuse.transport",
            "fuse.access_times",
            "writeback.new_handles",
            "writeback.dirty_limit_bytes",
            "writeback.free_room_bytes",
            "registration_cache.hits",
            "requests.read.count",
            "requests.read.total_ns",
            "fabric_batches.read.p99_us",
            "upkeep_panics.reconnect",
            "namespace.commits",
            "inodes",
            "contained_panics",
        ] {
            let found = path.split('.').try_fold(&v, |v, k| v.get(k));
            assert!(found.is_some(), "{path} missing from {v}");
        }
        let server = &v["servers"][1];
        for key in [
            "id",
            "addr",
            "state",
            "since",
            "free_bytes",
            "total_bytes",
            "stocked_bytes",
            "downs",
        ] {
            assert!(server.get(key).is_some(), "servers[].{key} missing");
        }
        assert_eq!(server["state"], "down");
        assert_eq!(v["chunks"]["degraded"], 1);
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        // 2024-02-29 12:34:56 UTC, a leap day.
        assert_eq!(utc(1_709_210_096), "2024-02-29 12:34:56 UTC");
    }
}
