//! A memory server's report: `rmemfs stats --server` (text and `--json`) and its Prometheus
//! metrics render one typed struct, [`ServerReport`]. Its counters are
//! [`ServerCounters`]'s, named once there (`KEYS` beside the labels, in wire order).

use crate::proto::{Capacity, ServerCounters};
use serde::Serialize;
use std::fmt::Write;

/// One counter: its label (text, metric help) and value; none for what this server's
/// software cannot see (remote refusals on verbs: the NIC refuses them unseen).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counter {
    pub label: &'static str,
    pub value: Option<u64>,
}

/// What `rmemfs stats --server --json` shows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ServerReport {
    pub server: String,
    pub fabric: String,
    /// This server process's instance (hex), as its hello says.
    pub instance: String,
    pub free_bytes: u64,
    pub total_bytes: u64,
    pub largest_free_bytes: u64,
    pub clients: u32,
    pub extents: u64,
    /// Its arena and extent table live in a file (`serve --backing`): a restart keeps them.
    pub backed: bool,
    /// Under [`ServerCounters::KEYS`], in wire order (`null` for a figure not seen).
    #[serde(flatten, serialize_with = "counter_values")]
    pub counters: Vec<(&'static str, Counter)>,
}

fn counter_values<S: serde::Serializer>(
    counters: &[(&'static str, Counter)],
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut m = s.serialize_map(Some(counters.len()))?;
    for (k, c) in counters {
        m.serialize_entry(k, &c.value)?;
    }
    m.end()
}

impl ServerReport {
    pub fn new(
        addr: &str,
        fabric: &str,
        instance: u64,
        capacity: Capacity,
        clients: u32,
        extents: u64,
        counters: &ServerCounters,
    ) -> ServerReport {
        let counters = counters
            .fields()
            .into_iter()
            .zip(ServerCounters::KEYS)
            .map(|((label, value), key)| {
                let seen = !(key == "remote_refused" && fabric == "verbs");
                (
                    key,
                    Counter {
                        label,
                        value: seen.then_some(value),
                    },
                )
            })
            .collect();
        ServerReport {
            server: addr.into(),
            fabric: fabric.into(),
            instance: format!("{instance:#x}"),
            free_bytes: capacity.free,
            total_bytes: capacity.total,
            largest_free_bytes: capacity.largest_free,
            clients,
            extents,
            backed: false,
            counters,
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("the report serializes")
    }

    /// `rmemfs stats --server`.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "memory server {}: fabric {}, instance {}",
            self.server, self.fabric, self.instance
        );
        let _ = writeln!(
            out,
            "  memory: {} of {} bytes free, largest free extent {}",
            self.free_bytes, self.total_bytes, self.largest_free_bytes
        );
        let _ = writeln!(out, "  clients {}, extents {}", self.clients, self.extents);
        if self.backed {
            let _ = writeln!(out, "  backed by a file: its extents outlive a restart");
        }
        for (_, c) in &self.counters {
            match c.value {
                Some(v) => {
                    let _ = writeln!(out, "  {}: {v}", c.label);
                }
                // An RDMA NIC refuses them without the server's software seeing it; the
                // client's `stats` counts them as remote access errors.
                None => {
                    let _ = writeln!(out, "  {}: not seen by software on verbs", c.label);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_text_come_from_one_report() {
        let counters = ServerCounters {
            refused_secret: 2,
            remote_refused: 5,
            ..Default::default()
        };
        let cap = Capacity {
            total: 9,
            free: 5,
            largest_free: 4,
        };
        let tcp = ServerReport::new("127.0.0.1:7471", "tcp", 0xab, cap, 1, 3, &counters);
        let v = tcp.to_json();
        for key in ServerCounters::KEYS {
            assert!(v.get(key).is_some(), "{key} missing from {v}");
        }
        assert_eq!(v["refused_secret"], 2);
        assert_eq!(v["remote_refused"], 5);
        assert_eq!(v["instance"], "0xab");
        assert_eq!(v["free_bytes"], 5);
        let text = tcp.text();
        assert!(
            text.contains("  handshakes refused: secrets differ: 2\n"),
            "{text}"
        );
        assert!(text.contains("  remote accesses refused: 5\n"), "{text}");
        let verbs = ServerReport::new("127.0.0.1:7471", "verbs", 1, cap, 1, 3, &counters);
        assert!(verbs.to_json()["remote_refused"].is_null());
        assert!(verbs
            .text()
            .contains("remote accesses refused: not seen by software on verbs"));
    }
}
