//! `--plot FILE.svg`: admitted and rejected requests per second over the log's time,
//! one panel per simulated limit (and configuration), drawn with plotters.

use std::path::Path;

use plotters::prelude::*;

use super::replay::Replay;

/// Points drawn per line at most: longer logs are summed into wider buckets.
const BUCKETS: u64 = 600;

/// Draws the series of every simulated limit of `replays` into the SVG file `path`.
pub fn draw(path: &Path, replays: &[Replay]) -> Result<(), String> {
    let mut panels = Vec::new();
    for replay in replays {
        for (i, limit) in replay.config.limits.iter_enumerated() {
            let tally = &replay.tally.limits[i];
            // Not simulated: the log could not drive it, or no line recorded its key.
            if replay.skipped[i].is_some() || (tally.counts.requests == 0 && tally.not_simulated > 0) {
                continue;
            }
            let title = match replays.len() {
                1 => format!("limit {}", limit.name),
                _ => format!("limit {} ({})", limit.name, replay.name),
            };
            panels.push((title, tally.series()));
        }
    }
    let start = panels.iter().filter_map(|(_, s)| s.first().map(|p| p.0)).min().unwrap_or(0);
    let end = panels.iter().filter_map(|(_, s)| s.last().map(|p| p.0)).max().unwrap_or(0);
    let bucket = ((end - start + 1).div_ceil(BUCKETS)).max(1);
    let height = u32::try_from(240 * panels.len().max(1)).unwrap_or(u32::MAX);
    let root = SVGBackend::new(path, (960, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    for (area, (title, series)) in root.split_evenly((panels.len().max(1), 1)).iter().zip(&panels) {
        // Requests per second, averaged over each bucket.
        let mut sums = vec![[0u64; 2]; usize::try_from((end - start) / bucket + 1).unwrap_or(0)];
        for &(second, counts) in series {
            let slot = &mut sums[usize::try_from((second - start) / bucket).unwrap_or(0)];
            slot[0] += counts[0];
            slot[1] += counts[1];
        }
        let rate = |i: usize, which: usize| sums[i][which] as f64 / bucket as f64;
        let top = sums.iter().flat_map(|s| s.iter()).copied().max().unwrap_or(1).max(1) as f64 / bucket as f64;
        let span = ((end - start + 1) as f64).max(1.0);
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(32)
            .y_label_area_size(56)
            .build_cartesian_2d(0f64..span, 0f64..top * 1.1)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("seconds since the first request")
            .y_desc("requests/s")
            .draw()
            .map_err(|e| e.to_string())?;
        for (which, name, colour) in [(0, "admitted", GREEN.mix(0.9)), (1, "rejected", RED.mix(0.9))] {
            let points = (0..sums.len()).map(|i| ((i as u64 * bucket) as f64, rate(i, which)));
            chart
                .draw_series(LineSeries::new(points, colour.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}
