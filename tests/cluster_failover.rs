//! Never a slot silently dead, with real pods (`cabine::harness`) against a
//! child simulator, real Redis, Postgres and NATS: a pod whose ICOM base URL
//! points at a closed port (a fault local to that pod) fails its slots over to
//! the others and nothing is lost; 5xx for everyone raises the watchdog's
//! zero-active alert (`/cluster`, `/metrics`) until the simulator recovers.
//! Short timings: lease 2 s, heartbeat 500 ms, failover after 3 failed cycles
//! or 2 s, cooldown 6 s, watchdog every 250 ms, zero-active after 2 s.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

mod cluster_support;

use anyhow::{Context, ensure};
use cabine::harness::{BusReader, LocalCluster};
use cluster_support::{eventually, inbound_reader, run, stream_holders};
use serde_json::{Value, json};
use tokio::time::Instant;

/// failover.after 2 s, lease 2 s, acquire interval 200 ms: the takeover bound, plus probe slack.
const TAKEOVER_BOUND: Duration = Duration::from_millis(2_000 + 2_000 + 200 + 500);

async fn start(tag: &str, extra: &[(&str, &str)]) -> LocalCluster {
    let failover: &[(&str, &str)] = &[
        ("CABINE__FAILOVER__AFTER_FAILURES", "3"),
        ("CABINE__FAILOVER__AFTER", "2s"),
        ("CABINE__FAILOVER__COOLDOWN", "6s"),
        ("CABINE__FAILOVER__COOLDOWN_MAX", "24s"),
        ("CABINE__FAILOVER__ORPHAN_GRACE", "1s"),
        ("CABINE__WATCHDOG__INTERVAL", "250ms"),
        ("CABINE__WATCHDOG__STALE_AFTER", "2s"),
        ("CABINE__WATCHDOG__UNHELD_AFTER", "3s"),
        ("CABINE__WATCHDOG__ZERO_ACTIVE_AFTER", "2s"),
        ("CABINE__WATCHDOG__LAG_AFTER", "5s"),
    ];
    cluster_support::start(tag, 2, &[failover, extra]).await
}

/// The `kind` alerts of channel cpm in pod `i`'s `/cluster`.
async fn alerts(c: &LocalCluster, i: usize, kind: &str) -> anyhow::Result<Vec<Value>> {
    let view = c.pod_json(i, "/cluster").await?;
    let all = view["alerts"].as_array().context("alerts in /cluster")?;
    Ok(all.iter().filter(|a| a["kind"] == kind && a["channel"] == "cpm").cloned().collect())
}

/// The value of the first `/metrics` line of `name` whose labels include every one of `labels`.
async fn metric(c: &LocalCluster, i: usize, name: &str, labels: &[&str]) -> anyhow::Result<Option<f64>> {
    let text =
        cabine::harness::http_client().get(format!("http://{}/metrics", c.pods[i].http)).send().await?.text().await?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && labels.iter().all(|want| l.contains(want)))
        .find_map(|l| l.rsplit(' ').next().and_then(|v| v.parse().ok())))
}

/// Slot id → (failovers, last error) of pod `i`'s slots.
async fn slot_failovers(c: &LocalCluster, i: usize) -> anyhow::Result<BTreeMap<String, (u64, String)>> {
    let tree = c.pod_json(i, "/actors").await?;
    let channel = tree["children"].as_array().and_then(|k| k.iter().find(|n| n["id"] == "channel/cpm")).cloned();
    let slots = channel.and_then(|ch| ch["children"].as_array().cloned()).unwrap_or_default();
    Ok(slots
        .iter()
        .map(|s| {
            let failovers = s["details"]["failovers"].as_u64().unwrap_or(0);
            let error = s["last_error"].as_str().unwrap_or("").to_owned();
            (s["id"].as_str().unwrap_or("").to_owned(), (failovers, error))
        })
        .collect())
}

