//! The outbound actors against the fakes: dispatcher, senders, confirmer and
//! janitor on several pods sharing one fake world, paused clock.

mod breaker;
mod flow;
mod leases;
mod poison;
mod realtime;
mod send_path;

use std::time::{Duration, SystemTime};

use cabine_actors::domain::PoolSize;
use cabine_actors::ports::outbound::{BatchSize, OutboundStatus, Priority};
use cabine_actors::ports::outbound_bus::OutboundRequest;
use cabine_actors::testkit::{FakeSettings, FakeWorld, outbound};
use cabine_actors::{OutboundConfig, Tree, TreeConfig};

use crate::common::*;

/// The shared fixture's world with `send_slots` send slots and one stream slot.
pub fn world(send_slots: u8, tune: impl FnOnce(&mut FakeSettings)) -> FakeWorld {
    let mut s = settings();
    s.lease.send_slots = send_slots;
    s.lease.stream_slots = 1;
    tune(&mut s);
    FakeWorld::new(s)
}

/// Short outbound timings: send timeout 500 ms, idle release 500 ms.
pub fn outbound_config(senders: u8) -> OutboundConfig {
    let mut o = OutboundConfig::new(PoolSize::try_from(u64::from(senders)).unwrap());
    o.pull_batch = 50;
    o.pull_wait = ms(200);
    o.max_queued = 10_000;
    o.status_interval = ms(200);
    o.send_timeout = ms(500);
    o.slow_call = ms(400);
    o.idle_release = ms(500);
    o.idle_poll = ms(50);
    o.bucket_wait_max = ms(200);
    o.retry_after_default = ms(300);
    o.record_patience = ms(3000);
    o.janitor_interval = ms(300);
    o.confirm_interval = ms(500);
    o
}

pub fn tree_config(pod: &str, outbound: OutboundConfig) -> TreeConfig {
    TreeConfig { outbound: Some(outbound), ..config(pod, 1) }
}

pub async fn start_pod(world: &FakeWorld, pod: &str, outbound: OutboundConfig) -> Tree {
    Tree::start(tree_config(pod, outbound), world.ports(pod)).await.expect("tree starts")
}

/// One message per POST: counts of POSTs equal counts of attempts.
pub fn one_per_post(mut o: OutboundConfig) -> OutboundConfig {
    o.batch_size = BatchSize::new(1).unwrap();
    o
}

pub fn in_secs(world: &FakeWorld, secs: u64) -> SystemTime {
    world.outbound.now() + Duration::from_secs(secs)
}

/// Publishes `ids` on the bus with `priority`, due in `secs`.
pub fn publish(world: &FakeWorld, ids: &[String], priority: Priority, secs: u64) {
    for id in ids {
        world.ingress.publish(OutboundRequest::Valid(outbound(id, CPM, priority, in_secs(world, secs))));
    }
}

pub fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i:04}")).collect()
}

pub fn status(world: &FakeWorld, id: &str) -> Option<OutboundStatus> {
    world.outbound.status_of(id)
}

pub async fn all_in(world: &FakeWorld, ids: &[String], want: OutboundStatus, within: Duration) {
    let what = format!("{} rows {want}", ids.len());
    eventually(&what, within, || ids.iter().all(|id| status(world, id) == Some(want))).await;
}

/// Nothing sent twice, nothing without a lease, never over the cap of `pool`.
pub fn assert_sim_clean(world: &FakeWorld, pool: usize) {
    let a = world.icom_out.audit(CPM);
    assert_eq!(a.duplicates, 0, "a MsgId stored twice: {a:?}");
    assert_eq!(a.without_lease, 0, "a POST without a valid send lease: {a:?}");
    assert_eq!(a.over_cap, 0, "429 for concurrency: {a:?}");
    assert!(a.max_in_flight <= pool, "more concurrent sends than the send pool: {a:?}");
}
