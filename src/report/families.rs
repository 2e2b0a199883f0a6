//! Every metric of a mount and of a memory server, declared once: a [`Family`] is a name,
//! its help, its kind and its samples, each with its labels. The lists below are the only
//! place a metric is named; the Prometheus encoder ([`super::metrics`]) writes whatever
//! list it is given in one loop, so a new counter is one line here (or, in a generic
//! section declared with `figures!`, one field there). Only the latency histograms, whose
//! samples are bucket series, are encoded beside the loop.

use super::{MetricKind, MountReport};
use crate::requests::OpSummary;
use crate::server::ServerReport;
use MetricKind::{Counter, Gauge};

/// One metric family: its samples, each a set of labels and a value. Gauges here are never
/// negative, so every value is a `u64`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Family {
    /// The metric's name (a counter's `_total` is the encoder's).
    pub name: String,
    pub help: &'static str,
    pub kind: MetricKind,
    pub samples: Vec<(Vec<(String, String)>, u64)>,
}

impl Family {
    /// An unlabelled metric.
    fn one(name: impl Into<String>, kind: MetricKind, help: &'static str, value: u64) -> Family {
        Family {
            name: name.into(),
            help,
            kind,
            samples: vec![(Vec::new(), value)],
        }
    }

    /// A metric with one sample per `(label value, value)` under the label `label`.
    fn by<L: Into<String>>(
        name: &str,
        kind: MetricKind,
        help: &'static str,
        label: &str,
        values: impl IntoIterator<Item = (L, u64)>,
    ) -> Family {
        Family {
            name: name.into(),
            help,
            kind,
            samples: values
                .into_iter()
                .map(|(l, v)| (vec![(label.to_string(), l.into())], v))
                .collect(),
        }
    }
}

