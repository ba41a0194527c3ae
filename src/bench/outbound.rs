//! `cabine bench outbound`: the outbound pipeline end to end on one machine. A
//! child simulator (the Central Bank, its token bucket untouched) and P child
//! pods run while this process plays the bank's core: M pacs.008 published on
//! the outbound work-queue stream at once (throughput: first publish → last
//! row recorded sent), a pause for the bucket to refill, then M at R/s, each
//! publication time recorded per MsgId (latency: publish → the row's `sent_at`
//! and `confirmed_at`, the database's own times of those transitions). One
//! JSON line, with the simulator's audit and the outbound table's final states
//! over both runs. A cluster that does not settle within a bound fails the
//! bench instead of reporting.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use bytes::Bytes;
use cabine_actors::domain::ChannelId;
use serde::Serialize;
use serde_json::json;

use super::fates::{self, Fate};
use super::inbound::{bench_env, peak_rss_mb, wait_all_held};
use super::latency::Latency;
use super::stages;
use crate::cli::OutboundBenchArgs;
use crate::harness::outbound::{OutboundFeed, Request, msg_id_of, pacs008_bodies};
use crate::harness::{ClusterSpec, LocalCluster};

/// Most messages per run: both runs' MsgIds and EndToEndIds stay unique, and within the simulator's dedup memory.
pub const MAX_MESSAGES: usize = 500_000;

/// The JSON line.
#[derive(Debug, Serialize)]
pub struct OutboundReport {
    pub pods: usize,
    pub messages: usize,
    pub rate: f64,
    /// Fast run: M / (first publish → last row recorded sent).
    pub msgs_per_s: f64,
    /// What the Central Bank's bucket allows for M at once: M / ((M − capacity) / refill), ∞ as 0.
    pub bucket_bound_msgs_per_s: f64,
    /// Fast run: the mean POST time (the pods' `cabine_outbound_send_seconds`).
    pub post_mean_ms: f64,
    /// What the protocol allows: send slots × 10 messages / mean POST time.
    pub protocol_bound_msgs_per_s: f64,
    /// `msgs_per_s` / min(bucket bound, protocol bound): how close to the pace the protocol sets.
    pub bound_ratio: f64,
    /// Fixed-rate run: publish → row recorded `sent`.
    pub lat_sent_p50_ms: f64,
    pub lat_sent_p99_ms: f64,
    pub lat_sent_max_ms: f64,
    /// Fixed-rate run: publish → row recorded `confirmed` (the SPI's pacs.002 read back and applied).
    pub lat_confirmed_p50_ms: f64,
    pub lat_confirmed_p99_ms: f64,
    /// Both runs from here on.
    pub published: usize,
    /// Rows stored for the published MsgIds.
    pub accepted: usize,
    /// Rows that reached the SPI (`sent` or `confirmed`).
    pub sent: usize,
    pub confirmed: usize,
    pub dead: usize,
    pub timeout: usize,
    /// Published MsgIds without a row, or whose row did not end `sent` / `confirmed`.
    pub lost: usize,
    pub duplicates_at_sim: u64,
    pub sim_429: u64,
    pub sim_max_in_flight: u64,
    pub rss_mb_max: f64,
}

pub async fn run(args: &OutboundBenchArgs, exe: &Path) -> anyhow::Result<OutboundReport> {
    if args.messages == 0 || args.messages > MAX_MESSAGES || !args.rate.is_finite() || args.rate <= 0.0 {
        bail!("--messages must be within 1..={MAX_MESSAGES} and --rate > 0");
    }
    crate::install_crypto_provider();
    // The simulator's defaults (bucket 3750/750 per s, 6 in flight) with a 1 s hold under the pods' 2 s long poll.
    let sim_args = ["--hold", "1s", "--seed", "1"].map(str::to_owned).to_vec();
    let spec = ClusterSpec { tag: "bench_outbound".into(), pods: args.pods.max(1), env: bench_env(), sim_args };
    let c = LocalCluster::start(exe, spec).await.context("starting the local cluster")?;
    let outcome = match (measure(&c, args).await, &args.series) {
        (Ok(report), Some(path)) => {
            super::series::outbound(&c.postgres).await.and_then(|s| super::series::write(path, &s)).map(|()| report)
        }
        (outcome, _) => outcome,
    };
    c.cleanup().await;
    outcome
}

