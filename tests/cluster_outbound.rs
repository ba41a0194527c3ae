//! Outbound as a cluster: child `cabine run` pods against a child simulator,
//! real Redis, Postgres and NATS. The bank's core is played by
//! `cabine::harness::outbound` (requests on the work-queue stream); the
//! simulator's audit judges the cap, the 429s and the duplicate sends; the
//! outbound table judges loss and final states.

use std::collections::BTreeMap;
use std::time::Duration;

mod cluster_support;

use anyhow::ensure;
use cabine::harness::outbound::{OutboundFeed, Request, pacs008_bodies};
use cabine::harness::{BusReader, LocalCluster};
use cabine::redis::breaker::RedisBreaker;
use cabine::redis::guard::{GuardKeys, ScriptClock};
use cabine_actors::domain::ChannelId;
use cabine_actors::ports::breaker::{BreakerState, CircuitBreaker};
use cluster_support::{OUTBOUND_TIMINGS, holders, run, until};
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tokio::time::Instant;

async fn start(tag: &str, pods: usize, extra: &[(&str, &str)]) -> LocalCluster {
    cluster_support::start(tag, pods, &[OUTBOUND_TIMINGS, extra]).await
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
        let n = 10_000;
        let subject = cabine::bus::Subjects::new(&c.settings.nats, &c.settings.cluster.ispb).results();
        let results = BusReader::start(c.nats.clone(), &c.settings.nats.results_stream, &subject)
            .await
            .map_err(anyhow::Error::msg)?;
        let feed = OutboundFeed::of(c);
        let ids = feed
            .publish_all(&pacs008_bodies(&c.settings.cluster.ispb, n), Request::default())
            .await
            .map_err(anyhow::Error::msg)?;
        ensure!(ids.len() == n);
        let n = n as i64;
        let s = until(Duration::from_secs(150), async || {
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
        // accepted, sent, confirmed: one result event each, each once on the bus.
        let events = until(Duration::from_secs(20), async || {
            let (unique, read) = results.with(|a| (a.first.len(), a.read));
            Ok((unique >= 3 * n as usize, (unique, read)))
        })
        .await?;
        ensure!(events.0 == 3 * n as usize && events.1 == events.0 as u64, "result events (unique, read): {events:?}");
        Ok(())
    })
    .await;
}

/// Publishes `n` fresh pacs.008 with these headers; their MsgIds.
async fn publish(c: &LocalCluster, n: usize, request: Request<'_>) -> anyhow::Result<Vec<String>> {
    let bodies = pacs008_bodies(&c.settings.cluster.ispb, n);
    OutboundFeed::of(c).publish_all(&bodies, request).await.map_err(anyhow::Error::msg)
}

/// Waits until `n` rows are in `status`; the statuses seen last.
async fn until_count(
    c: &LocalCluster,
    status: &str,
    n: i64,
    within: Duration,
) -> anyhow::Result<BTreeMap<String, i64>> {
    until(within, async || {
        let s = statuses(c).await?;
        Ok((count(&s, status) == n, s))
    })
    .await
}

/// The cluster's shared breaker of the primary channel, read as the pods read it.
async fn breaker(c: &LocalCluster) -> anyhow::Result<RedisBreaker> {
    let s = &c.settings;
    let client = cabine::redis::connect(&s.redis)?;
    fred::interfaces::ClientLike::wait_for_connect(&client).await?;
    let keys = GuardKeys::new(&s.redis.prefix, &s.cluster.name, &s.cluster.ispb);
    Ok(RedisBreaker::new(client, keys, &s.outbound.breaker, ScriptClock::Server))
}

