//! Outbound as a cluster: child `cabine run` pods against a child simulator,
//! real Redis, Postgres and NATS. The bank's core is played by
//! `cabine::harness::outbound` (requests on the work-queue stream); the
//! simulator's audit judges the cap, the 429s and the duplicate sends; the
//! outbound table judges loss and final states.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::ensure;
use cabine::harness::outbound::{OutboundFeed, Request, pacs008_bodies};
use cabine::harness::{ClusterSpec, LocalCluster, cluster};
use serde_json::Value;
use tokio::time::Instant;

const TOKEN: &str = "test-admin-token";

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cabine"))
}

/// Test timings plus outbound ones short enough for a test (janitor and
/// confirmer every 200 ms, idle release 500 ms, breaker break 2 s).
fn outbound_timings() -> Vec<(String, String)> {
    cluster::pairs(&[
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
    ])
}

async fn start(tag: &str, pods: usize, extra: &[(&str, &str)]) -> LocalCluster {
    cabine::install_crypto_provider();
    let mut env = cluster::test_timings();
    env.extend(outbound_timings());
    env.push(("CABINE__HTTP__ADMIN_TOKEN".into(), TOKEN.into()));
    env.push(("CABINE__LOG__FILTER".into(), "warn,cabine_actors=info".into()));
    env.extend(cluster::pairs(extra));
    let spec = ClusterSpec { tag: tag.into(), pods, env, sim_args: cluster::test_sim_args() };
    LocalCluster::start(&exe(), spec).await.expect("the cluster starts")
}

/// Runs the test body, cleans up whatever happened, then fails if the body did.
async fn run<F>(c: LocalCluster, body: F)
where
    F: for<'a> AsyncFnOnce(&'a mut LocalCluster) -> anyhow::Result<()>,
{
    let mut c = c;
    let outcome = body(&mut c).await;
    c.cleanup().await;
    outcome.unwrap();
}

/// Polls `check` every 100 ms until it holds or `within` passes; the last value either way.
async fn until<T, F, Fut>(within: Duration, mut check: F) -> anyhow::Result<T>
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

async fn statuses(c: &LocalCluster) -> anyhow::Result<BTreeMap<String, i64>> {
    Ok(c.outbound_by_status().await?)
}

fn count(s: &BTreeMap<String, i64>, status: &str) -> i64 {
    s.get(status).copied().unwrap_or(0)
}

async fn audit(c: &LocalCluster) -> anyhow::Result<Value> {
    Ok(c.sim.control.audit("cpm").await?)
}

fn field(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or(u64::MAX)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_pods_send_ten_thousand_exactly_once_within_the_bucket_and_the_send_pool() {
    let c = start("cob_10k", 3, &[]).await;
    run(c, async |c| {
        let n: usize = std::env::var("COB_N").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
        eprintln!("publishing {n}");
        let feed = OutboundFeed::of(c);
        let ids = feed
            .publish_all(&pacs008_bodies(&c.settings.cluster.ispb, n), Request::default())
            .await
            .map_err(anyhow::Error::msg)?;
        eprintln!("published {}", ids.len());
        ensure!(ids.len() == n);
        let n = n as i64;
        let s = until(Duration::from_secs(60), async || {
            let s = statuses(c).await?;
            Ok((count(&s, "confirmed") == n, s))
        })
        .await?;
        ensure!(count(&s, "confirmed") == n, "every message confirmed: {s:?}");
        let a = audit(c).await?;
        ensure!(field(&a, "received_outbound") == n as u64, "each MsgId reached the SPI once: {a}");
        ensure!(field(&a, "duplicates_outbound") == 0, "no duplicate send: {a}");
        ensure!(field(&a, "rejected_429") == 0, "the bucket kept the cluster under the SPI's: {a}");
        let pool = u64::from(c.settings.pools.send.get());
        ensure!(field(&a, "max_in_flight_sends") <= pool, "sends in flight within the send pool: {a}");
        let distinct = c.query("SELECT count(DISTINCT msg_id) FROM outbound").await?;
        ensure!(distinct[0].get::<_, i64>(0) == n, "one row per MsgId");
        Ok(())
    })
    .await;
}