async fn measure(c: &LocalCluster, args: &OutboundBenchArgs) -> anyhow::Result<OutboundReport> {
    wait_all_held(c).await?;
    let m = args.messages;
    let feed = OutboundFeed::of(c);
    let mut fast = pacs008_bodies(&c.settings.cluster.ispb, 2 * m);
    let paced = fast.split_off(m);
    let fast_ids: Vec<String> = fast.iter().filter_map(|b| msg_id_of(b)).collect();
    let settle = Duration::from_secs(30) + Duration::from_secs_f64(m as f64 / 250.0);

    let before = stages::scrape(&c.pods, stages::OUTBOUND).await;
    let first = micros(SystemTime::now());
    feed.publish_all(&fast, Request::default()).await.map_err(anyhow::Error::msg)?;
    fates::wait_settled(c, m, false, settle).await.context("fast run")?;
    let rows = fates::read(c).await?;
    let last = fast_ids.iter().filter_map(|id| rows.get(id)?.sent_us).max().context("no message was sent")?;
    let took_s = (last - first) as f64 / 1e6;
    let after_fast = stages::scrape(&c.pods, stages::OUTBOUND).await;

    let refill = refill_time(c);
    eprintln!("fast run: {m} sent in {took_s:.2} s; waiting {refill:?} for the bucket to refill");
    tokio::time::sleep(refill).await;
    let published_at = publish_at_rate(&feed, &paced, args.rate).await?;
    let within = settle + Duration::from_secs_f64(m as f64 / args.rate);
    fates::wait_settled(c, 2 * m, false, within).await.context("fixed-rate run")?;
    let after_rate = stages::scrape(&c.pods, stages::OUTBOUND).await;
    fates::wait_settled(c, 2 * m, true, Duration::from_secs(60)).await.context("confirmations")?;
    let profile = json!({
        "fast_run": stages::between(&before, &after_fast),
        "rate_run": stages::between(&after_fast, &after_rate),
    });
    eprintln!("stages {profile}");
    let post_ms = stages::mean_ms(&before, &after_fast, "cabine_outbound_send_seconds").unwrap_or(0.0);

    let rows = fates::read(c).await?;
    let latencies = rate_latencies(&published_at, &rows);
    let ids: Vec<&str> = fast_ids.iter().map(String::as_str).chain(published_at.keys().map(String::as_str)).collect();
    let mut r = report(c, args, &ids, &rows, m as f64 / took_s.max(1e-6), &latencies).await?;
    bound(&mut r, c.settings.pools.send.get(), post_ms);
    Ok(r)
}

/// Fills the protocol bound (send slots × 10 per mean POST) and the ratio to the tighter bound.
fn bound(r: &mut OutboundReport, send_slots: u8, post_ms: f64) {
    r.post_mean_ms = round1(post_ms * 10.0) / 10.0;
    let protocol = if post_ms > 0.0 { f64::from(send_slots) * 10.0 * 1000.0 / post_ms } else { 0.0 };
    r.protocol_bound_msgs_per_s = round1(protocol);
    let tighter = [r.bucket_bound_msgs_per_s, protocol].into_iter().filter(|b| *b > 0.0).fold(f64::INFINITY, f64::min);
    r.bound_ratio = if tighter.is_finite() { (r.msgs_per_s / tighter * 1000.0).round() / 1000.0 } else { 0.0 };
}

async fn report(
    c: &LocalCluster,
    args: &OutboundBenchArgs,
    ids: &[&str],
    all: &HashMap<String, Fate>,
    msgs_per_s: f64,
    [sent, confirmed, legs @ ..]: &[Latency; 6],
) -> anyhow::Result<OutboundReport> {
    print_legs(legs);
    let audit = c.sim.control.audit("cpm").await?;
    let sim = |k: &str| audit[k].as_u64().unwrap_or(0);
    let causes = ["rejected_streams", "rejected_in_flight", "rejected_rate", "fault_429"].map(|k| (k, sim(k)));
    eprintln!("sim 429 causes {}", serde_json::json!(causes.into_iter().collect::<HashMap<_, _>>()));
    let mine: Vec<&Fate> = ids.iter().filter_map(|id| all.get(*id)).collect();
    let status = |s: &[&str]| mine.iter().filter(|f| s.contains(&f.status.as_str())).count();
    let ms = |l: &Latency, q: f64| l.quantile_us(q) as f64 / 1000.0;
    let bucket = c.settings.outbound.bucket.channels.get(&ChannelId::Cpm);
    let bound = bucket.map_or(0.0, |b| bucket_bound(args.messages, b.capacity as f64, b.refill_per_s as f64));
    Ok(OutboundReport {
        pods: c.pods.len(),
        messages: args.messages,
        rate: args.rate,
        msgs_per_s: round1(msgs_per_s),
        bucket_bound_msgs_per_s: round1(bound),
        post_mean_ms: 0.0,
        protocol_bound_msgs_per_s: 0.0,
        bound_ratio: 0.0,
        lat_sent_p50_ms: ms(sent, 0.50),
        lat_sent_p99_ms: ms(sent, 0.99),
        lat_sent_max_ms: ms(sent, 1.0),
        lat_confirmed_p50_ms: ms(confirmed, 0.50),
        lat_confirmed_p99_ms: ms(confirmed, 0.99),
        published: ids.len(),
        accepted: mine.len(),
        sent: status(&["sent", "confirmed"]),
        confirmed: status(&["confirmed"]),
        dead: status(&["dead"]),
        timeout: status(&["timeout"]),
        lost: ids.len() - status(&["sent", "confirmed"]),
        duplicates_at_sim: sim("duplicates_outbound"),
        sim_429: sim("rejected_429"),
        sim_max_in_flight: sim("max_in_flight_sends"),
        rss_mb_max: c.pods.iter().filter_map(|p| p.child.id()).map(peak_rss_mb).fold(0.0, f64::max),
    })
}

