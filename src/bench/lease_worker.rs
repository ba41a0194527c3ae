//! One worker process of `cabine bench lease`: T tasks loop acquire (one pool)
//! → judged requests while the lease can outlive them → release, plus a task
//! measuring Redis PING through the same client; prints one JSON report line.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use cabine_actors::domain::ChannelId;
use cabine_actors::ports::{Acquired, Lease, LeaseStore, Pool};
use fred::prelude::ClientLike;
use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::judge::{JudgeClient, Sent};
use super::latency::Latency;
use crate::cli::LeaseWorkerArgs;
use crate::config::Settings;
use crate::redis::{KeyLayout, LeaseConfig, RedisLeaseStore};

/// The pool every worker contends for.
pub const BENCH_POOL: Pool = Pool::Stream(ChannelId::Cpm);
/// The Redis cluster segment of bench keys (the prefix is unique per run).
pub const BENCH_CLUSTER: &str = "bench";

/// What one worker reports to the parent (histograms as `[µs, count]` pairs).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct WorkerReport {
    pub grants: u64,
    pub refusals: u64,
    pub quarantine_refusals: u64,
    pub errors: u64,
    pub requests: u64,
    /// Leases found already expired when about to send (the worker had been paused): nothing sent.
    pub expired_before_send: u64,
    pub acquire_us: Vec<(u64, u64)>,
    pub release_us: Vec<(u64, u64)>,
    pub ping_us: Vec<(u64, u64)>,
}

#[derive(Default)]
struct TaskStats {
    grants: u64,
    refusals: u64,
    quarantine_refusals: u64,
    errors: u64,
    requests: u64,
    expired_before_send: u64,
    acquire: Latency,
    release: Latency,
}

/// The lease configuration of a bench run.
pub fn lease_config(args: &LeaseWorkerArgs, settings: &Settings, pod_id: &str) -> LeaseConfig {
    LeaseConfig {
        keys: KeyLayout::new(&args.prefix, BENCH_CLUSTER, settings.cluster.ispb.as_str()),
        pod_id: pod_id.to_owned(),
        stream_slots: args.cap,
        send_slots: 1,
        lease: Duration::from_millis(args.lease_ms),
        lock_delay: Duration::from_millis(args.lock_delay_ms),
        drift_margin: Duration::from_millis(args.drift_ms),
        command_timeout: settings.redis.command_timeout,
    }
}

/// A connected client for `url` with the configured timeouts.
pub async fn connect(url: &str, settings: &Settings) -> anyhow::Result<fred::prelude::Client> {
    let redis_settings = crate::config::RedisSettings { url: url.to_owned(), ..settings.redis.clone() };
    let client = crate::redis::connect(&redis_settings).context("redis client")?;
    tokio::time::timeout(Duration::from_secs(5), client.wait_for_connect())
        .await
        .context("redis did not accept a connection within 5 s")?
        .context("connecting to redis")?;
    Ok(client)
}

/// `cabine bench lease-worker`: runs, then prints its report as one JSON line.
pub async fn run(args: LeaseWorkerArgs, settings: &Settings) -> anyhow::Result<()> {
    let client = connect(&args.redis_url, settings).await?;
    let pod_id = format!("bench-{}", std::process::id());
    let store = Arc::new(RedisLeaseStore::new(client.clone(), lease_config(&args, settings, &pod_id)));
    store.load_scripts().await.context("loading the lease scripts")?;
    let until = Instant::now() + Duration::from_millis(args.run_ms);
    let tag = format!("w{}", std::process::id());
    let tasks: Vec<_> =
        (0..args.tasks).map(|_| tokio::spawn(task_loop(store.clone(), args.clone(), tag.clone(), until))).collect();
    let ping = tokio::spawn(ping_loop(client, until));
    let mut report = WorkerReport::default();
    let (mut acquire, mut release) = (Latency::default(), Latency::default());
    for task in tasks {
        let s = task.await.context("bench task panicked")?;
        report.grants += s.grants;
        report.refusals += s.refusals;
        report.quarantine_refusals += s.quarantine_refusals;
        report.errors += s.errors;
        report.requests += s.requests;
        report.expired_before_send += s.expired_before_send;
        acquire.add(&s.acquire);
        release.add(&s.release);
    }
    report.acquire_us = acquire.to_pairs();
    report.release_us = release.to_pairs();
    report.ping_us = ping.await.context("ping task panicked")?.to_pairs();
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

async fn task_loop(store: Arc<RedisLeaseStore>, args: LeaseWorkerArgs, tag: String, until: Instant) -> TaskStats {
    let mut stats = TaskStats::default();
    let mut judge = JudgeClient::new(args.judge, &tag);
    while Instant::now() < until {
        let started = Instant::now();
        let acquired = store.acquire(BENCH_POOL, None).await;
        stats.acquire.record(started.elapsed());
        match acquired {
            Ok(Acquired::Granted(lease)) => {
                stats.grants += 1;
                use_lease(&mut judge, &lease, &args, &mut stats).await;
                let started = Instant::now();
                let released = store.release(&lease).await;
                stats.release.record(started.elapsed());
                stats.errors += u64::from(released.is_err());
            }
            Ok(Acquired::Full) => {
                stats.refusals += 1;
                let backoff = Duration::from_millis(rand::rng().random_range(5..=20));
                tokio::time::sleep(backoff).await;
            }
            Ok(Acquired::Quarantined { remaining }) => {
                stats.quarantine_refusals += 1;
                tokio::time::sleep(remaining.min(Duration::from_millis(100))).await;
            }
            Err(_) => {
                stats.errors += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    stats
}

/// Judged requests, each held 1–50 ms, while the lease outlives the request timeout.
async fn use_lease(judge: &mut JudgeClient, lease: &Lease, args: &LeaseWorkerArgs, stats: &mut TaskStats) {
    let timeout = Duration::from_millis(args.request_timeout_ms);
    loop {
        let hold = Duration::from_millis(rand::rng().random_range(1..=50));
        match judge.request(lease, hold, timeout).await {
            Ok(Sent::Answered) => stats.requests += 1,
            Ok(Sent::NotSent { expired }) => {
                stats.expired_before_send += u64::from(expired);
                return;
            }
            Err(_) => {
                // The connection is dropped; the lease is still checked before the next request.
                stats.errors += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

async fn ping_loop(client: fred::prelude::Client, until: Instant) -> Latency {
    let mut pings = Latency::default();
    while Instant::now() < until {
        let started = Instant::now();
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), client.ping::<String>(None)).await {
            pings.record(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    pings
}
