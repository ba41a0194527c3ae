//! The durable request gate and partial-amnesia detection (DESIGN §2.5, §3)
//! against the fakes, whose ICOM server, like a real one, serves a request to
//! its end after its client went away: Redis forgetting lease keys (eviction,
//! a rollback to an older snapshot) and rolling deploys aborting GETs and
//! POSTs never lead to two requests on one stream, a request over the cap, or
//! an acknowledgement of a batch that was not committed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cabine_actors::Tree;
use cabine_actors::domain::ChannelId;
use cabine_actors::ports::outbound::{OutboundStatus, Priority};
use cabine_actors::ports::{CloseOutcome, IcomConnector, IcomStream, PollOutcome};
use tokio::time::Instant;

use crate::common::*;
use crate::outbound::{ids, one_per_post, outbound_config, publish, start_pod, status, world};

#[tokio::test(start_paused = true)]
async fn evicted_lease_keys_are_caught_by_the_heartbeat_and_the_gate_keeps_every_stream_single() {
    let world = world_with_slots(4);
    let (a, b) = (start(&world, "pod-a", 4).await, start(&world, "pod-b", 4).await);
    let trickle = trickle(&world, "ev");
    eventually("slots shared", ms(8000), || world.leases.held_by(CPM, "pod-a").len() == 2).await;
    for _ in 0..2 {
        tokio::time::sleep(ms(1500)).await;
        // Every key with a TTL is gone; the epoch survives: holders go on believing they hold.
        world.leases.evict_ttl_keys();
        tokio::time::sleep(ms(3000)).await;
    }
    trickle.abort();
    assert!(!world.leases.audit().amnesia_reports.is_empty(), "a renewal saw its key gone: partial amnesia");
    assert!(detail(&a, "lease-heartbeat", "partial_amnesia") + detail(&b, "lease-heartbeat", "partial_amnesia") >= 1);
    assert_all_delivered_once(&world, ms(30_000)).await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_lease_store_rolled_back_to_a_snapshot_older_than_every_grant_grants_nothing_unsafe() {
    let world = world_with_slots(4);
    // A replica that lagged from the start (or an old backup): no grant in it.
    let snapshot = world.leases.snapshot();
    let (a, b) = (start(&world, "pod-a", 4).await, start(&world, "pod-b", 4).await);
    let trickle = trickle(&world, "rb");
    eventually("slots shared", ms(8000), || world.leases.held_by(CPM, "pod-b").len() == 2).await;
    for _ in 0..2 {
        tokio::time::sleep(ms(1700)).await;
        world.leases.restore(&snapshot);
        tokio::time::sleep(ms(3500)).await;
    }
    trickle.abort();
    assert!(!world.leases.audit().amnesia_reports.is_empty(), "a renewal saw its key gone");
    assert_all_delivered_once(&world, ms(30_000)).await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_get_aborted_by_a_drain_is_waited_out_by_the_next_holder() {
    let world = world_with_slots(1);
    let a = start(&world, "pod-a", 1).await;
    eventually("pod-a polls", ms(5000), || world.leases.held_by(CPM, "pod-a") == vec![1]).await;
    inject(&world, "first", 2);
    eventually("first batch acknowledged", ms(5000), || world.icom.audit(CPM).acked == 2).await;
    let b = start(&world, "pod-b", 1).await;
    tokio::time::sleep(ms(300)).await;
    // pod-a's GET is held by the server (nothing to deliver): its drain aborts it...
    let drained_at = Instant::now();
    a.shutdown().await;
    // ...but the server still holds it, and hands it what arrives meanwhile.
    inject(&world, "during", 3);
    eventually("pod-b holds the slot", ms(5000), || world.leases.held_by(CPM, "pod-b") == vec![1]).await;
    let first_b = world.icom.log().into_iter().filter(|r| r.at > drained_at).min_by_key(|r| r.at).map(|r| r.at);
    assert_all_delivered_once(&world, ms(10_000)).await;
    let first_b = first_b.or_else(|| world.icom.log().into_iter().filter(|r| r.at > drained_at).map(|r| r.at).min());
    let waited = first_b.map(|at| at - drained_at).unwrap_or_default();
    assert!(waited >= ms(1000), "the next holder's first request waited out busy_until: {waited:?}");
    b.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_post_aborted_by_a_sender_restart_is_waited_out_by_the_next_holder() {
    let world = world(1, |s| s.outbound.send.latency = ms(400));
    let pod = start_pod(&world, "pod-a", one_per_post(outbound_config(1))).await;
    let msgs = ids("ab", 6);
    publish(&world, &msgs, Priority::Normal, 60);
    eventually("a POST in flight", ms(5000), || world.icom_out.audit(CPM).posts >= 2).await;
    tokio::time::sleep(ms(100)).await;
    // The restart aborts the POST in flight; the server still handles it to its end.
    pod.restart("sender/cpm/1").await.expect("restart");
    let sent = |m: &String| matches!(status(&world, m), Some(OutboundStatus::Sent | OutboundStatus::Confirmed));
    eventually("every row sent", ms(30_000), || msgs.iter().all(sent)).await;
    let audit = world.icom_out.audit(CPM);
    assert_eq!(audit.max_in_flight, 1, "one send slot, one POST in flight at a time: {audit:?}");
    assert_eq!((audit.over_cap, audit.without_lease), (0, 0), "{audit:?}");
    pod.shutdown().await;
}

/// A connector whose streams panic on their first GET.
struct PanickingIcom {
    inner: Arc<dyn IcomConnector>,
    armed: Arc<AtomicBool>,
}

struct PanickingStream {
    inner: Box<dyn IcomStream>,
    armed: Arc<AtomicBool>,
}

impl IcomConnector for PanickingIcom {
    fn stream(&self, channel: ChannelId) -> Box<dyn IcomStream> {
        Box::new(PanickingStream { inner: self.inner.stream(channel), armed: self.armed.clone() })
    }
}

#[async_trait::async_trait]
impl IcomStream for PanickingStream {
    async fn start(&mut self) -> PollOutcome {
        self.inner.start().await
    }
    async fn next(&mut self, pull_next: &str) -> PollOutcome {
        assert!(!self.armed.swap(false, Ordering::SeqCst), "a bug in the poll cycle");
        self.inner.next(pull_next).await
    }
    async fn close(&mut self, pull_next: &str) -> CloseOutcome {
        self.inner.close(pull_next).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_panicking_poll_cycle_fails_its_slot_which_is_restarted_with_its_lease_released() {
    let world = world_with_slots(1);
    let armed = Arc::new(AtomicBool::new(true));
    let mut ports = world.ports("pod-a");
    ports.icom = Arc::new(PanickingIcom { inner: ports.icom, armed: armed.clone() });
    let tree = Tree::start(config("pod-a", 1), ports).await.expect("tree starts");
    inject(&world, "p", 3);
    let restarted = || find(&tree.status(), "slot/cpm/1").is_some_and(|n| n.restarts >= 1);
    eventually("the slot failed and was restarted", ms(10_000), restarted).await;
    assert!(!armed.load(Ordering::SeqCst), "the cycle panicked");
    let released = world.leases.audit().releases.get("cpm:stream/1").copied().unwrap_or(0);
    assert!(released >= 1, "the supervisor released its lease");
    assert_all_delivered_once(&world, ms(20_000)).await;
    tree.shutdown().await;
}
