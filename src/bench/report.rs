//! `cabine bench report --dir DIR`: the Markdown report of a set of bench runs
//! (`DIR/benches.jsonl`, one JSON line per bench or chaos scenario, as they
//! printed it) with SVG plots of their series (`DIR/*-series.json`): messages
//! per second over time and the latency CDF. Every figure stands beside the
//! bound measured in the same run (inbound: the commit floor and the serial
//! bound; outbound: the bucket bound; leases: the Redis round trip), so the
//! ratio holds on any machine.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use serde_json::Value;

use super::series::Series;
use crate::chaos::HolderSeries;

/// Writes `DIR/report.md` and the plots beside it; answers the report's path.
pub fn render(dir: &Path) -> anyhow::Result<PathBuf> {
    let lines = std::fs::read_to_string(dir.join("benches.jsonl")).context("reading benches.jsonl")?;
    let runs: Vec<Value> =
        lines.lines().filter(|l| l.starts_with('{')).map(serde_json::from_str).collect::<Result<_, _>>()?;
    let mut md = String::from(
        "# cabine benchmark report\n\nEvery figure beside the bound measured in the same run on the same machine.\n",
    );
    for run in &runs {
        md.push_str(&figures(run));
    }
    for path in files_ending(dir, "-series.json")? {
        let s: Series =
            serde_json::from_slice(&std::fs::read(&path)?).with_context(|| format!("{}", path.display()))?;
        let (rates, cdf) = (format!("{}-throughput.svg", s.bench), format!("{}-latency-cdf.svg", s.bench));
        plot_lines(&dir.join(&rates), &format!("{}: messages per second", s.bench), "msg/s", &s.t_s, &s.rates)?;
        plot_cdf(&dir.join(&cdf), &s)?;
        let _ = write!(
            md,
            "\n## {} over time\n\n![{} messages per second]({rates})\n\n![{} CDF]({cdf})\n",
            s.bench, s.bench, s.cdf_of
        );
        if !s.states.is_empty() {
            let states = format!("{}-states.svg", s.bench);
            let title = format!("{}: messages by state", s.bench);
            plot_lines(&dir.join(&states), &title, "messages", &s.t_s, &s.states)?;
            let _ = write!(md, "\n![{} messages by state]({states})\n", s.bench);
        }
    }
    for path in files_ending(dir, "-holders.json")? {
        let h: HolderSeries =
            serde_json::from_slice(&std::fs::read(&path)?).with_context(|| format!("{}", path.display()))?;
        md.push_str(&holders_section(dir, &h)?);
    }
    let out = dir.join("report.md");
    std::fs::write(&out, md)?;
    Ok(out)
}

/// The files of `dir` whose names end with `suffix`, by name.
fn files_ending(dir: &Path, suffix: &str) -> anyhow::Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with(suffix)))
        .collect();
    found.sort();
    Ok(found)
}

/// A chaos run's stream slots per pod over time, the faults marked, and the slots left free.
fn holders_section(dir: &Path, h: &HolderSeries) -> anyhow::Result<String> {
    let svg = format!("chaos-{}-holders.svg", h.scenario);
    let mut bands = h.pods.clone();
    bands.push(("free".into(), h.free.clone()));
    let title = format!("chaos {}: stream slots held per pod ({} slots)", h.scenario, h.slots);
    plot_bands(&dir.join(&svg), &title, &h.t_s, &bands, &h.faults)?;
    let faults: Vec<String> = h.faults.iter().map(|(t, pod)| format!("{pod} at {t:.1} s")).collect();
    Ok(format!(
        "\n## chaos {} — slots held per pod through the faults\n\n![stream slots held per pod]({svg})\n\nFaults: {}.\n",
        h.scenario,
        faults.join(", ")
    ))
}