async fn breaker_state(b: &RedisBreaker) -> anyhow::Result<BreakerState> {
    Ok(b.state(ChannelId::Cpm).await?.state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_msg_id_published_twice_is_sent_once() {
    let c = start("cob_dup", 2, &[]).await;
    run(c, async |c| {
        let body = pacs008_bodies(&c.settings.cluster.ispb, 1).remove(0);
        let feed = OutboundFeed::of(c);
        feed.publish_all(std::slice::from_ref(&body), Request::default()).await.map_err(anyhow::Error::msg)?;
        let s = until_count(c, "confirmed", 1, Duration::from_secs(20)).await?;
        ensure!(count(&s, "confirmed") == 1, "the first copy is confirmed: {s:?}");
        feed.publish_all(&[body], Request::default()).await.map_err(anyhow::Error::msg)?;
        // The second copy is pulled, found under its MsgId and acknowledged: the stream empties.
        let js = async_nats::jetstream::new(c.nats.clone());
        let drained = until(Duration::from_secs(20), async || {
            let mut stream = js.get_stream(&c.settings.nats.outbound_stream).await?;
            let left = stream.info().await?.state.messages;
            Ok((left == 0, left))
        })
        .await?;
        ensure!(drained == 0, "the duplicate request was consumed ({drained} left)");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let a = audit(c).await?;
        ensure!(field(&a, "received_outbound") == 1 && field(&a, "duplicates_outbound") == 0, "one send: {a}");
        let s = statuses(c).await?;
        ensure!(s.values().sum::<i64>() == 1, "one row: {s:?}");
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_hundreds_open_the_breaker_once_for_the_cluster_and_rows_flow_after_recovery() {
    // A retry budget longer than the outage's probes: the outage itself must lose nothing.
    let c = start("cob_brk", 3, &[("CABINE__TIMING__POISON_ATTEMPTS", "20")]).await;
    run(c, async |c| {
        let b = breaker(c).await?;
        c.sim.control.faults(json!({"channel": "cpm", "error_5xx_ratio": 1.0, "error_status": 503})).await?;
        let before = field(&audit(c).await?, "send_requests");
        let ids = publish(c, 300, Request::default()).await?;
        let opened = until(Duration::from_secs(10), async || {
            let st = breaker_state(&b).await?;
            Ok((st == BreakerState::Open, st))
        })
        .await?;
        ensure!(opened == BreakerState::Open, "the breaker opened: {opened:?}");
        let outage = Duration::from_secs(6);
        tokio::time::sleep(outage).await;
        let during = field(&audit(c).await?, "send_requests") - before;
        let s = statuses(c).await?;
        ensure!(count(&s, "sent") + count(&s, "confirmed") + count(&s, "dead") == 0, "nothing got through: {s:?}");
        // Up to the consecutive-failure threshold (plus the calls already in flight
        // on the send pool when it opened), then one probe per break.
        let o = &c.settings.outbound.breaker;
        let breaks = outage.as_secs() / o.break_time.as_secs() + 2;
        let bound =
            u64::from(o.consecutive_failures) + u64::from(c.settings.pools.send.get()) + breaks * u64::from(o.probes);
        ensure!(during <= bound, "{during} upstream sends during the outage (bound {bound})");
        c.sim.control.faults(json!({"channel": "cpm", "error_5xx_ratio": 0.0})).await?;
        let s = until_count(c, "confirmed", ids.len() as i64, Duration::from_secs(40)).await?;
        ensure!(count(&s, "confirmed") == ids.len() as i64, "all confirmed after recovery: {s:?}");
        let a = audit(c).await?;
        ensure!(field(&a, "received_outbound") == ids.len() as u64, "each stored once: {a}");
        ensure!(breaker_state(&b).await? == BreakerState::Closed, "closed again");
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refusals_never_open_the_breaker() {
    let c = start("cob_4xx", 2, &[]).await;
    run(c, async |c| {
        let b = breaker(c).await?;
        c.sim.control.faults(json!({"channel": "cpm", "reject_sends_ratio": 1.0})).await?;
        let ids = publish(c, 100, Request::default()).await?;
        let s = until_count(c, "rejected", ids.len() as i64, Duration::from_secs(20)).await?;
        ensure!(count(&s, "rejected") == ids.len() as i64, "every 403 is a permanent rejection: {s:?}");
        let view = b.state(ChannelId::Cpm).await?;
        ensure!(view.state == BreakerState::Closed && view.failures == 0, "4xx never counts: {view:?}");
        c.sim.control.faults(json!({"channel": "cpm", "reject_sends_ratio": 0.0})).await?;
        let more = publish(c, 20, Request::default()).await?;
        let s = until_count(c, "confirmed", more.len() as i64, Duration::from_secs(20)).await?;
        ensure!(count(&s, "confirmed") == 20 && count(&s, "rejected") == 100, "{s:?}");
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connection_resets_are_retried_and_no_msg_id_is_accepted_twice() {
    let c = start("cob_rst", 2, &[("CABINE__TIMING__POISON_ATTEMPTS", "30")]).await;
    run(c, async |c| {
        c.sim.control.faults(json!({"channel": "cpm", "reset_ratio": 0.25})).await?;
        let ids = publish(c, 1000, Request::default()).await?;
        let n = ids.len() as i64;
        let sent = until(Duration::from_secs(60), async || {
            let s = statuses(c).await?;
            let done = count(&s, "sent") + count(&s, "confirmed");
            Ok((done == n, s))
        })
        .await?;
        c.sim.control.faults(json!({"channel": "cpm", "reset_ratio": 0.0})).await?;
        ensure!(count(&sent, "sent") + count(&sent, "confirmed") == n, "everything sent despite resets: {sent:?}");
        let a = audit(c).await?;
        ensure!(field(&a, "fault_resets") > 0, "resets happened: {a}");
        ensure!(field(&a, "received_outbound") - field(&a, "duplicates_outbound") == n as u64, "stored once: {a}");
        ensure!(
            field(&a, "duplicates_outbound") == 0,
            "a reset before the answer is not stored, so no resend is a duplicate: {a}"
        );
        let s = until_count(c, "confirmed", n, Duration::from_secs(30)).await?;
        ensure!(count(&s, "confirmed") == n, "{s:?}");
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn saque_troco_rows_stop_at_their_deadline_while_the_breaker_is_open_and_are_never_sent_later() {
    let c = start(
        "cob_ddl",
        2,
        &[("CABINE__OUTBOUND__DEADLINES__SAQUE_TROCO", "3s"), ("CABINE__TIMING__POISON_ATTEMPTS", "20")],
    )
    .await;
    run(c, async |c| {
        let b = breaker(c).await?;
        c.sim.control.faults(json!({"channel": "cpm", "error_5xx_ratio": 1.0, "error_status": 503})).await?;
        let standard = publish(c, 30, Request::default()).await?;
        let opened = until(Duration::from_secs(10), async || {
            let st = breaker_state(&b).await?;
            Ok((st == BreakerState::Open, st))
        })
        .await?;
        ensure!(opened == BreakerState::Open, "{opened:?}");
        let logged = until(Duration::from_secs(5), async || {
            let n: i64 = c.query("SELECT count(*) FROM incident_event WHERE kind = 'breaker_opened'").await?[0].get(0);
            Ok((n >= 1, n))
        })
        .await?;
        ensure!(logged >= 1, "the opening is in the incident log: {logged}");
        let quick = publish(c, 20, Request { priority: "high", class: "saque_troco" }).await?;
        let ended = |s: &BTreeMap<String, i64>| count(s, "timeout") + count(s, "in_doubt");
        let s = until(Duration::from_secs(10), async || {
            let s = statuses(c).await?;
            Ok((ended(&s) == quick.len() as i64, s))
        })
        .await?;
        ensure!(ended(&s) == 20, "saque_troco rows stop at their deadline: {s:?}");
        // A call admitted just before the breaker opened may still post a batch of them: its 503
        // may have stored them, so those are in doubt; the rows never posted time out.
        let ends = c.query("SELECT status, attempts FROM outbound WHERE status IN ('timeout', 'in_doubt')").await?;
        let doubt_iff_posted = ends.iter().all(|r| (r.get::<_, String>(0) == "in_doubt") == (r.get::<_, i32>(1) > 0));
        ensure!(doubt_iff_posted, "in_doubt exactly when a 503 answered a post: {s:?}");
        c.sim.control.faults(json!({"channel": "cpm", "error_5xx_ratio": 0.0})).await?;
        let s = until_count(c, "confirmed", standard.len() as i64, Duration::from_secs(30)).await?;
        ensure!(count(&s, "confirmed") == 30 && ended(&s) == 20, "{s:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let a = audit(c).await?;
        ensure!(field(&a, "received_outbound") == 30, "no row past its deadline reached the SPI: {a}");
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn critical_rows_of_a_backlog_are_sent_before_normal_ones() {
    let c = start("cob_pri", 2, &[]).await;
    run(c, async |c| {
        // Hold everything back while the backlog builds: the breaker refuses all sends.
        let b = breaker(c).await?;
        c.sim.control.faults(json!({"channel": "cpm", "error_5xx_ratio": 1.0, "error_status": 503})).await?;
        publish(c, 10, Request { priority: "low", class: "standard" }).await?;
        until(Duration::from_secs(10), async || Ok((breaker_state(&b).await? == BreakerState::Open, ()))).await?;
        publish(c, 300, Request::default()).await?;
        publish(c, 30, Request { priority: "critical", class: "standard" }).await?;
        until_count(c, "queued", 340, Duration::from_secs(10)).await?;
        c.sim.control.faults(json!({"channel": "cpm", "error_5xx_ratio": 0.0})).await?;
        b.reset(ChannelId::Cpm).await?;
        until_count(c, "confirmed", 340, Duration::from_secs(30)).await?;
        let rows = c
            .query(
                "SELECT priority::text, sent_at FROM outbound WHERE sent_at IS NOT NULL
                 ORDER BY sent_at, id",
            )
            .await?;
        // Stored as its rank: 0 critical, 1 high, 2 normal, 3 low.
        let order: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        let last_critical = order.iter().rposition(|p| p == "0").unwrap_or(usize::MAX);
        let first_normal = order.iter().position(|p| p == "2").unwrap_or(0);
        ensure!(last_critical < first_normal + 20, "critical first (order {order:?})");
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_of_a_pod_holding_send_leases_loses_nothing_and_accepts_nothing_twice() {
    let c = start("cob_kill", 3, &[]).await;
    run(c, async |c| {
        let ids = publish(c, 6000, Request::default()).await?;
        let n = ids.len() as i64;
        // The pod holding a send lease while sends are under way.
        let holder = until(Duration::from_secs(20), async || {
            let pod = holders(c, 0, "send").await?.into_values().next();
            let s = statuses(c).await?;
            let sent = count(&s, "sent") + count(&s, "confirmed");
            Ok((pod.is_some() && sent > 500, pod))
        })
        .await?
        .ok_or_else(|| anyhow::anyhow!("no pod holds a send lease"))?;
        let victim = holder.rsplit("-p").next().and_then(|n| n.parse::<usize>().ok()).map(|n| n - 1).unwrap_or(0);
        c.pods[victim].signal(Signal::SIGKILL);
        let killed = Instant::now();
        let survivor = (victim + 1) % c.pods.len();
        let freed = until(Duration::from_secs(10), async || {
            let held = holders(c, survivor, "send").await?.values().any(|p| *p == holder);
            Ok((!held, killed.elapsed()))
        })
        .await?;
        let t = &c.settings.timing;
        ensure!(freed <= t.lease + t.lock_delay + Duration::from_millis(500), "send lease freed after {freed:?}");
        ensure!(freed + t.heartbeat >= t.lease + t.lock_delay - Duration::from_millis(300), "not before: {freed:?}");
        let s = until_count(c, "confirmed", n, Duration::from_secs(60)).await?;
        ensure!(count(&s, "confirmed") == n, "everything confirmed after the kill: {s:?}");
        let a = audit(c).await?;
        let accepted = field(&a, "received_outbound") - field(&a, "duplicates_outbound");
        ensure!(accepted == n as u64, "every MsgId accepted by the SPI exactly once: {a}");
        // A claim killed between the SPI's 201 and our commit is resent under the same
        // MsgId and refused as a duplicate: at most one batch per sender of the victim.
        let resends = field(&a, "duplicates_outbound");
        let per_pod = u64::from(c.settings.outbound.senders_per_channel.get()) * 10;
        ensure!(resends <= per_pod, "{resends} resends (at most {per_pod})");
        ensure!(field(&a, "max_in_flight_sends") <= u64::from(c.settings.pools.send.get()), "{a}");
        Ok(())
    })
    .await;
}

/// The `outbound-dispatcher` entry of pod `i`'s `/actors`.
async fn dispatcher(c: &LocalCluster, i: usize) -> anyhow::Result<Value> {
    fn find(node: &Value) -> Option<Value> {
        if node["id"] == "outbound-dispatcher" {
            return Some(node.clone());
        }
        node["children"].as_array()?.iter().find_map(find)
    }
    find(&c.pod_json(i, "/actors").await?).ok_or_else(|| anyhow::anyhow!("no outbound-dispatcher in /actors"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn above_max_queued_the_dispatchers_stop_pulling_and_say_so() {
    let extra = [("CABINE__OUTBOUND__MAX_QUEUED", "50"), ("CABINE__OUTBOUND__PULL_BATCH", "20")];
    let c = start("cob_bp", 1, &extra).await;
    run(c, async |c| {
        let b = breaker(c).await?;
        c.sim.control.faults(json!({"channel": "cpm", "error_5xx_ratio": 1.0, "error_status": 503})).await?;
        publish(c, 10, Request::default()).await?;
        until(Duration::from_secs(10), async || Ok((breaker_state(&b).await? == BreakerState::Open, ()))).await?;
        publish(c, 300, Request::default()).await?;
        let d = until(Duration::from_secs(10), async || {
            let d = dispatcher(c, 0).await?;
            Ok((d["details"]["backpressure"] == true, d))
        })
        .await?;
        ensure!(d["state"] == "backpressure" && d["details"]["backpressure"] == true, "shown in /actors: {d}");
        tokio::time::sleep(Duration::from_secs(1)).await;
        // max_queued counts `queued` rows: the first 10 may be out of it (`sending`) while a sender's
        // turn holds them at a probe of the breaker, so at most 10 + 50 + one batch of 20 are stored.
        let stored: i64 = statuses(c).await?.values().sum();
        ensure!((50..=10 + 50 + 20).contains(&stored), "stops pulling past max_queued: {stored} stored");
        let metrics = cabine::harness::http_client()
            .get(format!("http://{}/metrics", c.pods[0].http))
            .send()
            .await?
            .text()
            .await?;
        ensure!(metrics.lines().any(|l| l.starts_with("cabine_outbound_backpressure") && l.ends_with(" 1")), "metric");
        c.sim.control.faults(json!({"channel": "cpm", "error_5xx_ratio": 0.0})).await?;
        b.reset(ChannelId::Cpm).await?;
        let s = until_count(c, "confirmed", 310, Duration::from_secs(30)).await?;
        ensure!(count(&s, "confirmed") == 310, "the rest is pulled once the queue drains: {s:?}");
        Ok(())
    })
    .await;
}

/// A sender restarted mid-POST (its lease released at once by its supervisor)
/// while the SPI still handles that POST: the next holder of the send slot
/// claims its gate row and waits out the busy window (DESIGN §2.5), so the SPI
/// never sees two POSTs of one send slot at once. One send slot, two senders,
/// 400 ms of latency on every request, the sender holding the slot restarted
/// again and again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_aborted_by_a_restart_is_waited_out_by_the_next_holder_of_its_send_slot() {
    let one_slot = [
        ("CABINE__POOLS__SEND", "1"),
        ("CABINE__OUTBOUND__SENDERS_PER_CHANNEL", "2"),
        ("CABINE__OUTBOUND__BATCH_SIZE", "1"),
    ];
    let c = start("cob_abort", 1, &one_slot).await;
    run(c, async |c| {
        c.sim.control.faults(json!({ "latency_ms": 400 })).await?;
        let ids = publish(c, 40, Request::default()).await?;
        let n = ids.len() as i64;
        until(Duration::from_secs(20), async || Ok((sender_holding(c).await?.is_some(), ()))).await?;
        let mut restarts = 0;
        for _ in 0..6 {
            tokio::time::sleep(Duration::from_millis(700)).await;
            let Some(holder) = sender_holding(c).await? else { continue };
            let url = format!("http://{}/actors/{holder}/restart", c.pods[0].http);
            let status =
                cabine::harness::http_client().post(url).bearer_auth(cluster_support::TOKEN).send().await?.status();
            ensure!(status.is_success(), "restart {holder}: {status}");
            restarts += 1;
        }
        ensure!(restarts >= 3, "the sender holding the slot was restarted mid-send ({restarts} times)");
        c.sim.control.faults(json!({ "latency_ms": 0 })).await?;
        let s = until_count(c, "confirmed", n, Duration::from_secs(60)).await?;
        ensure!(count(&s, "confirmed") == n, "everything confirmed: {s:?}");
        let a = audit(c).await?;
        ensure!(field(&a, "max_in_flight_sends") == 1, "one send slot, one POST at a time at the SPI: {a}");
        let accepted = field(&a, "received_outbound") - field(&a, "duplicates_outbound");
        ensure!(accepted == n as u64, "every MsgId accepted by the SPI exactly once: {a}");
        Ok(())
    })
    .await;
}

/// The sender (`sender/cpm/k`) of pod 0 that holds a send lease now, if any.
async fn sender_holding(c: &LocalCluster) -> anyhow::Result<Option<String>> {
    let tree: Value = c.pod_json(0, "/actors").await?;
    let mut found = None;
    let mut stack = vec![tree];
    while let Some(node) = stack.pop() {
        let id = node["id"].as_str().unwrap_or_default().to_owned();
        if id.starts_with("sender/") && matches!(node["state"].as_str(), Some("sending" | "idle")) {
            found = Some(id);
        }
        stack.extend(node["children"].as_array().cloned().unwrap_or_default());
    }
    Ok(found)
}
