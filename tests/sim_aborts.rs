//! Requests the client abandons, against a `cabine sim` child process: like a
//! real ICOM server, the simulator keeps an aborted long-poll held (in flight,
//! counted toward the cap, still able to be handed a batch that then waits
//! unacknowledged on the stream), stores an aborted POST whose body arrived,
//! and counts two reads on one stream at once (`concurrent_reads`). The first
//! test is the loss mechanism of issue 10: the batch handed to an aborted GET
//! is acknowledged by the next holder's GET although no client ever saw it.

mod sim_support;

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use cabine::harness::{SimControl, SimProcess};
use cabine::sim::LaneAudit;
use reqwest::Method;
use serde_json::{Value, json};
use sim_support::{ISPB, msg_id, pacs008, read, send_path, start_path};

const EXE: &str = env!("CARGO_BIN_EXE_cabine");

/// A child simulator for ISPB (seed 1) with `extra` flags, and a client without a default timeout.
struct Sim {
    process: SimProcess,
    http: reqwest::Client,
}

impl Sim {
    async fn spawn(extra: &[&str]) -> Sim {
        let extra: Vec<String> = ["--seed", "1"].iter().chain(extra).map(|s| (*s).to_owned()).collect();
        let process = SimProcess::spawn(Path::new(EXE), ISPB, &extra).await.expect("cabine sim starts");
        Sim { process, http: reqwest::Client::new() }
    }

    fn control(&self) -> &SimControl {
        &self.process.control
    }

    /// An ICOM request to the primary listener (`Host` without the port), accepting multipart.
    fn icom(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let url = format!("http://{}{path}", self.process.primary);
        self.http.request(method, url).header("host", "icom").header("accept", "multipart/mixed")
    }

    async fn audit(&self) -> LaneAudit {
        self.control().audit_lane("cpm").await.expect("the audit")
    }

