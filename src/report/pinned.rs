//! The names scripts and dashboards read, pinned: every key path of `stats --json` and of
//! `stats --server --json`, and every metric family of the mount's and the server's
//! endpoints. A rename, or a figure gone, fails here first; a new figure is added to the
//! lists on purpose.

use super::*;

/// A mount's report with every section present: a drain running, a volume's journal, a
/// follower, a shared volume's client, a request and a fabric batch of one kind each.
pub(crate) fn every_section() -> MountReport {
    MountReport {
        fabric_batches: [("read".to_string(), OpFigures::default())].into(),
        servers: vec![ServerFigures::default()],
        drain: Some(DrainFigures {
            eta_seconds: Some(1),
            ..Default::default()
        }),
        journal: Some(JournalFigures::default()),
        follower: Some(FollowerFigures::default()),
        shared: Some(SharedFigures::default()),
        upkeep_panics: crate::upkeep::figures::UPKEEP_THREADS
            .map(|t| (t.to_string(), 0))
            .into(),
        requests: [("read".to_string(), OpFigures::default())].into(),
        ..Default::default()
    }
}

/// A server's report, every counter seen (the tcp fabric's).
pub(crate) fn a_server() -> crate::server::ServerReport {
    let capacity = crate::proto::Capacity {
        total: 2,
        free: 1,
        largest_free: 1,
    };
    let counters = crate::proto::ServerCounters::default();
    crate::server::ServerReport::new("127.0.0.1:7471", "tcp", 1, capacity, 0, 0, &counters)
}

/// Every leaf's dotted path (`servers[].addr`; the maps keyed by operation as `*`).
fn key_paths(v: &serde_json::Value) -> Vec<String> {
    fn walk(v: &serde_json::Value, path: String, out: &mut Vec<String>) {
        let by_op = ["requests", "fabric_batches"].contains(&path.as_str());
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    let k = if by_op { "*" } else { k.as_str() };
                    let p = if path.is_empty() {
                        k.to_string()
                    } else {
                        format!("{path}.{k}")
                    };
                    walk(x, p, out);
                }
            }
            serde_json::Value::Array(a) => {
                for x in a {
                    walk(x, format!("{path}[]"), out);
                }
            }
            _ => out.push(path),
        }
    }
    let mut out = Vec::new();
    walk(v, String::new(), &mut out);
    out.sort();
    out.dedup();
    out
}

/// Lines in `want` and not `got` (gone), and in `got` and not `want` (new).
fn differences(want: &[&str], got: &[String]) -> String {
    let gone: Vec<&str> = want
        .iter()
        .copied()
        .filter(|w| !got.iter().any(|g| g == w))
        .collect();
    let new: Vec<&String> = got.iter().filter(|g| !want.contains(&g.as_str())).collect();
    format!("gone: {gone:?}\nnew: {new:?}")
}

pub(crate) fn assert_pinned(what: &str, want: &[&str], got: &[String]) {
    assert!(
        want.len() == got.len() && want.iter().zip(got).all(|(w, g)| w == g),
        "{what} changed (scripts and dashboards read them):\n{}",
        differences(want, got)
    );
}

#[test]
fn every_key_of_stats_json_is_pinned() {
    let got = key_paths(&every_section().to_json());
    assert_pinned("the keys of stats --json", MOUNT_KEYS, &got);
}

#[test]
fn every_key_of_the_servers_stats_json_is_pinned() {
    let got = key_paths(&a_server().to_json());
    assert_pinned("the keys of stats --server --json", SERVER_KEYS, &got);
}

