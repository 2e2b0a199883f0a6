//! The chart of `tools/bench-fio.sh`: its summary.json (fio results per target and job) as
//! grouped bars, one panel for the 1 MiB jobs (MB/s) and one for the 4 KiB jobs (thousands
//! of IOPS), so the gaps between tmpfs, the in-process mount and the tcp mounts show at a
//! glance. The y axes are logarithmic: tmpfs runs 50 times faster than any FUSE file system
//! at 4 KiB, and a linear axis would flatten every other bar. The numbers themselves are in
//! the script's tables and JSON.

use crate::chart::TickAxis;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
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

const PALETTE: [RGBColor; 6] = [
    RGBColor(0x88, 0x88, 0x88),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
];

/// One bar group per job, one bar per target (0 where a target lacks the job).
struct Panel {
    heading: &'static str,
    y_label: &'static str,
    jobs: Vec<&'static str>,
    /// `values[job][target]`
    values: Vec<Vec<f64>>,
}

type DrawResult<'a> = Result<(), Box<dyn std::error::Error + 'a>>;

fn panel<'a>(
    area: &DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
    p: &Panel,
) -> DrawResult<'a> {
    let groups = p.jobs.len();
    // Log axis: ticks at 1, 3, 10, 30, ... between the decades around the values.
    let positive = || p.values.iter().flatten().copied().filter(|&v| v > 0.0);
    let max = positive().fold(1.0, f64::max);
    let min = positive().fold(max, f64::min);
    let (lo, hi) = (
        min.log10().floor().min(max.log10().floor() - 1.0),
        max.log10().ceil(),
    );
    let y_ticks: Vec<f64> = (lo as i32..=hi as i32)
        .flat_map(|d| [f64::from(d), f64::from(d) + 3f64.log10()])
        .filter(|&t| t <= hi)
        .collect();
    let mut chart = ChartBuilder::on(area)
        .caption(
            p.heading,
            ("sans-serif", 18).into_font().style(FontStyle::Bold),
        )
        .margin(12)
        .x_label_area_size(34)
        .y_label_area_size(70)
        .build_cartesian_2d(
            TickAxis {
                range: -0.5..groups as f64 - 0.5,
                ticks: (0..groups).map(|g| g as f64).collect(),
            },
            TickAxis {
                range: lo..hi,
                ticks: y_ticks,
            },
        )?;
    let jobs = p.jobs.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .bold_line_style(RGBColor(0xdd, 0xdd, 0xdd))
        .y_desc(p.y_label)
        .x_label_formatter(&move |v| {
            let g = v.round();
            if g >= 0.0 && (g as usize) < jobs.len() {
                jobs[g as usize].to_string()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|v| format!("{}", 10f64.powf(*v).round()))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .draw()?;
    for (g, row) in p.values.iter().enumerate() {
        let width = 0.8 / row.len().max(1) as f64;
        for (t, &v) in row.iter().enumerate() {
            let x0 = g as f64 - 0.4 + t as f64 * width;
            let colour = PALETTE[t % PALETTE.len()];
            if v > 0.0 {
                chart.draw_series(std::iter::once(Rectangle::new(
                    [(x0, lo), (x0 + width * 0.9, v.log10())],
                    colour.filled(),
                )))?;
            }
        }
    }
    Ok(())
}

fn legend<'a>(
    area: &DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
    targets: &[String],
) -> DrawResult<'a> {
    let (w, h) = area.dim_in_pixel();
    let entry = 170;
    let mut x = (w as i32 - entry * targets.len() as i32).max(0) / 2;
    let y = h as i32 / 2;
    for (t, name) in targets.iter().enumerate() {
        area.draw(&Rectangle::new(
            [(x, y - 7), (x + 24, y + 7)],
            PALETTE[t % PALETTE.len()].filled(),
        ))?;
        area.draw(&Text::new(
            name.clone(),
            (x + 32, y),
            TextStyle::from(("sans-serif", 16)).pos(Pos::new(HPos::Left, VPos::Center)),
        ))?;
        x += entry;
    }
    Ok(())
}

const SVG_W: u32 = 1200;
const SVG_H: u32 = 820;

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
    heading: &'static str,
    y_label: &'static str,
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
        heading,
        y_label,
        jobs: present,
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
        "MB/s (log scale)",
    );
    let small = build_panel(
        results,
        &targets,
        &SMALL_JOBS,
        "iops",
        1e-3,
        "4 KiB blocks: operations",
        "thousands of IOPS (log scale)",
    );
    let title = match summary.get("config") {
        Some(c) => format!(
            "fio on rmemfs and its peers (size {}, {} s per job)",
            c.get("size").and_then(Value::as_str).unwrap_or("?"),
            c.get("runtime_s").and_then(Value::as_u64).unwrap_or(0)
        ),
        None => "fio on rmemfs and its peers".into(),
    };
    let mut svg = String::new();
    draw(&mut svg, &title, &big, &small, &targets).map_err(|e| e.to_string())?;
    Ok(svg)
}

fn draw<'a>(
    buf: &'a mut String,
    title: &str,
    big: &Panel,
    small: &Panel,
    targets: &[String],
) -> DrawResult<'a> {
    let root = SVGBackend::with_string(buf, (SVG_W, SVG_H)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 24))?;
    let (charts, legend_area) = root.split_vertically(SVG_H as i32 - 80);
    let halves = charts.split_evenly((2, 1));
    for (area, p) in halves.iter().zip([big, small]) {
        if !p.jobs.is_empty() {
            panel(area, p)?;
        }
    }
    legend(&legend_area, targets)?;
    root.present()?;
    Ok(())
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