/// Per message of the fixed-rate run: publish → sent, publish → confirmed, then the legs
/// publish → stored, stored → sent, sent → report in the inbox, report → confirmed.
fn rate_latencies(published_at: &HashMap<String, i64>, all: &HashMap<String, Fate>) -> [Latency; 6] {
    let mut out: [Latency; 6] = Default::default();
    let span =
        |from: Option<i64>, to: Option<i64>| Some(Duration::from_micros(u64::try_from(to? - from?).unwrap_or(0)));
    for (id, at) in published_at {
        let Some(f) = all.get(id) else { continue };
        let (at, stored) = (Some(*at), Some(f.created_us));
        let spans = [
            span(at, f.sent_us),
            span(at, f.confirmed_us),
            span(at, stored),
            span(stored, f.sent_us),
            span(f.sent_us, f.report_us),
            span(f.report_us, f.confirmed_us),
        ];
        for (l, d) in out.iter_mut().zip(spans) {
            if let Some(d) = d {
                l.record(d);
            }
        }
    }
    out
}

/// The fixed-rate run's legs on stderr, to say where the time goes.
fn print_legs(legs: &[Latency]) {
    let names = ["publish_to_stored", "stored_to_sent", "sent_to_report_stored", "report_to_confirmed"];
    let ms = |l: &Latency, q: f64| l.quantile_us(q) as f64 / 1e3;
    let split: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .zip(legs)
        .map(|(n, l)| ((*n).to_owned(), json!({ "p50_ms": ms(l, 0.5), "p99_ms": ms(l, 0.99) })))
        .collect();
    eprintln!("rate run legs {}", serde_json::Value::Object(split));
}

/// Publishes `bodies` at `rate` per second in 5 ms steps; MsgId → µs since the epoch just before its publish.
async fn publish_at_rate(feed: &OutboundFeed, bodies: &[Bytes], rate: f64) -> anyhow::Result<HashMap<String, i64>> {
    let mut published_at = HashMap::with_capacity(bodies.len());
    let started = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut done = 0;
    while done < bodies.len() {
        tick.tick().await;
        let due = ((started.elapsed().as_secs_f64() * rate) as usize).min(bodies.len());
        let mut acks = Vec::with_capacity(due.saturating_sub(done));
        for body in &bodies[done..due] {
            let id = msg_id_of(body).context("a bench body without MsgId")?;
            published_at.insert(id, micros(SystemTime::now()));
            acks.push(feed.send(body.clone(), Request::default()).await.map_err(anyhow::Error::msg)?);
        }
        for ack in acks {
            ack.await.context("publishing an outbound request")?;
        }
        done = due.max(done);
    }
    Ok(published_at)
}

/// Time for the channel's bucket to refill from empty (capacity / refill), the longer of day and night.
fn refill_time(c: &LocalCluster) -> Duration {
    let Some(b) = c.settings.outbound.bucket.channels.get(&ChannelId::Cpm) else { return Duration::ZERO };
    let day = b.capacity as f64 / (b.refill_per_s as f64).max(1e-9);
    let night = b.night_capacity as f64 / (b.night_refill_per_s as f64).max(1e-9);
    Duration::from_secs_f64(day.max(night))
}

/// M messages at once through a full bucket: the first `capacity` at once, the rest at `refill` per second.
fn bucket_bound(m: usize, capacity: f64, refill: f64) -> f64 {
    let rest = m as f64 - capacity;
    if rest <= 0.0 || refill <= 0.0 { 0.0 } else { m as f64 / (rest / refill) }
}

fn micros(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_bound_counts_the_burst_then_the_refill() {
        assert_eq!(bucket_bound(10_000, 3750.0, 750.0), 1200.0);
        assert_eq!(bucket_bound(3750, 3750.0, 750.0), 0.0);
    }

    #[test]
    fn the_ratio_is_taken_against_the_tighter_bound() {
        let mut r = OutboundReport {
            pods: 3,
            messages: 10_000,
            rate: 500.0,
            msgs_per_s: 960.0,
            bucket_bound_msgs_per_s: 1200.0,
            post_mean_ms: 0.0,
            protocol_bound_msgs_per_s: 0.0,
            bound_ratio: 0.0,
            lat_sent_p50_ms: 0.0,
            lat_sent_p99_ms: 0.0,
            lat_sent_max_ms: 0.0,
            lat_confirmed_p50_ms: 0.0,
            lat_confirmed_p99_ms: 0.0,
            published: 0,
            accepted: 0,
            sent: 0,
            confirmed: 0,
            dead: 0,
            timeout: 0,
            lost: 0,
            duplicates_at_sim: 0,
            sim_429: 0,
            sim_max_in_flight: 0,
            rss_mb_max: 0.0,
        };
        bound(&mut r, 2, 5.0);
        assert_eq!((r.protocol_bound_msgs_per_s, r.bound_ratio), (4000.0, 0.8), "the bucket is tighter");
        bound(&mut r, 2, 40.0);
        assert_eq!((r.protocol_bound_msgs_per_s, r.bound_ratio), (500.0, 1.92), "the protocol is tighter");
    }
}
