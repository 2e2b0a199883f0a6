//! What the lab's charts share: an axis with chosen ticks and round axis steps.

use plotters::coord::ranged1d::Ranged;

/// A y axis from 0 with about five "nice" steps up to at least `max`: (top, step).
pub fn nice_axis(max: f64) -> (f64, f64) {
    if !(max.is_finite() && max > 0.0) {
        return (1.0, 0.2);
    }
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * mag);
    ((max / step - 1e-9).ceil().max(1.0) * step, step)
}

/// A linear f64 axis whose ticks (and grid lines) are exactly `ticks` (the simulated cache
/// sizes, the positions of bar groups, the [`nice_axis`] steps). plotters' own
/// `WithKeyPoints` has no default label formatting, which its mesh needs.
pub struct TickAxis {
    pub range: std::ops::Range<f64>,
    pub ticks: Vec<f64>,
}

impl Ranged for TickAxis {
    type FormatOption = plotters::coord::ranged1d::DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let span = self.range.end - self.range.start;
        if span <= 0.0 {
            return (limit.0 + limit.1) / 2;
        }
        let t = (v - self.range.start) / span;
        limit.0 + (t * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<Hint: plotters::coord::ranged1d::KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.range.clone()
    }
}