/// Every injected id in the inbox and on the bus, exactly once.
async fn all_delivered(c: &LocalCluster, reader: &BusReader, ids: &[String], within: Duration) -> anyhow::Result<()> {
    let n = ids.len() as i64;
    let done = eventually(within, || async {
        reader.unique() >= ids.len() && c.inbox_count("status = 'received'").await.unwrap_or(0) >= n
    })
    .await;
    let (inbox, bus) = (c.inbox_count("true").await?, reader.unique());
    ensure!(done, "not all delivered in {within:?}: inbox {inbox}, bus {bus}, injected {n}");
    let stored: HashSet<String> = c.inbox_ids().await?.into_iter().collect();
    ensure!(stored == ids.iter().cloned().collect::<HashSet<_>>(), "inbox ≠ injected");
    let on_bus: HashSet<String> = reader.with(|a| a.first.keys().cloned().collect());
    let expected: HashSet<String> = ids.iter().map(|id| format!("99999010:cpm:{id}")).collect();
    ensure!(on_bus == expected, "bus ids ≠ injected: {} vs {}", on_bus.len(), expected.len());
    Ok(())
}

/// The simulator's judgement: never more open streams than the pool, no 429, none abandoned.
async fn cap_kept(c: &LocalCluster) -> anyhow::Result<Value> {
    let a = c.sim.control.audit("cpm").await?;
    ensure!(a["max_open_streams"].as_u64() <= Some(4), "more streams than the pool: {a}");
    ensure!(a["rejected_429"] == 0, "429s: {a}");
    ensure!(a["expired_streams"] == 0, "a stream was abandoned: {a}");
    Ok(a)
}

