//! `cabine bench inbound`: the inbound pipeline end to end on one machine. A
//! child simulator and P child pods (own schema, key prefix, subjects) run
//! while this process reads the JetStream stream independently. M messages are
//! injected at once (throughput: injection start → last one consumed), then M
//! at R/s, each inject call's send time recorded per ResourceId (latency:
//! inject → consumed). One JSON line, with the simulator's audit and the
//! inbox's counts over both runs.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;
use serde_json::json;
use tokio::time::Instant;

use super::latency::Latency;
use crate::cli::InboundBenchArgs;
use crate::harness::{BusReader, ClusterSpec, LocalCluster, cluster};

/// The JSON line.
#[derive(Debug, Serialize)]
pub struct InboundReport {
    pub pods: usize,
    pub messages: usize,
    pub rate: f64,
    /// Fast run: M / (injection start → last message consumed).
    pub msgs_per_s: f64,
    /// Fixed-rate run: inject → consumed.
    pub lat_p50_ms: f64,
    pub lat_p99_ms: f64,
    pub lat_max_ms: f64,
    pub injected: u64,
    pub persisted: i64,
    pub published: i64,
    pub consumed_unique: usize,
    pub lost: usize,
    pub duplicate_rows: i64,
    pub max_open_streams: u64,
    pub max_in_flight: u64,
    pub rejected_429: u64,
    /// Fast run: mean GET of a delivering cycle (`cabine_slot_get_seconds`).
    pub get_mean_ms: f64,
    /// Stream slots × 10 / `get_mean_ms`: what the protocol allows, one GET at a time per stream.
    pub protocol_bound_msgs_per_s: f64,
    /// Concurrent 10-message commits, one writer per stream slot, same statement and table (`floor.rs`).
    pub commit_floor_msgs_per_s: f64,
    /// The floor's mean 10-message commit.
    pub commit_mean_ms: f64,
    /// Stream slots × 10 / (`get_mean_ms` + `commit_mean_ms`): a stream's next GET
    /// acknowledges its batch, so it waits for the commit (DESIGN §2.2).
    pub serial_bound_msgs_per_s: f64,
    /// `msgs_per_s` over the tightest of the three bounds.
    pub bound_ratio: f64,
    /// Fixed-rate run: a delivering cycle minus its GET (bucket upper bounds).
    pub overhead_p50_ms: f64,
    pub overhead_p99_ms: f64,
    pub rss_mb_max: f64,
}

/// What the stage histograms say of a run, for the bound fields.
#[derive(Debug, Default)]
struct Bounds {
    get_mean_ms: f64,
    overhead_p50_ms: f64,
    overhead_p99_ms: f64,
}

/// Timings of the bench's pods (also `bench outbound`'s): a lease of 4 s, so that a fresh
/// cluster waits lease + lock_delay = 6 s once instead of 20 s; the request bounds,
/// heartbeat and lock delay shrink with it to keep the boot invariants.
pub(super) fn bench_env() -> Vec<(String, String)> {
    cluster::pairs(&[
        ("CABINE__TIMING__LEASE", "4s"),
        ("CABINE__TIMING__HEARTBEAT", "1s"),
        ("CABINE__TIMING__DRIFT_MARGIN", "200ms"),
        ("CABINE__TIMING__LONG_POLL_TIMEOUT", "2s"),
        ("CABINE__ICOM__SERVER_HOLD", "1s"),
        ("CABINE__TIMING__SEND_TIMEOUT", "2s"),
        ("CABINE__TIMING__LOCK_DELAY", "2s"),
        ("CABINE__TIMING__ACQUIRE_INTERVAL", "250ms"),
        ("CABINE__TIMING__DRAIN_TIME", "1s"),
        ("CABINE__TIMING__STOP_TIMEOUT", "3s"),
        ("CABINE__TIMING__REPUBLISH_AFTER", "5s"),
        ("CABINE__TIMING__SWEEP_INTERVAL", "1s"),
        ("CABINE__LOG__FILTER", "warn"),
    ])
}

pub async fn run(args: &InboundBenchArgs, exe: &Path) -> anyhow::Result<InboundReport> {
    if args.messages == 0 || args.messages > crate::sim::MAX_INJECT || !args.rate.is_finite() || args.rate <= 0.0 {
        bail!("--messages must be within 1..={} and --rate > 0", crate::sim::MAX_INJECT);
    }
    crate::install_crypto_provider();
    let sim_args = ["--hold", "1s", "--seed", "1"].map(str::to_owned).to_vec();
    let spec = ClusterSpec { tag: "bench_inbound".into(), pods: args.pods.max(1), env: bench_env(), sim_args };
    let c = LocalCluster::start(exe, spec).await.context("starting the local cluster")?;
    let outcome = match measure(&c, args).await {
        Ok(report) => with_floor(&c, report).await,
        Err(e) => Err(e),
    };
    let outcome = match (outcome, &args.series) {
        (Ok(report), Some(path)) => {
            super::series::inbound(&c.postgres).await.and_then(|s| super::series::write(path, &s)).map(|()| report)
        }
        (outcome, _) => outcome,
    };
    c.cleanup().await;
    outcome
}

