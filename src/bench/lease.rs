//! `cabine bench lease`: P worker processes × T tasks contend for one pool of
//! leased slots, each holder making requests to a judge server that counts
//! concurrent requests on its side. Optional faults: SIGSTOP a worker for
//! 2 × lease (`--pause-holder`), restart a private Redis (`--restart-redis`).
//! Prints one JSON line; `ratio` compares acquire + release with a Redis PING
//! measured through the same clients in the same run.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use cabine_actors::ports::{Acquired, LeaseStore};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::Serialize;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::judge::Judge;
use super::latency::Latency;
use super::lease_worker::{self, BENCH_POOL, WorkerReport};
use crate::cli::{LeaseBenchArgs, LeaseWorkerArgs};
use crate::config::Settings;
use crate::harness::{self, RedisServer};
use crate::redis::RedisLeaseStore;

/// One run's plan. The CLI uses a pool of 6 and a 2 s lease so that pauses matter.
#[derive(Debug, Clone)]
pub struct LeaseBench {
    pub processes: u32,
    pub tasks: u32,
    pub run: Duration,
    pub pause_holder: bool,
    pub restart_redis: bool,
    pub cap: u8,
    pub lease: Duration,
    pub lock_delay: Duration,
    pub drift_margin: Duration,
    /// Client-side bound of a judged request (the judge holds 1–50 ms); ≤ lock_delay.
    pub request_timeout: Duration,
}

impl LeaseBench {
    pub fn from_args(a: &LeaseBenchArgs) -> LeaseBench {
        LeaseBench {
            processes: a.processes.max(1),
            tasks: a.tasks.max(1),
            run: Duration::from_secs(a.seconds.max(1)),
            pause_holder: a.pause_holder,
            restart_redis: a.restart_redis,
            cap: 6,
            lease: Duration::from_secs(2),
            lock_delay: Duration::from_millis(500),
            drift_margin: Duration::from_millis(100),
            request_timeout: Duration::from_millis(200),
        }
    }

