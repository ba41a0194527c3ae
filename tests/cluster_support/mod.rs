//! Shared by the `cluster*` test binaries: a local cluster (child simulator and
//! `cabine run` pods against real Redis, Postgres and NATS) with test timings,
//! a body run with cleanup whatever happens, and polling until a condition holds.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use cabine::harness::{BusReader, ClusterSpec, LocalCluster, cluster};
use tokio::time::Instant;

/// Bearer token of the operator endpoints in every test cluster.
pub const TOKEN: &str = "test-admin-token";

/// The `cabine` binary: the one nextest names at run time (an archive run from
/// elsewhere), else the one cargo built with this test.
pub fn exe() -> PathBuf {
    std::env::var_os("NEXTEST_BIN_EXE_cabine")
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_cabine")), PathBuf::from)
}

/// Outbound timings short enough for a test: janitor, confirmer and status every
/// 200 ms, idle release 500 ms, pull wait 200 ms, breaker break 2 s, backoff ≤ 1 s.
pub const OUTBOUND_TIMINGS: &[(&str, &str)] = &[
    ("CABINE__OUTBOUND__JANITOR_INTERVAL", "200ms"),
    ("CABINE__OUTBOUND__CONFIRM_INTERVAL", "200ms"),
    ("CABINE__OUTBOUND__STATUS_INTERVAL", "200ms"),
    ("CABINE__OUTBOUND__IDLE_RELEASE", "500ms"),
    ("CABINE__OUTBOUND__IDLE_POLL", "50ms"),
    ("CABINE__OUTBOUND__PULL_WAIT", "200ms"),
    ("CABINE__OUTBOUND__ACK_WAIT", "10s"),
    ("CABINE__OUTBOUND__BREAKER__BREAK_TIME", "2s"),
    ("CABINE__OUTBOUND__BREAKER__PROBE_TIMEOUT", "3s"),
    ("CABINE__OUTBOUND__BREAKER__SLOW_CALL", "900ms"),
    ("CABINE__TIMING__BACKOFF_MAX", "1s"),
    ("CABINE__TIMING__PROCESSING_TIMEOUT", "10s"),
];

/// `pods` pods with the test timings, the token, quiet logs, then `layers` in order (later wins).
pub async fn start(tag: &str, pods: usize, layers: &[&[(&str, &str)]]) -> LocalCluster {
    cabine::install_crypto_provider();
    let mut env = cluster::test_timings();
    env.push(("CABINE__HTTP__ADMIN_TOKEN".into(), TOKEN.into()));
    env.push(("CABINE__LOG__FILTER".into(), "warn,cabine_actors=info".into()));
    for layer in layers {
        env.extend(cluster::pairs(layer));
    }
    let spec = ClusterSpec { tag: tag.into(), pods, env, sim_args: cluster::test_sim_args() };
    LocalCluster::start(&exe(), spec).await.expect("the cluster starts")
}

/// Runs the test body, cleans up whatever happened, then fails if the body did.
pub async fn run<F>(c: LocalCluster, body: F)
where
    F: for<'a> AsyncFnOnce(&'a mut LocalCluster) -> anyhow::Result<()>,
{
    let mut c = c;
    let outcome = body(&mut c).await;
    c.cleanup().await;
    outcome.unwrap();
}

/// Polls `check` every 100 ms until it holds or `within` passes; the last value either way.
pub async fn until<T, F, Fut>(within: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<(bool, T)>>,
{
    let deadline = Instant::now() + within;
    loop {
        let (done, value) = check().await?;
        if done || Instant::now() >= deadline {
            return Ok(value);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls `check` every 50 ms; whether it held within `within`.
pub async fn eventually<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Holders of pool `pool` (`stream`, `send`) of the primary channel, slot → pod, from pod `i`'s `/cluster`.
pub async fn holders(c: &LocalCluster, i: usize, pool: &str) -> anyhow::Result<BTreeMap<u64, String>> {
    let view = c.pod_json(i, "/cluster").await?;
    let pools = view["holders"].as_array().context("holders")?;
    let found = pools.iter().find(|p| p["pool"] == pool).with_context(|| format!("{pool} pool"))?;
    Ok(found["holders"]
        .as_array()
        .context("holder list")?
        .iter()
        .map(|h| (h["slot"].as_u64().unwrap_or(0), h["pod"].as_str().unwrap_or("").to_owned()))
        .collect())
}

/// Stream slot → holding pod, from pod `i`'s `/cluster`.
pub async fn stream_holders(c: &LocalCluster, i: usize) -> anyhow::Result<BTreeMap<u64, String>> {
    holders(c, i, "stream").await
}

/// An independent reader of the cluster's inbound stream, from its start.
pub async fn inbound_reader(c: &LocalCluster) -> BusReader {
    BusReader::start(c.nats.clone(), &c.settings.nats.inbound_stream, &c.inbound_filter())
        .await
        .unwrap_or_else(|e| panic!("the inbound reader: {e}"))
}
