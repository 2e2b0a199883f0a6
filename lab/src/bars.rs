//! Grouped bar charts from a small JSON spec, the chart every benchmark script ends with.
//!
//! Each `lab/scripts/bench-*.sh` writes its figures as a [`Spec`] and runs `rmemfs-bench bars SPEC
//! OUT.svg`, so the scripts share one way to draw (and one set of tests) instead of each
//! plotting its own. A spec names the series once (targets, settings: one colour each) and
//! holds one or more panels, each a set of bar groups (jobs, measures) in one unit:
//!
//! ```json
//! {"title": "...", "series": ["replicas 1", "replicas 2"],
//!  "panels": [{"heading": "1 MiB", "unit": "MB/s", "log": false,
//!              "groups": ["seq-read", "seq-write"], "values": [[1200, 1100], [900, 500]]}]}
//! ```
//!
//! `values[group][series]`; 0 draws no bar (a series that lacks the group). A log axis is for
//! panels whose bars differ by decades (tmpfs against FUSE at 4 KiB). Each bar carries its
//! figure, so the chart can be read without the table beside it.

use crate::chart::{nice_axis, TickAxis};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::Deserialize;

/// A chart: panels stacked top to bottom, one legend for the series below them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub title: String,
    pub series: Vec<String>,
    pub panels: Vec<Panel>,
}

/// One panel: bar groups along x, one bar per series in each.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Panel {
    pub heading: String,
    /// The y axis's description ("MB/s", "seconds").
    pub unit: String,
    /// A logarithmic y axis (ticks at 1, 3, 10, 30, ...).
    #[serde(default)]
    pub log: bool,
    pub groups: Vec<String>,
    /// `values[group][series]`, each finite and not negative.
    pub values: Vec<Vec<f64>>,
}

const PALETTE: [RGBColor; 6] = [
    RGBColor(0x88, 0x88, 0x88),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
];

const SVG_W: u32 = 1200;
/// Height per panel, and the title and legend bands around them.
const PANEL_H: u32 = 370;
const TITLE_H: u32 = 40;
const LEGEND_H: u32 = 70;
/// Legend entry width: a swatch and a name of ~18 characters at 16 px.
const LEGEND_ENTRY_W: i32 = 190;

type DrawResult<'a> = Result<(), Box<dyn std::error::Error + 'a>>;