    /// What each worker is told.
    pub fn worker_args(&self, redis_url: &str, prefix: &str, judge: std::net::SocketAddr) -> LeaseWorkerArgs {
        LeaseWorkerArgs {
            redis_url: redis_url.to_owned(),
            prefix: prefix.to_owned(),
            judge,
            tasks: self.tasks,
            run_ms: millis(self.run),
            cap: self.cap,
            lease_ms: millis(self.lease),
            lock_delay_ms: millis(self.lock_delay),
            drift_ms: millis(self.drift_margin),
            request_timeout_ms: millis(self.request_timeout),
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The JSON line.
#[derive(Debug, Serialize)]
pub struct LeaseReport {
    pub cap: u8,
    pub max_concurrent_observed: u64,
    pub grants: u64,
    pub refusals: u64,
    pub acquire_p50_us: u64,
    pub acquire_p99_us: u64,
    pub release_p50_us: u64,
    pub ping_p50_us: u64,
    pub ratio: f64,
    pub quarantine_refusals: u64,
    pub errors: u64,
    pub requests: u64,
    pub expired_before_send: u64,
    pub pauses: u64,
    pub redis_restarts: u64,
}

/// `{exe} bench lease-worker …` with stdout piped (its report) and stderr inherited.
pub fn worker_command(exe: &Path, a: &LeaseWorkerArgs) -> Command {
    let mut cmd = Command::new(exe);
    cmd.args(["bench", "lease-worker", "--redis-url", &a.redis_url, "--prefix", &a.prefix])
        .args(["--judge", &a.judge.to_string(), "--tasks", &a.tasks.to_string(), "--run-ms", &a.run_ms.to_string()])
        .args(["--cap", &a.cap.to_string(), "--lease-ms", &a.lease_ms.to_string()])
        .args(["--lock-delay-ms", &a.lock_delay_ms.to_string(), "--drift-ms", &a.drift_ms.to_string()])
        .args(["--request-timeout-ms", &a.request_timeout_ms.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    cmd
}

/// Runs the bench, spawning workers from `exe` (the cabine binary).
pub async fn run(bench: &LeaseBench, exe: &Path, settings: &Settings) -> anyhow::Result<LeaseReport> {
    let mut private = if bench.restart_redis { Some(RedisServer::start().await?) } else { None };
    let url = private.as_ref().map_or(settings.redis.url.clone(), RedisServer::url);
    let prefix = harness::unique_name("bench_lease");
    let judge = Judge::start().await.context("starting the judge")?;
    let client = lease_worker::connect(&url, settings).await?;
    let worker = bench.worker_args(&url, &prefix, judge.addr());
    let store = RedisLeaseStore::new(client.clone(), lease_worker::lease_config(&worker, settings, "bench-parent"));
    wait_out_first_quarantine(&store).await?;

    let mut children = Vec::new();
    for _ in 0..bench.processes {
        children.push(worker_command(exe, &worker).spawn().with_context(|| format!("spawning {}", exe.display()))?);
    }
    let pids: Vec<u32> = children.iter().filter_map(Child::id).collect();
    let outputs: Vec<_> = children.into_iter().map(|c| tokio::spawn(collect(c, bench.run))).collect();
    let until = Instant::now() + bench.run;
    let pause = async { if bench.pause_holder { pause_holders(&pids, bench.lease, until).await } else { 0 } };
    let restart = async {
        match private.as_mut() {
            Some(server) => restart_redis(server, bench.run).await,
            None => Ok(0),
        }
    };
    let (pauses, restarts) = tokio::join!(pause, restart);
    let restarts = restarts?;
    let mut reports = Vec::new();
    for output in outputs {
        reports.push(output.await.context("collecting a worker")??);
    }
    if private.is_none() {
        let _ = harness::delete_keys_under(&client, &prefix).await;
    }
    Ok(summarize(bench.cap, &judge, &reports, pauses, restarts))
}

/// A brand-new cluster waits lease + lock_delay once: let it pass before the clock starts.
async fn wait_out_first_quarantine(store: &RedisLeaseStore) -> anyhow::Result<()> {
    let give_up = Instant::now() + Duration::from_secs(60);
    while Instant::now() < give_up {
        match store.acquire(BENCH_POOL, None).await? {
            Acquired::Granted(lease) => return Ok(store.release(&lease).await?),
            Acquired::Quarantined { remaining } => tokio::time::sleep(remaining + Duration::from_millis(10)).await,
            Acquired::Full => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    bail!("the bench pool never granted a slot within 60 s")
}

/// Waits for a worker and parses its last stdout line.
async fn collect(mut child: Child, run: Duration) -> anyhow::Result<WorkerReport> {
    let mut stdout = child.stdout.take().context("worker stdout is piped")?;
    let mut text = String::new();
    let read = async {
        stdout.read_to_string(&mut text).await?;
        child.wait().await
    };
    let status = tokio::time::timeout(run + Duration::from_secs(60), read)
        .await
        .context("a worker did not finish in time")?
        .context("waiting for a worker")?;
    let line = text.lines().last().unwrap_or_default();
    serde_json::from_str(line).with_context(|| format!("worker exited {status}, its last line was {line:?}"))
}

/// SIGSTOP one worker for 2 × lease, SIGCONT, 1 s later the next one; every pause ends before `until`.
async fn pause_holders(pids: &[u32], lease: Duration, until: Instant) -> u64 {
    let mut pauses = 0;
    for &pid in pids.iter().cycle() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if pids.is_empty() || Instant::now() + lease * 2 >= until {
            break;
        }
        let pid = Pid::from_raw(pid as i32);
        if kill(pid, Signal::SIGSTOP).is_err() {
            continue;
        }
        tokio::time::sleep(lease * 2).await;
        let _ = kill(pid, Signal::SIGCONT);
        pauses += 1;
    }
    pauses
}

/// Restarts the private Redis (every key gone) at a third and two thirds of the run.
async fn restart_redis(server: &mut RedisServer, run: Duration) -> anyhow::Result<u64> {
    let start = Instant::now();
    for k in 1..=2 {
        tokio::time::sleep_until(start + run * k / 3).await;
        server.restart().await.context("restarting the private redis-server")?;
        tracing::info!(port = server.port(), "bench: redis restarted, every key is gone");
    }
    tokio::time::sleep_until(start + run).await;
    Ok(2)
}

fn summarize(cap: u8, judge: &Judge, reports: &[WorkerReport], pauses: u64, restarts: u64) -> LeaseReport {
    let (mut acquire, mut release, mut ping) = (Latency::default(), Latency::default(), Latency::default());
    for r in reports {
        acquire.add_pairs(&r.acquire_us);
        release.add_pairs(&r.release_us);
        ping.add_pairs(&r.ping_us);
    }
    let sum = |f: fn(&WorkerReport) -> u64| reports.iter().map(f).sum::<u64>();
    let (acquire_p50, release_p50, ping_p50) =
        (acquire.quantile_us(0.5), release.quantile_us(0.5), ping.quantile_us(0.5));
    let ratio = (acquire_p50 + release_p50) as f64 / (2 * ping_p50.max(1)) as f64;
    LeaseReport {
        cap,
        max_concurrent_observed: judge.max_concurrent(),
        grants: sum(|r| r.grants),
        refusals: sum(|r| r.refusals),
        acquire_p50_us: acquire_p50,
        acquire_p99_us: acquire.quantile_us(0.99),
        release_p50_us: release_p50,
        ping_p50_us: ping_p50,
        ratio: (ratio * 1000.0).round() / 1000.0,
        quarantine_refusals: sum(|r| r.quarantine_refusals),
        errors: sum(|r| r.errors),
        requests: sum(|r| r.requests),
        expired_before_send: sum(|r| r.expired_before_send),
        pauses,
        redis_restarts: restarts,
    }
}