/// One run's figures beside its bounds, as a Markdown section.
fn figures(run: &Value) -> String {
    let f = |k: &str| run[k].as_f64().map_or("–".into(), |v| format!("{v}"));
    if run.get("commit_floor_msgs_per_s").is_some() {
        format!(
            "\n## bench inbound\n\n| figure | value | bound (same run) | ratio |\n|---|---:|---:|---:|\n\
             | msgs_per_s | {} | serial bound {} · commit floor {} · protocol {} | {} |\n\
             | overhead p50 / p99 ms | {} / {} | GET mean {} ms | |\n| lost, rejected_429 | {}, {} | 0, 0 | |\n",
            f("msgs_per_s"),
            f("serial_bound_msgs_per_s"),
            f("commit_floor_msgs_per_s"),
            f("protocol_bound_msgs_per_s"),
            f("bound_ratio"),
            f("overhead_p50_ms"),
            f("overhead_p99_ms"),
            f("get_mean_ms"),
            f("lost"),
            f("rejected_429")
        )
    } else if run.get("bucket_bound_msgs_per_s").is_some() {
        format!(
            "\n## bench outbound\n\n| figure | value | bound (same run) | ratio |\n|---|---:|---:|---:|\n\
             | msgs_per_s | {} | bucket {} · protocol {} | {} |\n\
             | sent p50 / p99 ms at {}/s | {} / {} | | |\n| sim_429, duplicates, lost | {}, {}, {} | 0, 0, 0 | |\n",
            f("msgs_per_s"),
            f("bucket_bound_msgs_per_s"),
            f("protocol_bound_msgs_per_s"),
            f("bound_ratio"),
            f("rate"),
            f("lat_sent_p50_ms"),
            f("lat_sent_p99_ms"),
            f("sim_429"),
            f("duplicates_at_sim"),
            f("lost")
        )
    } else if run.get("ping_p50_us").is_some() {
        format!(
            "\n## bench lease\n\n| figure | value | bound (same run) | ratio |\n|---|---:|---:|---:|\n\
             | acquire p50 µs | {} | Redis round trip {} µs | {} |\n| max concurrent / cap | {} / {} | | |\n",
            f("acquire_p50_us"),
            f("ping_p50_us"),
            f("ratio"),
            f("max_concurrent_observed"),
            f("cap")
        )
    } else if run.get("read_6_streams_msgs_per_s").is_some() {
        format!(
            "\n## bench sim\n\nThe simulator through the real ICOM client (the ceiling of the pipeline benches on this machine).\n\n\
             | figure | 1 | 6 |\n|---|---:|---:|\n| read msg/s (streams) | {} | {} |\n| send msg/s (clients) | {} | {} |\n",
            f("read_1_stream_msgs_per_s"),
            f("read_6_streams_msgs_per_s"),
            f("send_1_client_msgs_per_s"),
            f("send_6_clients_msgs_per_s")
        )
    } else if run["bench"] == "dict" {
        format!(
            "\n## bench dict\n\n| figure | value | bound (same run) |\n|---|---:|---:|\n\
             | lookups per s | {} | pace asked {} |\n| highest one-second count | {} | |\n\
             | p50 / p99 ms | {} / {} | |\n| distinct keys, cache hits, DICT 429s | {}, {}, {} | , 0, 0 |\n",
            f("lookups_per_s"),
            f("target_per_s"),
            f("max_in_one_second"),
            f("p50_ms"),
            f("p99_ms"),
            f("distinct_keys"),
            f("cache_hits"),
            f("sim_429")
        )
    } else if let Some(scenario) = run["scenario"].as_str() {
        format!(
            "\n## chaos {scenario}\n\nverdict {}, faults {}, lost {}, duplicate rows {}, over cap {}, outbound lost {}\n",
            if run["ok"] == true { "ok" } else { "FAILED" },
            f("faults"),
            f("lost"),
            f("duplicate_rows"),
            f("over_cap"),
            f("outbound_lost")
        )
    } else {
        format!("\n## other\n\n`{run}`\n")
    }
}

const COLOURS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(188, 189, 34),
];
const GREY: RGBColor = RGBColor(120, 120, 120);