impl MountReport {
    /// The mount's metrics (but its latency histograms), with the request counts of `ops`.
    pub fn families(&self, ops: &[OpSummary]) -> Vec<Family> {
        let (f, c) = (&self.fabric.ops, &self.registration_cache.counters);
        let (ch, r) = (&self.chunks, &self.rebuild);
        let per_server = |value: fn(&super::ServerFigures) -> u64| {
            self.servers
                .iter()
                .map(move |x| (x.addr.clone(), value(x)))
                .collect::<Vec<_>>()
        };
        let mut all = vec![
            Family::by(
                "rmemfs_requests",
                Counter,
                "FUSE requests answered, by operation",
                "op",
                ops.iter().map(|o| (o.op, o.count)),
            ),
            Family::by(
                "rmemfs_fabric_operations",
                Counter,
                "One-sided operations this mount posted, by kind",
                "kind",
                [("read", f.reads), ("write", f.writes)],
            ),
            Family::by(
                "rmemfs_fabric_bytes",
                Counter,
                "Bytes moved by one-sided operations, by direction",
                "direction",
                [("read", f.bytes_read), ("written", f.bytes_written)],
            ),
            Family::one(
                "rmemfs_fabric_failed_operations",
                Counter,
                "Operations that failed",
                f.failed,
            ),
            Family::one(
                "rmemfs_fabric_remote_access_errors",
                Counter,
                "Operations a server refused (bad key, bounds or session)",
                f.remote_errors,
            ),
            Family::one(
                "rmemfs_fabric_registrations",
                Counter,
                "Memory registrations made",
                f.registrations,
            ),
            Family::one(
                "rmemfs_pinned_bytes",
                Gauge,
                "Bytes pinned by registrations",
                self.fabric.pinned_bytes,
            ),
            Family::one(
                "rmemfs_unpinned_bytes",
                Gauge,
                "Bytes registered unpinned because the memlock limit refused more",
                self.fabric.unpinned_bytes,
            ),
            Family::by(
                "rmemfs_registration_cache_lookups",
                Counter,
                "Registration cache lookups, by result",
                "result",
                [
                    ("hit", c.hits),
                    ("subset_hit", c.subset_hits),
                    ("overlap", c.overlaps),
                    ("miss", c.misses),
                ],
            ),
            Family::by(
                "rmemfs_server_up",
                Gauge,
                "1 while the memory server is up (draining too), 0 while down, rejoining or \
                 removed",
                "server",
                per_server(|x| u64::from(x.state == "up" || x.state == "draining")),
            ),
            Family::by(
                "rmemfs_server_free_bytes",
                Gauge,
                "Free memory the server last reported",
                "server",
                per_server(|x| x.free_bytes),
            ),
            Family::by(
                "rmemfs_server_total_bytes",
                Gauge,
                "The server's arena",
                "server",
                per_server(|x| x.total_bytes),
            ),
            Family::by(
                "rmemfs_server_downs",
                Gauge,
                "Times the server was seen to go down since the mount",
                "server",
                per_server(|x| x.downs),
            ),
            Family::one(
                "rmemfs_chunk_copies",
                Gauge,
                "Copies kept of every chunk",
                ch.copies,
            ),
            Family::by(
                "rmemfs_chunks",
                Gauge,
                "Chunks by health: all copies, some missing (degraded), none left (lost)",
                "state",
                [
                    ("healthy", ch.healthy),
                    ("degraded", ch.degraded),
                    ("lost", ch.lost),
                ],
            ),
            Family::one(
                "rmemfs_rebuild_running",
                Gauge,
                "1 while a rebuild pass runs",
                u64::from(r.running),
            ),
            Family::one(
                "rmemfs_rebuild_chunks",
                Counter,
                "Chunks copied by rebuilds",
                r.chunks_rebuilt,
            ),
            Family::one(
                "rmemfs_rebuild_bytes",
                Counter,
                "Bytes copied by rebuilds",
                r.bytes_copied,
            ),
            Family::one(
                "rmemfs_chunks_copied_on_write",
                Counter,
                "Chunks given a new copy by a write, their copy on a down server having missed it",
                r.chunks_copied_on_write,
            ),
            Family::one(
                "rmemfs_rebuild_chunks_left",
                Gauge,
                "Chunks still short of copies after the last rebuild pass",
                r.chunks_left_degraded,
            ),
            Family::one(
                "rmemfs_drain_bytes_left",
                Gauge,
                "Bytes of chunk copies still on draining servers (0: no drain under way)",
                ch.moving_bytes,
            ),
            Family::one(
                "rmemfs_drain_rate_bytes_per_second",
                Gauge,
                "Bytes per second the drain under way has moved (0: none)",
                self.drain.as_ref().map_or(0, |d| d.rate_bytes_per_s),
            ),
            Family::one(
                "rmemfs_inodes",
                Gauge,
                "Inodes the mount holds",
                self.inodes,
            ),
            Family::one(
                "rmemfs_contained_panics",
                Counter,
                "Requests failed with EIO by a contained panic",
                self.contained_panics,
            ),
            Family::by(
                "rmemfs_upkeep_panics",
                Counter,
                "Panics of an upkeep thread, by thread (each logged, and the thread went on)",
                "thread",
                self.upkeep_panics.iter().map(|(t, n)| (t.clone(), *n)),
            ),
        ];
        // The generic sections: each figure once, named after its section and key.
        for (section, figures) in self.sections() {
            all.extend(figures.into_iter().map(|f| {
                Family::one(
                    format!("rmemfs_{section}_{}", f.key),
                    f.kind,
                    f.help,
                    f.value,
                )
            }));
        }
        all
    }
}

impl ServerReport {
    /// The server's metrics.
    pub fn families(&self) -> Vec<Family> {
        let mut all = vec![
            Family::one(
                "rmemfs_serve_free_bytes",
                Gauge,
                "Free memory in the arena",
                self.free_bytes,
            ),
            Family::one(
                "rmemfs_serve_total_bytes",
                Gauge,
                "The arena",
                self.total_bytes,
            ),
            Family::one(
                "rmemfs_serve_largest_free_bytes",
                Gauge,
                "The largest free extent",
                self.largest_free_bytes,
            ),
            Family::one(
                "rmemfs_serve_clients",
                Gauge,
                "Clients connected",
                u64::from(self.clients),
            ),
            Family::one(
                "rmemfs_serve_extents",
                Gauge,
                "Extents handed out",
                self.extents,
            ),
        ];
        // The protocol's counters, under their keys; a figure the server cannot see (remote
        // refusals on verbs) is left out.
        for (key, c) in &self.counters {
            let Some(v) = c.value else { continue };
            all.push(if *key == "leased_sessions" {
                // Sessions held under a lease now: a gauge.
                Family::one(
                    "rmemfs_serve_leased_sessions",
                    Gauge,
                    "Sessions held under a lease (clients gone without a goodbye)",
                    v,
                )
            } else {
                Family::one(format!("rmemfs_serve_{key}"), Counter, c.label, v)
            });
        }
        all
    }
}