    /// Waits (at most 5 s) until the audit satisfies `check`; returns that audit.
    async fn audit_until(&self, what: &str, check: impl Fn(&LaneAudit) -> bool) -> LaneAudit {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let audit = self.audit().await;
            if check(&audit) {
                return audit;
            }
            assert!(Instant::now() < deadline, "never {what}: {audit:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The acknowledged ResourceIds, in ledger order.
    async fn acknowledged(&self) -> Vec<String> {
        let ledger = self.control().get(&format!("/sim/ledger?ispb={ISPB}&channel=cpm")).await.expect("ledger");
        let entries = ledger["entries"].as_array().cloned().unwrap_or_default();
        entries.iter().filter_map(|e| e["resource_id"].as_str().map(str::to_owned)).collect()
    }
}

/// Sends `req` and expects the client's own timeout to end it.
async fn abandon(req: reqwest::RequestBuilder) {
    let err = req.timeout(Duration::from_millis(300)).send().await.expect_err("the client gives up first");
    assert!(err.is_timeout(), "{err:?}");
}

#[tokio::test]
async fn an_aborted_long_poll_stays_held_takes_a_batch_and_the_next_holder_acknowledges_it() {
    let sim = Sim::spawn(&["--hold", "3s"]).await;
    let first = sim.control().inject(1, "pacs008").await.expect("inject");
    let opened = read(sim.icom(Method::GET, &start_path(ISPB))).await;
    assert_eq!(opened.ids(), first);
    let held_since = Instant::now();

    // Pod A reads on, then drains: it aborts its GET. The simulator still holds it.
    abandon(sim.icom(Method::GET, opened.pull_next())).await;
    let audit = sim.audit().await;
    assert_eq!(audit.in_flight, 1, "the aborted GET is still held: {audit:?}");
    assert_eq!(audit.acknowledged, 1, "the aborted GET acknowledged the batch before it");

    // Pod B takes the slot and GETs the pull-next it found stored: two reads on one stream.
    let b = tokio::spawn(read(sim.icom(Method::GET, opened.pull_next())));
    let audit = sim.audit_until("two reads on the stream", |a| a.concurrent_reads == 1).await;
    assert_eq!((audit.in_flight, audit.max_reads_per_stream), (2, 2), "{audit:?}");

    // Messages arrive while both are held: each is handed its own batch.
    let injected = sim.control().inject(12, "pacs008").await.expect("inject");
    let b = b.await.expect("pod B's read");
    assert!(held_since.elapsed() < Duration::from_secs(3), "answered by the arrival, not the hold");
    assert_eq!(b.status, 200);
    assert!(!b.ids().is_empty() && b.ids().len() < 12, "pod B saw one batch of two: {:?}", b.ids());
    let audit = sim.audit_until("both reads answered", |a| a.in_flight == 0).await;
    assert_eq!((audit.delivered, audit.unacknowledged), (13, 12), "both batches wait unacknowledged: {audit:?}");

    // Pod B reads on with the pull-next it got: that acknowledges everything pending on the stream,
    // the batch handed to the aborted GET included.
    sim.control().faults(json!({ "hold_ms": 0 })).await.expect("faults");
    let next = read(sim.icom(Method::GET, b.pull_next())).await;
    assert_eq!(next.status, 204);
    let acknowledged = sim.acknowledged().await;
    assert_eq!(acknowledged.len(), 13, "{acknowledged:?}");
    let seen: HashSet<String> = first.iter().cloned().chain(b.ids()).collect();
    let never_seen: Vec<&String> = injected.iter().filter(|id| !seen.contains(*id)).collect();
    assert_eq!(never_seen.len(), 12 - b.ids().len());
    for id in never_seen {
        assert!(acknowledged.contains(id), "{id}: handed to the aborted GET, acknowledged unseen");
    }
}

#[tokio::test]
async fn an_aborted_send_is_still_stored_and_in_flight_meanwhile() {
    let sim = Sim::spawn(&[]).await;
    sim.control().faults(json!({ "latency_ms": 1_000 })).await.expect("faults");
    let id = msg_id(7_001);
    let post = sim
        .icom(Method::POST, &send_path(ISPB))
        .header("content-type", "application/xml; charset=utf-8")
        .body(pacs008(&id, &["E99999010202403011200abcdefghijk"]));
    abandon(post).await;
    let audit = sim.audit().await;
    assert_eq!((audit.in_flight, audit.received_outbound), (1, 0), "still being handled: {audit:?}");

    let audit = sim.audit_until("the aborted POST answered", |a| a.in_flight == 0).await;
    assert_eq!(audit.received_outbound, 1, "stored although nobody waited for the 201: {audit:?}");
    let log: Value = sim.control().get("/sim/outbound").await.expect("outbound log");
    assert_eq!(log["entries"][0]["msg_id"], id.as_str());
    assert_eq!(log["entries"][0]["outcome"], "accepted");
}

#[tokio::test]
async fn aborted_requests_count_toward_the_in_flight_cap_until_their_hold_ends() {
    let sim = Sim::spawn(&["--hold", "1500ms", "--max-in-flight", "2"]).await;
    let began = Instant::now();
    abandon(sim.icom(Method::GET, &start_path(ISPB))).await;
    abandon(sim.icom(Method::GET, &start_path(ISPB))).await;

    let third = sim.icom(Method::GET, &start_path(ISPB)).send().await.expect("an answer");
    assert_eq!(third.status(), 429, "two aborted GETs still fill the cap of 2");
    assert!(began.elapsed() < Duration::from_millis(1_500), "refused within the hold");
    let audit = sim.audit().await;
    assert_eq!((audit.rejected_in_flight, audit.rejected_429), (1, 1), "{audit:?}");
    assert_eq!(audit.max_in_flight, 3, "{audit:?}");

    sim.audit_until("the holds ended", |a| a.in_flight == 0).await;
    assert!(began.elapsed() >= Duration::from_millis(1_400), "held for the hold: {:?}", began.elapsed());
    sim.control().faults(json!({ "hold_ms": 0 })).await.expect("faults");
    let after = sim.icom(Method::GET, &start_path(ISPB)).send().await.expect("an answer");
    assert_eq!(after.status(), 204, "room again once the holds ended");
    assert_eq!(sim.audit().await.open_streams, 3);
}

#[tokio::test]
async fn reset_answers_every_held_read_abandoned_or_not() {
    let t = sim_support::start(|c| c.hold = Duration::from_secs(10)).await;
    t.inject(1, "pacs008").await;
    let opened = read(t.open()).await;
    abandon(t.next(opened.pull_next())).await;
    let waiting = tokio::spawn(read(t.next(opened.pull_next())));
    wait_for_in_flight(&t, 2).await;

    let began = Instant::now();
    let reset = t.http.post(format!("{}/sim/reset", t.control)).send().await.expect("reset");
    assert_eq!(reset.status(), 200);
    assert_eq!(waiting.await.expect("the held read").status, 204, "answered at once");
    wait_for_in_flight(&t, 0).await;
    assert!(began.elapsed() < Duration::from_secs(2), "{:?}", began.elapsed());
    let audit = t.audit().await;
    assert_eq!((audit["concurrent_reads"].as_u64(), audit["max_reads_per_stream"].as_u64()), (Some(0), Some(0)));
}

#[tokio::test]
async fn shutdown_ends_held_and_delayed_requests_promptly() {
    let t = sim_support::start(|c| c.hold = Duration::from_secs(30)).await;
    abandon(t.open()).await;
    let held = tokio::spawn(t.open().send());
    t.faults(json!({ "latency_ms": 30_000 })).await;
    abandon(t.send_xml(pacs008(&msg_id(7_002), &[]))).await;
    wait_for_in_flight(&t, 3).await;

    let stopped = tokio::time::timeout(Duration::from_secs(3), t.sim.shutdown()).await;
    assert!(stopped.is_ok(), "shutdown waited for held requests");
    let held = held.await.expect("the held request");
    assert!(held.is_err() || held.is_ok_and(|r| r.status() == 503), "ended by the shutdown");
}

/// Waits (at most 2 s) until the in-process simulator has `n` requests in flight.
async fn wait_for_in_flight(t: &sim_support::TestSim, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while t.audit().await["in_flight"].as_u64() != Some(n) {
        assert!(Instant::now() < deadline, "never {n} requests in flight: {}", t.audit().await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