/// Measures the commit floor once the runs are over, and the ratio to the tighter bound.
async fn with_floor(c: &LocalCluster, mut r: InboundReport) -> anyhow::Result<InboundReport> {
    let conn = c.postgres.get().await?;
    let raw: Vec<u8> = conn.query_one("SELECT raw FROM inbox WHERE status = 'received' LIMIT 1", &[]).await?.get(0);
    drop(conn);
    let streams = c.settings.pools.stream.get();
    let floor = super::floor::commit_floor(&c.postgres, streams, raw.into()).await?;
    r.commit_floor_msgs_per_s = round1(floor.msgs_per_s);
    r.commit_mean_ms = (floor.commit_mean_ms * 100.0).round() / 100.0;
    r.serial_bound_msgs_per_s = round1(protocol_bound(streams, r.get_mean_ms + floor.commit_mean_ms));
    let tighter = r.protocol_bound_msgs_per_s.min(floor.msgs_per_s).min(r.serial_bound_msgs_per_s);
    r.bound_ratio = if tighter > 0.0 { (r.msgs_per_s / tighter * 1000.0).round() / 1000.0 } else { 0.0 };
    Ok(r)
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

async fn measure(c: &LocalCluster, args: &InboundBenchArgs) -> anyhow::Result<InboundReport> {
    wait_all_held(c).await?;
    let reader = BusReader::start(c.nats.clone(), &c.settings.nats.inbound_stream, &c.inbound_filter())
        .await
        .map_err(anyhow::Error::msg)?;
    let m = args.messages;
    let budget = Duration::from_secs(60) + Duration::from_secs_f64(m as f64 / 500.0);

    let started = Instant::now();
    let fast = c.sim.control.inject(m, "pacs008").await?;
    let injected = started.elapsed();
    let key = |id: &str| format!("99999010:cpm:{id}");
    wait_consumed(&reader, m, budget).await;
    let (first, last) = reader.with(|a| {
        let at: Vec<Instant> = fast.iter().filter_map(|id| a.first.get(&key(id)).copied()).collect();
        (at.iter().min().copied(), at.iter().max().copied())
    });
    let took = last.context("nothing consumed")?.saturating_duration_since(started);
    let since = |t: Option<Instant>| t.map_or(-1.0, |t| t.saturating_duration_since(started).as_secs_f64() * 1e3);
    eprintln!(
        "fast run: inject answered after {:.1} ms, first on the bus after {:.1} ms, last after {:.1} ms",
        injected.as_secs_f64() * 1e3,
        since(first),
        since(last)
    );
    let msgs_per_s = m as f64 / took.as_secs_f64().max(1e-9);

    let fast_stages = super::stages::scrape(&c.pods, super::stages::INBOUND).await;
    let sent_at = inject_at_rate(c, m, args.rate).await?;
    wait_consumed(&reader, 2 * m, budget + Duration::from_secs_f64(m as f64 / args.rate)).await;
    let rate_stages = super::stages::scrape(&c.pods, super::stages::INBOUND).await;
    let profile = json!({
        "fast_run": super::stages::between(&super::stages::Scrape::default(), &fast_stages),
        "rate_run": super::stages::between(&fast_stages, &rate_stages),
    });
    eprintln!("stages {profile}");
    let overhead = |q: &str| {
        profile["rate_run"]["cabine_slot_cycle_overhead_seconds{channel=\"cpm\"}"][q].as_f64().unwrap_or(-1.0)
    };
    let bounds = Bounds {
        get_mean_ms: super::stages::mean_ms(&super::stages::Scrape::default(), &fast_stages, "cabine_slot_get_seconds")
            .unwrap_or(0.0),
        overhead_p50_ms: overhead("p50_le_ms"),
        overhead_p99_ms: overhead("p99_le_ms"),
    };
    let mut latency = Latency::default();
    reader.with(|a| {
        for (id, at) in &sent_at {
            if let Some(got) = a.first.get(&key(id)) {
                latency.record(got.saturating_duration_since(*at));
            }
        }
    });

    let all: Vec<String> = fast.into_iter().chain(sent_at.into_keys()).collect();
    report(c, args, &reader, &all, msgs_per_s, &latency, bounds).await
}

async fn report(
    c: &LocalCluster,
    args: &InboundBenchArgs,
    reader: &BusReader,
    all: &[String],
    msgs_per_s: f64,
    latency: &Latency,
    bounds: Bounds,
) -> anyhow::Result<InboundReport> {
    let deadline = Instant::now() + Duration::from_secs(15);
    while c.inbox_count("published_at IS NULL").await.unwrap_or(1) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lost = reader.with(|a| all.iter().filter(|id| !a.first.contains_key(&format!("99999010:cpm:{id}"))).count());
    let audit = c.sim.control.get("/sim/audit").await?;
    let lanes = audit["lanes"].as_array().cloned().unwrap_or_default();
    let peak = |k: &str| lanes.iter().filter_map(|l| l[k].as_u64()).max().unwrap_or(0);
    let sum = |k: &str| lanes.iter().filter_map(|l| l[k].as_u64()).sum::<u64>();
    let ms = |q: f64| latency.quantile_us(q) as f64 / 1000.0;
    Ok(InboundReport {
        pods: c.pods.len(),
        messages: args.messages,
        rate: args.rate,
        msgs_per_s: (msgs_per_s * 10.0).round() / 10.0,
        lat_p50_ms: ms(0.50),
        lat_p99_ms: ms(0.99),
        lat_max_ms: ms(1.0),
        injected: sum("injected"),
        persisted: c.inbox_count("true").await?,
        published: c.inbox_count("published_at IS NOT NULL").await?,
        consumed_unique: reader.unique(),
        lost,
        duplicate_rows: duplicate_rows(c).await?,
        max_open_streams: peak("max_open_streams"),
        max_in_flight: peak("max_in_flight"),
        rejected_429: sum("rejected_429"),
        get_mean_ms: (bounds.get_mean_ms * 100.0).round() / 100.0,
        protocol_bound_msgs_per_s: round1(protocol_bound(c.settings.pools.stream.get(), bounds.get_mean_ms)),
        commit_floor_msgs_per_s: 0.0,
        commit_mean_ms: 0.0,
        serial_bound_msgs_per_s: 0.0,
        bound_ratio: 0.0,
        overhead_p50_ms: bounds.overhead_p50_ms,
        overhead_p99_ms: bounds.overhead_p99_ms,
        rss_mb_max: c.pods.iter().filter_map(|p| p.child.id()).map(peak_rss_mb).fold(0.0, f64::max),
    })
}

/// Streams × 10 messages per cycle of `cycle_ms` (a GET, or a GET and its commit).
fn protocol_bound(streams: u8, cycle_ms: f64) -> f64 {
    if cycle_ms > 0.0 { f64::from(streams) * 10.0 * 1000.0 / cycle_ms } else { 0.0 }
}

/// Rows beyond one per message: a message stored twice under two keys shows here
/// (the unique key itself makes a second row per ResourceId impossible).
async fn duplicate_rows(c: &LocalCluster) -> anyhow::Result<i64> {
    let conn = c.postgres.get().await?;
    let sql = "SELECT count(*) - count(DISTINCT COALESCE(biz_msg_id, resource_id)) FROM inbox";
    Ok(conn.query_one(sql, &[]).await?.get(0))
}

/// Injects `m` messages at `rate` per second in 5 ms steps; ResourceId → time the inject call was sent.
async fn inject_at_rate(c: &LocalCluster, m: usize, rate: f64) -> anyhow::Result<HashMap<String, Instant>> {
    let mut sent_at = HashMap::with_capacity(m);
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while sent_at.len() < m {
        tick.tick().await;
        let due = ((started.elapsed().as_secs_f64() * rate) as usize).min(m);
        if due <= sent_at.len() {
            continue;
        }
        let at = Instant::now();
        for id in c.sim.control.inject(due - sent_at.len(), "pacs008").await? {
            sent_at.insert(id, at);
        }
    }
    Ok(sent_at)
}

/// Waits for `n` distinct messages on the bus; past `within` the run goes on
/// and the report shows what is missing (`lost`).
async fn wait_consumed(reader: &BusReader, n: usize, within: Duration) {
    let deadline = Instant::now() + within;
    while reader.unique() < n {
        if Instant::now() >= deadline {
            tracing::warn!(consumed = reader.unique(), expected = n, ?within, "not everything was consumed in time");
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until every stream slot is held (a fresh cluster waits out its quarantine first).
pub(super) async fn wait_all_held(c: &LocalCluster) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let slots = usize::from(c.settings.pools.stream.get());
    loop {
        let view = c.pod_json(0, "/cluster").await?;
        let held = view["holders"]
            .as_array()
            .and_then(|pools| pools.iter().find(|p| p["pool"] == "stream"))
            .and_then(|p| p["holders"].as_array().map(Vec::len))
            .unwrap_or(0);
        if held == slots {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("only {held} of {slots} stream slots held after 30 s: {view}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Peak resident set (VmHWM) of a process, in MiB; 0 when unreadable.
pub(super) fn peak_rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| (kb / 1024.0 * 10.0).round() / 10.0)
}