/// `stats --json`, as scripts read it.
const MOUNT_KEYS: &[&str] = &[
    "admin_socket",
    "chunks.copies",
    "chunks.degraded",
    "chunks.healthy",
    "chunks.lost",
    "chunks.moving",
    "chunks.moving_bytes",
    "chunks.surplus",
    "contained_panics",
    "drain.bytes_left",
    "drain.bytes_moved",
    "drain.eta_seconds",
    "drain.rate_bytes_per_s",
    "drain.seconds",
    "drain.server",
    "encoding.bytes_encoded",
    "encoding.copy_bytes",
    "encoding.data_fragments",
    "encoding.parity_fragments",
    "encoding.passes",
    "encoding.pending",
    "encoding.stripe_bytes",
    "encoding.stripes",
    "encoding.stripes_degraded",
    "encoding.stripes_made",
    "fabric.bytes_read",
    "fabric.bytes_written",
    "fabric.deregistration_batches",
    "fabric.deregistrations",
    "fabric.failed",
    "fabric.name",
    "fabric.pinned_bytes",
    "fabric.reads",
    "fabric.registrations",
    "fabric.remote_errors",
    "fabric.remote_refused",
    "fabric.unpinned_bytes",
    "fabric.writes",
    "fabric_batches.*.count",
    "fabric_batches.*.max_us",
    "fabric_batches.*.mean_us",
    "fabric_batches.*.p50_us",
    "fabric_batches.*.p99_us",
    "fabric_batches.*.total_ns",
    "follower.applied",
    "follower.errors",
    "follower.invalidations",
    "follower.polls",
    "follower.records",
    "follower.reloads",
    "fuse.access_times",
    "fuse.in_flight",
    "fuse.resent",
    "fuse.transport",
    "inodes",
    "journal.bytes",
    "journal.checkpoints",
    "journal.committed",
    "journal.epoch",
    "journal.frees_held",
    "journal.groups",
    "namespace.changes",
    "namespace.commits",
    "rebuild.bytes_copied",
    "rebuild.chunks_copied_on_write",
    "rebuild.chunks_left_degraded",
    "rebuild.chunks_rebuilt",
    "rebuild.last_rate_bytes_per_s",
    "rebuild.passes",
    "rebuild.running",
    "registration_cache.deregistered_pages",
    "registration_cache.deregistration_batches",
    "registration_cache.deregistrations",
    "registration_cache.full_events",
    "registration_cache.hits",
    "registration_cache.lookups",
    "registration_cache.misses",
    "registration_cache.overlaps",
    "registration_cache.pinned_pages",
    "registration_cache.policy",
    "registration_cache.regions",
    "registration_cache.registered_pages",
    "registration_cache.registrations",
    "registration_cache.subset_hits",
    "requests.*.count",
    "requests.*.max_us",
    "requests.*.mean_us",
    "requests.*.p50_us",
    "requests.*.p99_us",
    "requests.*.total_ns",
    "servers[].addr",
    "servers[].downs",
    "servers[].free_bytes",
    "servers[].id",
    "servers[].since",
    "servers[].state",
    "servers[].stocked_bytes",
    "servers[].total_bytes",
    "shared.applied",
    "shared.keeper",
    "shared.large",
    "shared.noted_inodes",
    "shared.whole",
    "upkeep_panics.encode",
    "upkeep_panics.heartbeat",
    "upkeep_panics.rebuild",
    "upkeep_panics.reconnect",
    "upkeep_panics.write-behind",
    "writeback.behind.deferred",
    "writeback.behind.failed",
    "writeback.behind.sent_by_worker",
    "writeback.behind.sent_inline",
    "writeback.cache",
    "writeback.dirty_limit_bytes",
    "writeback.free_room_bytes",
    "writeback.new_handles",
];

/// `stats --server --json`.
const SERVER_KEYS: &[&str] = &[
    "backed",
    "clients",
    "extents",
    "fabric",
    "failed_handshakes",
    "free_bytes",
    "instance",
    "largest_free_bytes",
    "leased_sessions",
    "protocol_violations",
    "refused_max_clients",
    "refused_no_space",
    "refused_peer_cap",
    "refused_quota",
    "refused_secret",
    "remote_refused",
    "resumed_sessions",
    "server",
    "total_bytes",
];
