//! The chart of `lab/scripts/bench-fio.sh`: its summary.json (fio results per target and job) as
//! grouped bars, one panel for the 1 MiB jobs (MB/s) and one for the 4 KiB jobs (thousands
//! of IOPS), so the gaps between tmpfs, the in-process mount and the tcp mounts show at a
//! glance. The y axes are logarithmic: tmpfs runs 50 times faster than any FUSE file system
//! at 4 KiB, and a linear axis would flatten every other bar. The numbers themselves are in
//! the script's tables and JSON.

use crate::bars::{self, Panel, Spec};
use serde_json::Value;

/// Jobs of 1 MiB blocks, plotted in MB/s, in this order (those present).
const BIG_JOBS: [&str; 6] = [
    "seq-read",
    "seq-read-4j",
    "seq-write",
    "seq-write-4j",
    "seq-fresh",
    "seq-overwrite",
];
/// Jobs of 4 KiB blocks, plotted in thousands of IOPS.
const SMALL_JOBS: [&str; 4] = ["rand-read", "rand-read-4j", "rand-write", "rand-write-4j"];

/// The targets of `summary["results"]` in `order` first (those present), then any others
/// by name.
fn targets(results: &serde_json::Map<String, Value>, order: &[&str]) -> Vec<String> {
    let mut names: Vec<String> = order
        .iter()
        .filter(|t| results.contains_key(**t))
        .map(|t| t.to_string())
        .collect();
    let mut rest: Vec<String> = results
        .keys()
        .filter(|k| !order.contains(&k.as_str()))
        .cloned()
        .collect();
    rest.sort();
    names.extend(rest);
    names
}

fn build_panel(
    results: &serde_json::Map<String, Value>,
    targets: &[String],
    jobs: &[&'static str],
    field: &str,
    scale: f64,
    heading: &str,
    unit: &str,
) -> Panel {
    let present: Vec<&'static str> = jobs
        .iter()
        .copied()
        .filter(|j| targets.iter().any(|t| results[t].get(*j).is_some()))
        .collect();
    let values = present
        .iter()
        .map(|j| {
            targets
                .iter()
                .map(|t| {
                    results[t]
                        .get(*j)
                        .and_then(|r| r.get(field))
                        .and_then(Value::as_f64)
                        .unwrap_or(0.0)
                        * scale
                })
                .collect()
        })
        .collect();
    Panel {
        heading: heading.into(),
        unit: unit.into(),
        log: true,
        groups: present.iter().map(|j| j.to_string()).collect(),
        values,
    }
}

/// The chart of a bench-fio summary, as SVG text; `order` puts the known targets first.
pub fn render(summary: &Value, order: &[&str]) -> Result<String, String> {
    let results = summary
        .get("results")
        .and_then(Value::as_object)
        .ok_or("the summary has no \"results\" object")?;
    let targets = targets(results, order);
    if targets.is_empty() {
        return Err("the summary has no results".into());
    }
    let big = build_panel(
        results,
        &targets,
        &BIG_JOBS,
        "mb_s",
        1.0,
        "1 MiB blocks: throughput",
        "MB/s",
    );
    let small = build_panel(
        results,
        &targets,
        &SMALL_JOBS,
        "iops",
        1e-3,
        "4 KiB blocks: operations",
        "thousands of IOPS",
    );
    let title = match summary.get("config") {
        Some(c) => format!(
            "fio on rmemfs and its peers (size {}, {} s per job)",
            c.get("size").and_then(Value::as_str).unwrap_or("?"),
            c.get("runtime_s").and_then(Value::as_u64).unwrap_or(0)
        ),
        None => "fio on rmemfs and its peers".into(),
    };
    let panels = [big, small]
        .into_iter()
        .filter(|p| !p.groups.is_empty())
        .collect();
    bars::render(&Spec {
        title,
        series: targets,
        panels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary() -> Value {
        serde_json::json!({
            "config": {"size": "256M", "runtime_s": 10},
            "results": {
                "rmemfs-1": {"seq-read": {"mb_s": 1500.0, "iops": 1500.0},
                             "rand-write": {"mb_s": 50.0, "iops": 12000.0}},
                "tmpfs": {"seq-read": {"mb_s": 6000.0, "iops": 6000.0},
                          "rand-write": {"mb_s": 900.0, "iops": 230000.0}},
            }
        })
    }

    #[test]
    fn every_target_and_job_is_drawn() {
        let svg = render(&summary(), &["tmpfs", "rmemfs-1"]).unwrap();
        for text in ["tmpfs", "rmemfs-1", "seq-read", "rand-write", "size 256M"] {
            assert!(svg.contains(text), "{text} missing from the chart");
        }
        // Two bars per group (2 targets), one group per panel, plus the 2 legend swatches.
        assert_eq!(svg.matches("<rect").count() - 1, 2 + 2 + 2, "{svg}");
        // Jobs nobody ran get no group.
        assert!(!svg.contains("seq-write"));
    }

    #[test]
    fn a_summary_without_results_is_an_error() {
        assert!(render(&serde_json::json!({}), &[]).is_err());
        assert!(render(&serde_json::json!({"results": {}}), &[]).is_err());
    }
}