impl Spec {
    /// Every panel's values match its groups and the series, and are finite and not negative.
    pub fn check(&self) -> Result<(), String> {
        if self.series.is_empty() || self.panels.is_empty() {
            return Err("the chart needs at least one series and one panel".into());
        }
        for p in &self.panels {
            if p.values.len() != p.groups.len() {
                return Err(format!(
                    "panel {:?}: {} groups but {} rows of values",
                    p.heading,
                    p.groups.len(),
                    p.values.len()
                ));
            }
            for (g, row) in p.groups.iter().zip(&p.values) {
                if row.len() != self.series.len() {
                    return Err(format!(
                        "panel {:?}, group {g:?}: {} values for {} series",
                        p.heading,
                        row.len(),
                        self.series.len()
                    ));
                }
                if let Some(v) = row.iter().find(|v| !v.is_finite() || **v < 0.0) {
                    return Err(format!(
                        "panel {:?}, group {g:?}: {v} is not a figure to draw",
                        p.heading
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A bar's figure as printed above it (and a tick's): three significant digits, no
/// exponent, whole numbers from 100 up.
fn figure(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else {
        let decimals = (2 - v.log10().floor() as i32).max(0) as usize;
        format!("{v:.decimals$}")
    }
}

/// The y range and ticks of a panel, in axis units (log10 of the value on a log axis).
fn y_axis(p: &Panel) -> (std::ops::Range<f64>, Vec<f64>) {
    let positive = || p.values.iter().flatten().copied().filter(|&v| v > 0.0);
    let max = positive().fold(0.0, f64::max);
    if p.log {
        // No positive value: one decade around 1.
        let max = if max > 0.0 { max } else { 1.0 };
        let min = positive().fold(max, f64::min);
        let (lo, hi) = (
            min.log10().floor().min(max.log10().floor() - 1.0),
            // Room above the tallest bar for its figure.
            (max.log10() + 0.15).ceil(),
        );
        let ticks = (lo as i32..=hi as i32)
            .flat_map(|d| [f64::from(d), f64::from(d) + 3f64.log10()])
            .filter(|&t| t <= hi)
            .collect();
        (lo..hi, ticks)
    } else {
        let (top, step) = nice_axis(max * 1.08);
        let ticks = (0..=(top / step).round() as i32)
            .map(|i| f64::from(i) * step)
            .collect();
        (0.0..top, ticks)
    }
}

fn panel<'a>(
    area: &DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
    p: &Panel,
) -> DrawResult<'a> {
    let groups = p.groups.len();
    let (y_range, y_ticks) = y_axis(p);
    let floor = y_range.start;
    let log = p.log;
    let mut chart = ChartBuilder::on(area)
        .caption(
            &p.heading,
            ("sans-serif", 18).into_font().style(FontStyle::Bold),
        )
        .margin(12)
        .x_label_area_size(34)
        .y_label_area_size(80)
        .build_cartesian_2d(
            TickAxis {
                range: -0.5..groups as f64 - 0.5,
                ticks: (0..groups).map(|g| g as f64).collect(),
            },
            TickAxis {
                range: y_range,
                ticks: y_ticks,
            },
        )?;
    let names = p.groups.clone();
    let unit = if log {
        format!("{} (log scale)", p.unit)
    } else {
        p.unit.clone()
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .bold_line_style(RGBColor(0xdd, 0xdd, 0xdd))
        .y_desc(unit)
        .x_label_formatter(&move |v| {
            let g = v.round();
            if g >= 0.0 && (g as usize) < names.len() {
                names[g as usize].clone()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&move |v| {
            if log {
                figure(10f64.powf(*v))
            } else {
                figure(*v)
            }
        })
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .draw()?;
    let label = TextStyle::from(("sans-serif", 13)).pos(Pos::new(HPos::Center, VPos::Bottom));
    for (g, row) in p.values.iter().enumerate() {
        let width = 0.8 / row.len().max(1) as f64;
        for (s, &v) in row.iter().enumerate() {
            if v <= 0.0 {
                continue;
            }
            let x0 = g as f64 - 0.4 + s as f64 * width;
            let top = if log { v.log10() } else { v };
            chart.draw_series(std::iter::once(Rectangle::new(
                [(x0, floor), (x0 + width * 0.9, top)],
                PALETTE[s % PALETTE.len()].filled(),
            )))?;
            chart.draw_series(std::iter::once(Text::new(
                figure(v),
                (x0 + width * 0.45, top),
                label.clone(),
            )))?;
        }
    }
    Ok(())
}

fn legend<'a>(
    area: &DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
    series: &[String],
) -> DrawResult<'a> {
    let (w, h) = area.dim_in_pixel();
    let mut x = (w as i32 - LEGEND_ENTRY_W * series.len() as i32).max(0) / 2;
    let y = h as i32 / 2;
    for (s, name) in series.iter().enumerate() {
        area.draw(&Rectangle::new(
            [(x, y - 7), (x + 24, y + 7)],
            PALETTE[s % PALETTE.len()].filled(),
        ))?;
        area.draw(&Text::new(
            name.clone(),
            (x + 32, y),
            TextStyle::from(("sans-serif", 16)).pos(Pos::new(HPos::Left, VPos::Center)),
        ))?;
        x += LEGEND_ENTRY_W;
    }
    Ok(())
}

fn draw<'a>(buf: &'a mut String, spec: &Spec) -> DrawResult<'a> {
    let height = TITLE_H + PANEL_H * spec.panels.len() as u32 + LEGEND_H;
    let root = SVGBackend::with_string(buf, (SVG_W, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(&spec.title, ("sans-serif", 24))?;
    let (charts, legend_area) = root.split_vertically((height - TITLE_H - LEGEND_H) as i32);
    let areas = charts.split_evenly((spec.panels.len(), 1));
    for (area, p) in areas.iter().zip(&spec.panels) {
        if !p.groups.is_empty() {
            panel(area, p)?;
        }
    }
    legend(&legend_area, &spec.series)?;
    root.present()?;
    Ok(())
}

/// The chart of `spec`, as SVG text.
pub fn render(spec: &Spec) -> Result<String, String> {
    spec.check()?;
    let mut svg = String::new();
    draw(&mut svg, spec).map_err(|e| e.to_string())?;
    Ok(svg)
}

/// Reads a spec from `input` (JSON) and writes its chart to `out`.
pub fn render_file(input: &std::path::Path, out: &std::path::Path) -> Result<(), String> {
    let text = std::fs::read_to_string(input)
        .map_err(|e| format!("cannot read {}: {e}", input.display()))?;
    let spec: Spec = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not a chart spec: {e}", input.display()))?;
    let svg = render(&spec).map_err(|e| format!("{}: {e}", input.display()))?;
    std::fs::write(out, svg).map_err(|e| format!("cannot write {}: {e}", out.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(log: bool) -> Spec {
        serde_json::from_value(serde_json::json!({
            "title": "switches",
            "series": ["mrrc", "lru", "none"],
            "panels": [
                {"heading": "writes", "unit": "MB/s", "log": log,
                 "groups": ["new", "overwrite"], "values": [[900, 850, 300], [1200, 0, 400]]},
                {"heading": "reads", "unit": "MB/s",
                 "groups": ["cold"], "values": [[2000, 1900, 1000]]}
            ]
        }))
        .unwrap()
    }

    #[test]
    fn every_bar_legend_and_figure_is_drawn() {
        for log in [false, true] {
            let svg = render(&spec(log)).unwrap();
            for text in [
                "switches",
                "mrrc",
                "lru",
                "none",
                "new",
                "overwrite",
                "cold",
            ] {
                assert!(svg.contains(text), "{text} missing from the chart");
            }
            // plotters writes each text's content on a line of its own.
            for figure in ["900", "1200", "1000", "2000"] {
                assert!(svg.lines().any(|l| l == figure), "figure {figure} missing");
            }
            // 8 bars (the 0 draws none) and 3 legend swatches, besides the background.
            assert_eq!(svg.matches("<rect").count() - 1, 8 + 3, "{svg}");
            // Two panels: taller than one.
            assert!(svg.contains(&format!("height=\"{}\"", TITLE_H + 2 * PANEL_H + LEGEND_H)));
        }
        assert!(render(&spec(true)).unwrap().contains("(log scale)"));
    }

    #[test]
    fn a_log_axis_of_small_values_reads_right() {
        let s: Spec = serde_json::from_value(serde_json::json!({
            "title": "t", "series": ["tmpfs", "rmemfs"],
            "panels": [{"heading": "seconds", "unit": "s", "log": true,
                        "groups": ["sync", "rm"], "values": [[0.003, 0.0029], [0.099, 0.31]]}]
        }))
        .unwrap();
        let svg = render(&s).unwrap();
        for figure in ["0.00300", "0.00290", "0.0990", "0.310"] {
            assert!(svg.lines().any(|l| l == figure), "figure {figure} missing");
        }
        // Ticks from 10^-3 up to 1, never two alike.
        let (range, ticks) = y_axis(&s.panels[0]);
        assert_eq!((range.start, range.end), (-3.0, 0.0));
        let labels: Vec<String> = ticks.iter().map(|t| figure(10f64.powf(*t))).collect();
        let mut unique = labels.clone();
        unique.dedup();
        assert_eq!(labels, unique);
    }

    #[test]
    fn a_spec_whose_shape_does_not_match_is_refused() {
        let mut s = spec(false);
        s.panels[0].values[1].pop();
        assert!(render(&s).unwrap_err().contains("2 values for 3 series"));
        let mut s = spec(false);
        s.panels[1].groups.push("warm".into());
        assert!(render(&s).unwrap_err().contains("2 groups but 1 rows"));
        let mut s = spec(false);
        s.panels[0].values[0][0] = f64::NAN;
        assert!(render(&s).is_err());
        let mut s = spec(false);
        s.series.clear();
        assert!(render(&s).is_err());
        assert!(
            serde_json::from_str::<Spec>(r#"{"title": "t", "series": [], "panel": []}"#).is_err()
        );
    }

    #[test]
    fn figures_keep_three_significant_digits() {
        assert_eq!(figure(99.94), "99.9");
        assert_eq!(figure(12345.4), "12345");
        assert_eq!(figure(42.66), "42.7");
        assert_eq!(figure(0.915), "0.915");
        assert_eq!(figure(0.0), "0");
        assert_eq!(figure(0.00123), "0.00123");
        assert_eq!(figure(0.003), "0.00300");
        assert_eq!(figure(4.56789), "4.57");
    }
}