/// Stacked bands over the series' seconds (each band's height is its value; the last one
/// grey), `marks` as vertical lines: who holds the slots, and when a fault struck.
fn plot_bands(
    path: &Path,
    title: &str,
    t_s: &[f64],
    bands: &[(String, Vec<f64>)],
    marks: &[(f64, String)],
) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    let x_max = t_s.last().copied().unwrap_or(1.0).max(1.0);
    let at = |v: &[f64], i: usize| v.get(i).copied().unwrap_or(0.0);
    let total: Vec<f64> = (0..t_s.len()).map(|i| bands.iter().map(|(_, v)| at(v, i)).sum()).collect();
    let y_max = total.iter().copied().fold(1.0, f64::max) * 1.15;
    let axes = ("seconds since the traffic started", "slots");
    let mut chart = chart(&root, title, (0.0..x_max, 0.0..y_max), axes)?;
    let mut below = vec![0.0; t_s.len()];
    for (i, (name, values)) in bands.iter().enumerate() {
        let colour = if i + 1 == bands.len() { GREY } else { COLOURS[i % COLOURS.len()] };
        let above: Vec<f64> = below.iter().enumerate().map(|(i, b)| b + at(values, i)).collect();
        // Steps: a sample's value holds until the next sample.
        let mut outline: Vec<(f64, f64)> = Vec::new();
        for (k, t) in t_s.iter().enumerate() {
            let next = t_s.get(k + 1).copied().unwrap_or(x_max);
            outline.extend([(*t, above[k]), (next, above[k])]);
        }
        for k in (0..t_s.len()).rev() {
            let next = t_s.get(k + 1).copied().unwrap_or(x_max);
            outline.extend([(next, below[k]), (t_s[k], below[k])]);
        }
        chart
            .draw_series([Polygon::new(outline, colour.mix(0.6).filled())])
            .map_err(plot_error)?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], colour.mix(0.6).filled()));
        below = above;
    }
    draw_marks(&mut chart, marks, y_max)?;
    chart.configure_series_labels().background_style(WHITE).border_style(BLACK).draw().map_err(plot_error)?;
    root.present().map_err(plot_error)
}

/// Vertical lines at `marks` (seconds, label).
fn draw_marks<DB: DrawingBackend>(
    chart: &mut ChartContext<
        '_,
        DB,
        Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
    marks: &[(f64, String)],
    y_max: f64,
) -> anyhow::Result<()> {
    for (t, label) in marks {
        chart.draw_series(LineSeries::new([(*t, 0.0), (*t, y_max)], BLACK.stroke_width(2))).map_err(plot_error)?;
        let text =
            Text::new(format!("fault: {label}"), (*t, y_max * 0.98), ("sans-serif", 13).into_font().color(&BLACK));
        chart.draw_series([text]).map_err(plot_error)?;
    }
    Ok(())
}

/// Named lines over the series' seconds.
fn plot_lines(path: &Path, title: &str, unit: &str, t_s: &[f64], lines: &[(String, Vec<f64>)]) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    let x_max = t_s.last().copied().unwrap_or(1.0).max(1.0);
    let y_max = lines.iter().flat_map(|(_, v)| v.iter().copied()).fold(1.0, f64::max) * 1.1;
    let mut chart = chart(&root, title, (0.0..x_max, 0.0..y_max), ("seconds since the first message", unit))?;
    for (i, (name, values)) in lines.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(t_s.iter().copied().zip(values.iter().copied()), colour.stroke_width(2)))
            .map_err(plot_error)?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2)));
    }
    chart.configure_series_labels().background_style(WHITE).border_style(BLACK).draw().map_err(plot_error)?;
    root.present().map_err(plot_error)
}

fn plot_cdf(path: &Path, s: &Series) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    let x_max = s.cdf_ms.iter().copied().fold(1.0, f64::max) * 1.05;
    let title = format!("{}: {} (CDF)", s.bench, s.cdf_of);
    let mut chart = chart(&root, &title, (0.0..x_max, 0.0..1.0), ("ms", "fraction of messages"))?;
    let points = s.cdf_ms.iter().copied().zip(s.cdf_quantiles.iter().copied());
    chart.draw_series(LineSeries::new(points, COLOURS[0].stroke_width(2))).map_err(plot_error)?;
    root.present().map_err(plot_error)
}

type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A white 900×420 SVG with its caption, axes over `x` × `y` and their descriptions.
fn chart<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    title: &str,
    (x, y): (std::ops::Range<f64>, std::ops::Range<f64>),
    (x_desc, y_desc): (&str, &str),
) -> anyhow::Result<Chart<'a, 'b>> {
    root.fill(&WHITE).map_err(plot_error)?;
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(x, y)
        .map_err(plot_error)?;
    chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).draw().map_err(plot_error)?;
    Ok(chart)
}

