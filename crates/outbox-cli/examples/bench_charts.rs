//! Draws the charts of docs/benchmarks.md from a results file of `scripts/bench/scaling.sh`:
//! drain rate by batch size, commit → ack latency CDF, and throughput vs relay replicas.
//!
//! ```sh
//! cargo run -p outbox-cli --example bench_charts -- docs/img scripts/bench/results/scaling-X.json [MORE.json ...]
//! ```
//!
//! Writes `drain_by_batch.svg`, `latency_cdf.svg` and `replicas.svg` into the output
//! directory from the runs of every file given (a later file's run replaces an earlier one of
//! the same name). A chart whose runs are missing is skipped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use plotters::prelude::*;
use serde_json::Value;

const SIZE: (u32, u32) = (720, 420);
const COLOURS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(out), inputs) = (args.next(), args.collect::<Vec<_>>()) else {
        bail!("usage: bench_charts OUT_DIR RESULTS.json [MORE.json ...]");
    };
    if inputs.is_empty() {
        bail!("usage: bench_charts OUT_DIR RESULTS.json [MORE.json ...]");
    }
    let out = PathBuf::from(out);
    let mut by_name: BTreeMap<String, Value> = BTreeMap::new();
    for input in &inputs {
        let text = std::fs::read_to_string(input).with_context(|| format!("reading `{input}`"))?;
        let doc: Value =
            serde_json::from_str(&text).with_context(|| format!("`{input}` is not JSON"))?;
        let runs = doc["runs"]
            .as_array()
            .with_context(|| format!("`{input}` has no `runs` array (not a scaling.sh file?)"))?;
        for r in runs {
            by_name.insert(r["name"].as_str().unwrap_or_default().to_owned(), r.clone());
        }
    }
    let runs: Vec<Value> = by_name.into_values().collect();
    let runs = &runs;
    std::fs::create_dir_all(&out).with_context(|| format!("creating `{}`", out.display()))?;

    // name prefix -> (x, y) points, per series.
    let series =
        |prefix: &str, x: &dyn Fn(&Value) -> Option<f64>, y: &dyn Fn(&Value) -> Option<f64>| {
            let mut by: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
            for r in runs {
                let name = r["name"].as_str().unwrap_or_default();
                if let Some(rest) = name.strip_prefix(prefix)
                    && let (Some(x), Some(y)) = (x(r), y(r))
                {
                    let label = rest.split('.').next().unwrap_or_default().to_owned();
                    by.entry(label).or_default().push((x, y));
                }
            }
            for points in by.values_mut() {
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
            }
            by
        };

    let batches = series("batch.", &|r| r["batch_size"].as_f64(), &|r| {
        r["events_per_second"].as_f64()
    });
    if !batches.is_empty() {
        line_chart(
            &out.join("drain_by_batch.svg"),
            "Drain rate by batch size (outbox bench backlog, 2 workers)",
            "batch size",
            "events/s",
            &batches,
            true,
        )?;
    }

    let replicas = series("replicas.", &|r| r["replicas"].as_f64(), &|r| {
        r["rows_per_s"].as_f64()
    });
    if !replicas.is_empty() {
        line_chart(
            &out.join("replicas.svg"),
            "Drain rate vs relay replicas (separate processes, 1 worker each)",
            "relay processes",
            "events/s",
            &replicas,
            false,
        )?;
    }

    // Latency CDF: one series per run, x = ms, y = percentile.
    let mut cdf: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in runs {
        let name = r["name"].as_str().unwrap_or_default();
        if let Some(rest) = name.strip_prefix("latency.")
            && let Some(p) = r["latency_ms"]["percentiles"].as_array()
        {
            let label = format!(
                "{} @ {}/s",
                rest.split('.').next().unwrap_or_default(),
                rest.rsplit('.').next().unwrap_or_default()
            );
            let points = p
                .iter()
                .enumerate()
                .filter_map(|(i, v)| v.as_f64().map(|ms| (ms, i as f64)))
                .collect();
            cdf.insert(label, points);
        }
    }
    if !cdf.is_empty() {
        line_chart(
            &out.join("latency_cdf.svg"),
            "Commit -> ack latency CDF (outbox bench steady)",
            "latency, ms (log scale)",
            "percentile",
            &cdf,
            true,
        )?;
    }
    println!("charts written to {}", out.display());
    Ok(())
}

/// One line per series; `log_x` draws the x axis on a log scale.
fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &BTreeMap<String, Vec<(f64, f64)>>,
    log_x: bool,
) -> anyhow::Result<()> {
    let points = series.values().flatten();
    let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0.0f64);
    for &(x, y) in points {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    if log_x {
        x0 = x0.max(1e-3);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    macro_rules! plot {
        ($x:expr) => {{
            let mut chart = ChartBuilder::on(&root)
                .caption(title, ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d($x, 0.0..y1 * 1.1)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            chart
                .configure_mesh()
                .max_light_lines(1)
                .x_labels(10)
                .x_label_formatter(&|v| number(*v))
                .y_label_formatter(&|v| number(*v))
                .x_desc(x_label)
                .y_desc(y_label)
                .draw()
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            for (i, (name, pts)) in series.iter().enumerate() {
                let colour = COLOURS[i % COLOURS.len()];
                chart
                    .draw_series(LineSeries::new(pts.iter().copied(), colour.stroke_width(2)))
                    .map_err(|e| anyhow::anyhow!("{e}"))?
                    .label(name.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2))
                    });
                if pts.len() <= 12 {
                    chart
                        .draw_series(pts.iter().map(|&p| Circle::new(p, 3, colour.filled())))
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                }
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .position(SeriesLabelPosition::LowerRight)
                .draw()
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        }};
    }
    if log_x {
        plot!((x0 * 0.9..x1 * 1.1).log_scale());
    } else {
        plot!(x0 - 0.2..x1 + 0.2);
    }
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// Axis labels without a useless `.0`: `1`, `2.5`, `40000`.
fn number(v: f64) -> String {
    if v >= 100.0 || (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}
