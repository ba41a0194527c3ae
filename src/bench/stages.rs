//! Per-stage timings of `bench inbound` and `bench outbound`, from the pods' own histograms: each
//! pod's `/metrics` is scraped before and after a run, the bucket counts of the
//! stage histograms are summed over pods and subtracted, and p50 / p99 are read
//! off the buckets (as upper bounds); means come from `_sum` / `_count`. Printed
//! on stderr beside the JSON line, to say what bounds the pipeline.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::harness::Pod;

/// The histograms of the inbound path, in pipeline order.
pub const INBOUND: &[&str] = &[
    "cabine_icom_request_seconds",
    "cabine_inbox_commit_seconds",
    "cabine_slot_poll_seconds",
    "cabine_slot_get_seconds",
    "cabine_slot_cycle_overhead_seconds",
    "cabine_inbound_publication_lag_seconds",
    "cabine_redis_round_trip_seconds",
];

/// The histograms of the outbound path: intake (pull, store), a sender's turn step by step, the
/// POSTs, the lease calls.
pub const OUTBOUND: &[&str] = &[
    "cabine_outbound_intake_step_seconds",
    "cabine_outbound_turn_step_seconds",
    "cabine_outbound_send_seconds",
    "cabine_redis_round_trip_seconds",
];

/// Series (name and labels without `le`) → cumulative count per bucket bound; and per
/// histogram name, its `_sum` and `_count` summed over series and pods.
#[derive(Default)]
pub struct Scrape(BTreeMap<String, BTreeMap<u64, f64>>, BTreeMap<String, (f64, f64)>);

/// Sums every pod's histograms named in `stages`.
pub async fn scrape(pods: &[Pod], stages: &[&str]) -> Scrape {
    let mut total = Scrape::default();
    for pod in pods {
        let Ok(r) = reqwest::get(format!("http://{}/metrics", pod.http)).await else { continue };
        let Ok(text) = r.text().await else { continue };
        for line in text.lines() {
            if let Some((key, le, count)) = bucket_line(line, stages) {
                *total.0.entry(key).or_default().entry(le).or_default() += count;
            } else if let Some((name, sum, count)) = total_line(line, stages) {
                let t = total.1.entry(name).or_default();
                (t.0, t.1) = (t.0 + sum, t.1 + count);
            }
        }
    }
    total
}

/// `name_bucket{a="x",le="0.005"} 12` → (`name{a="x"}`, 5000 µs, 12).
fn bucket_line(line: &str, stages: &[&str]) -> Option<(String, u64, f64)> {
    let (series, count) = line.rsplit_once(' ')?;
    let name = stages.iter().find(|s| series.starts_with(&format!("{s}_bucket{{")))?;
    let labels = series.strip_prefix(&format!("{name}_bucket{{"))?.strip_suffix('}')?;
    let mut kept = Vec::new();
    let mut le = None;
    for label in labels.split(',') {
        match label.strip_prefix("le=\"").and_then(|v| v.strip_suffix('"')) {
            Some(v) => le = Some(v),
            None => kept.push(label),
        }
    }
    let le = match le? {
        "+Inf" => u64::MAX,
        v => (v.parse::<f64>().ok()? * 1e6) as u64,
    };
    Some((format!("{name}{{{}}}", kept.join(",")), le, count.parse().ok()?))
}

/// `name_sum{…} 1.5` → (name, 1.5, 0); `name_count{…} 3` → (name, 0, 3).
fn total_line(line: &str, stages: &[&str]) -> Option<(String, f64, f64)> {
    let (series, value) = line.rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    let name =
        stages.iter().find(|s| series.starts_with(&format!("{s}_sum")) || series.starts_with(&format!("{s}_count")))?;
    let rest = &series[name.len()..];
    let is = |suffix: &str| rest == suffix || rest.starts_with(&format!("{suffix}{{"));
    match () {
        () if is("_sum") => Some(((*name).to_owned(), value, 0.0)),
        () if is("_count") => Some(((*name).to_owned(), 0.0, value)),
        () => None,
    }
}

/// The mean of histogram `name` (all series, all pods) between `before` and `after`, in ms.
pub fn mean_ms(before: &Scrape, after: &Scrape, name: &str) -> Option<f64> {
    let (s1, c1) = after.1.get(name).copied()?;
    let (s0, c0) = before.1.get(name).copied().unwrap_or_default();
    let count = c1 - c0;
    (count >= 1.0).then(|| (s1 - s0) / count * 1000.0)
}

/// `{series: {count, p50_ms, p99_ms}}` of what happened between `before` and `after`.
pub fn between(before: &Scrape, after: &Scrape) -> Value {
    let mut out = serde_json::Map::new();
    for (key, buckets) in &after.0 {
        let old = before.0.get(key);
        let diff: Vec<(u64, f64)> =
            buckets.iter().map(|(le, n)| (*le, n - old.and_then(|o| o.get(le)).copied().unwrap_or(0.0))).collect();
        let count = diff.last().map_or(0.0, |(_, n)| *n);
        if count < 1.0 {
            continue;
        }
        let at = |q: f64| {
            let rank = q * count;
            diff.iter()
                .find(|(_, n)| *n >= rank)
                .map(|(le, _)| if *le == u64::MAX { -1.0 } else { *le as f64 / 1000.0 })
        };
        out.insert(key.clone(), json!({ "count": count, "p50_le_ms": at(0.5), "p99_le_ms": at(0.99) }));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_parsed_and_subtracted() {
        let line = r#"cabine_inbox_commit_seconds_bucket{le="0.005"} 12"#;
        assert_eq!(bucket_line(line, INBOUND), Some(("cabine_inbox_commit_seconds{}".into(), 5000, 12.0)));
        let line = r#"cabine_slot_poll_seconds_bucket{channel="cpm",le="+Inf"} 3"#;
        assert_eq!(
            bucket_line(line, INBOUND),
            Some(("cabine_slot_poll_seconds{channel=\"cpm\"}".into(), u64::MAX, 3.0))
        );
        assert_eq!(bucket_line("cabine_slot_polls_total{channel=\"cpm\"} 3", INBOUND), None);
        let mut before = Scrape::default();
        before.0.insert("s{}".into(), [(1000, 10.0), (5000, 10.0), (u64::MAX, 10.0)].into());
        let mut after = Scrape::default();
        after.0.insert("s{}".into(), [(1000, 60.0), (5000, 109.0), (u64::MAX, 110.0)].into());
        let v = between(&before, &after);
        assert_eq!(v["s{}"]["count"], 100.0);
        assert_eq!(v["s{}"]["p50_le_ms"], 1.0);
        assert_eq!(v["s{}"]["p99_le_ms"], 5.0);
        let stages = &["cabine_outbound_send_seconds"];
        let sum = r#"cabine_outbound_send_seconds_sum{channel="cpm"} 0.5"#;
        assert_eq!(total_line(sum, stages), Some(("cabine_outbound_send_seconds".into(), 0.5, 0.0)));
        let count = r#"cabine_outbound_send_seconds_count{channel="cpm"} 100"#;
        assert_eq!(total_line(count, stages), Some(("cabine_outbound_send_seconds".into(), 0.0, 100.0)));
        after.1.insert("h".into(), (0.6, 110.0));
        before.1.insert("h".into(), (0.1, 10.0));
        assert_eq!(mean_ms(&before, &after, "h"), Some(5.0));
    }
}