fn plot_error<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow::anyhow!("drawing a plot: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_puts_each_figure_beside_its_bound_and_draws_the_series() {
        let dir = tempfile::tempdir().unwrap();
        let lines = [
            r#"{"msgs_per_s":3894.1,"commit_floor_msgs_per_s":8151.6,"serial_bound_msgs_per_s":4950.2,"protocol_bound_msgs_per_s":10947.4,"bound_ratio":0.787,"overhead_p50_ms":1.5,"overhead_p99_ms":7.5,"get_mean_ms":3.65,"lost":0,"rejected_429":0}"#,
            r#"{"msgs_per_s":1136.3,"bucket_bound_msgs_per_s":1200.0,"protocol_bound_msgs_per_s":3951.8,"bound_ratio":0.947,"rate":750.0,"lat_sent_p50_ms":30.5,"lat_sent_p99_ms":69.8,"sim_429":0,"duplicates_at_sim":0,"lost":0}"#,
            r#"{"read_1_stream_msgs_per_s":35390.0,"read_6_streams_msgs_per_s":53779.0,"send_1_client_msgs_per_s":34755.0,"send_6_clients_msgs_per_s":67590.0}"#,
            r#"{"scenario":"kill","ok":true,"faults":4,"lost":0,"duplicate_rows":0,"over_cap":0,"outbound_lost":0}"#,
            r#"{"bench":"dict","distinct_keys":20000,"target_per_s":33.3,"lookups_per_s":33.2,"max_in_one_second":34,"p50_ms":2.1,"p99_ms":5.0,"cache_hits":0,"sim_429":0}"#,
        ];
        std::fs::write(dir.path().join("benches.jsonl"), lines.join("\n")).unwrap();
        let series = Series {
            bench: "inbound".into(),
            t_s: vec![0.0, 0.25, 0.5],
            rates: vec![
                ("persisted".into(), vec![4000.0, 3900.0, 100.0]),
                ("published".into(), vec![3800.0, 4000.0, 200.0]),
            ],
            cdf_of: "persisted_to_published".into(),
            cdf_quantiles: vec![0.5, 0.99],
            cdf_ms: vec![2.0, 9.0],
            states: Vec::new(),
        };
        super::super::series::write(&dir.path().join("inbound-series.json"), &series).unwrap();
        let mut holders = HolderSeries::new("kill", 2);
        holders.record(0.0, &[(1, "x-p1".into()), (2, "x-p2".into())].into());
        holders.fault(0.2, "x-p1");
        holders.record(0.25, &[(2, "x-p2".into())].into());
        holders.record(0.5, &[(1, "x-p3".into()), (2, "x-p2".into())].into());
        std::fs::write(dir.path().join("chaos-kill-holders.json"), serde_json::to_vec(&holders).unwrap()).unwrap();
        let md = std::fs::read_to_string(render(dir.path()).unwrap()).unwrap();
        assert!(md.contains("![stream slots held per pod](chaos-kill-holders.svg)\n\nFaults: p1 at 0.2 s."), "{md}");
        let svg = std::fs::read_to_string(dir.path().join("chaos-kill-holders.svg")).unwrap();
        assert!(svg.contains("fault: p1") && svg.contains("p3") && svg.contains("free"), "{svg}");
        assert!(
            md.contains(
                "| msgs_per_s | 3894.1 | serial bound 4950.2 · commit floor 8151.6 · protocol 10947.4 | 0.787 |"
            ),
            "{md}"
        );
        assert!(md.contains("| msgs_per_s | 1136.3 | bucket 1200 · protocol 3951.8 | 0.947 |"), "{md}");
        assert!(md.contains("## chaos kill\n\nverdict ok"), "{md}");
        assert!(md.contains("| lookups per s | 33.2 | pace asked 33.3 |"), "{md}");
        assert!(md.contains("| read msg/s (streams) | 35390 | 53779 |") && !md.contains("## other"), "{md}");
        assert!(md.contains("![inbound messages per second](inbound-throughput.svg)"), "{md}");
        let svg = std::fs::read_to_string(dir.path().join("inbound-throughput.svg")).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("<polyline") && svg.contains("persisted"), "{svg}");
        assert!(std::fs::read_to_string(dir.path().join("inbound-latency-cdf.svg")).unwrap().contains("<polyline"));
    }
}