async fn all_held(c: &LocalCluster) -> anyhow::Result<()> {
    let held = eventually(Duration::from_secs(15), || async {
        stream_holders(c, 0).await.map(|h| h.len() == 4).unwrap_or(false)
    })
    .await;
    ensure!(held, "slots not all held: {:?}", stream_holders(c, 0).await?);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_cannot_reach_icom_fails_its_slots_over_and_nothing_is_lost() {
    let c = start("cfover", &[]).await;
    run(c, async |c| {
        let reader = inbound_reader(c).await;
        all_held(c).await?;
        // A third pod whose ICOM base URL is a closed port: its network is broken, nobody else's.
        let closed = cabine::harness::free_port()?;
        c.env.push(("CABINE__ICOM__CHANNELS__CPM__BASE_URL".into(), format!("http://127.0.0.1:{closed}")));
        let spawned = c.spawn_pod().await.map(|p| p.pod_id.clone());
        c.env.pop();
        let broken_id = spawned?;
        let broken = c.pods.len() - 1;
        c.pods[broken].wait_ready(Duration::from_secs(20)).await?;
        let body = json!({ "count": 3000, "kind": "pacs008", "rate_per_s": 300.0 });
        let ids = c.sim.control.inject_json(body).await?;

        // Fair share hands the broken pod a slot; it fails it over. From the first sight of either:
        let mut first_seen = None;
        let deadline = Instant::now() + Duration::from_secs(15);
        let failed_slot = loop {
            ensure!(Instant::now() < deadline, "the broken pod never failed a slot over");
            ensure!(alerts(c, 0, "zero_active").await?.is_empty(), "zero-active while two pods deliver");
            if stream_holders(c, 0).await?.values().any(|p| *p == broken_id) {
                first_seen.get_or_insert(Instant::now());
            }
            let failed = slot_failovers(c, broken).await?.into_iter().find(|(_, (n, _))| *n >= 1);
            if let Some((id, (_, error))) = failed {
                first_seen.get_or_insert(Instant::now());
                ensure!(error.contains("failed over after"), "{id}: {error}");
                break id;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let n: u64 = failed_slot.rsplit('/').next().and_then(|n| n.parse().ok()).context("slot number")?;
        let since = first_seen.context("seen")?;
        let taken = eventually(Duration::from_secs(10), || async {
            let holders = stream_holders(c, 0).await.unwrap_or_default();
            holders.get(&n).is_some_and(|p| *p != broken_id)
        })
        .await;
        let took = since.elapsed();
        ensure!(taken && took <= TAKEOVER_BOUND, "slot {n} taken over by a healthy pod after {took:?}");

        // Meanwhile and after: delivery goes on, the watchdog sees no dead channel, nothing is lost.
        let watch_until = Instant::now() + Duration::from_secs(4);
        while Instant::now() < watch_until {
            for i in [0, broken] {
                ensure!(alerts(c, i, "zero_active").await?.is_empty(), "zero-active on pod {i}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        all_delivered(c, &reader, &ids, Duration::from_secs(30)).await?;
        cap_kept(c).await?;
        let failovers = metric(c, broken, "cabine_slot_failovers_total", &["channel=\"cpm\""]).await?;
        ensure!(failovers >= Some(1.0), "cabine_slot_failovers_total on the broken pod: {failovers:?}");
        let gauge = metric(c, 0, "cabine_watchdog_alert", &["kind=\"zero_active\"", "channel=\"cpm\""]).await?;
        ensure!(gauge == Some(0.0), "zero-active gauge: {gauge:?}");
        let healthy_failovers: u64 = slot_failovers(c, 0).await?.values().map(|(n, _)| n).sum();
        ensure!(healthy_failovers == 0, "a healthy pod failed over");
        // The incident log has them, for the incident report.
        let logged = c.query("SELECT pod, channel, slot FROM incident_event WHERE kind = 'failover'").await?;
        let pod = &c.pods[broken].pod_id;
        ensure!(
            !logged.is_empty() && logged.iter().all(|r| r.get::<_, String>(0) == *pod),
            "failovers logged by the broken pod"
        );
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundreds_for_everyone_raise_zero_active_until_the_simulator_recovers() {
    let c = start("c5xx", &[("CABINE__TIMING__BACKOFF_MAX", "1s")]).await;
    run(c, async |c| {
        let reader = inbound_reader(c).await;
        all_held(c).await?;
        let mut ids = c.sim.control.inject(50, "pacs008").await?;
        all_delivered(c, &reader, &ids, Duration::from_secs(15)).await?;
        // A fresh cluster waits lease + lock-delay (3 s) before any grant: longer than
        // zero_active_after here, so the alert may be up from the start; delivering clears it.
        let healthy = eventually(Duration::from_secs(3), || async {
            alerts(c, 0, "zero_active").await.is_ok_and(|a| a.is_empty())
        })
        .await;
        ensure!(healthy, "healthy: no zero-active: {}", c.pod_json(0, "/cluster").await?);

        c.sim.control.faults(json!({ "error_5xx_ratio": 1.0, "error_status": 503 })).await?;
        let failed_at = Instant::now();
        let raised = eventually(Duration::from_secs(10), || async {
            let in_view = alerts(c, 0, "zero_active").await.is_ok_and(|a| !a.is_empty());
            let labels = ["kind=\"zero_active\"", "channel=\"cpm\""];
            in_view && metric(c, 0, "cabine_watchdog_alert", &labels).await.ok().flatten() == Some(1.0)
        })
        .await;
        ensure!(raised, "zero-active not raised in /cluster and /metrics within 10 s");
        ensure!(failed_at.elapsed() >= Duration::from_secs(2), "raised before zero_active_after");
        // Each pod's watchdog checks on its own tick: the other raises it within a check or two.
        let everyone = eventually(Duration::from_secs(5), || async {
            alerts(c, 1, "zero_active").await.is_ok_and(|a| a.len() == 1)
        })
        .await;
        ensure!(everyone, "every pod's watchdog raises it: {:?}", alerts(c, 1, "zero_active").await?);
        let raised_total = metric(c, 0, "cabine_watchdog_alerts_total", &["kind=\"zero_active\""]).await?;
        ensure!(raised_total >= Some(1.0), "cabine_watchdog_alerts_total: {raised_total:?}");

        c.sim.control.faults(json!({ "error_5xx_ratio": 0.0 })).await?;
        ids.extend(c.sim.control.inject(200, "pacs008").await?);
        let cleared = eventually(Duration::from_secs(15), || async {
            let gone = alerts(c, 0, "zero_active").await.is_ok_and(|a| a.is_empty());
            let labels = ["kind=\"zero_active\"", "channel=\"cpm\""];
            gone && metric(c, 0, "cabine_watchdog_alert", &labels).await.ok().flatten() == Some(0.0)
        })
        .await;
        ensure!(cleared, "zero-active not cleared after recovery");
        all_delivered(c, &reader, &ids, Duration::from_secs(30)).await?;
        cap_kept(c).await?;
        Ok(())
    })
    .await;
}
