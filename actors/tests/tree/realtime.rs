//! The same pipeline on a multi-threaded runtime in real time (short
//! timings): no paused clock hides a race between actors, tasks and fakes.

use cabine_actors::testkit::{FakeSettings, FakeWorld};
use cabine_actors::{Tree, TreeConfig, TreeExit};

use crate::common::*;

fn fast_settings() -> FakeSettings {
    let mut s = settings();
    s.lease.lease = ms(600);
    s.lease.lock_delay = ms(250);
    s.lease.drift_margin = ms(20);
    s.icom.hold = ms(200);
    s.pod_ttl = ms(300);
    s
}

fn fast_config(pod: &str) -> TreeConfig {
    let mut c = config(pod, 4);
    let t = &mut c.timing;
    (t.heartbeat, t.long_poll_timeout, t.request_margin, t.acquire_interval) = (ms(100), ms(250), ms(10), ms(50));
    t.gate_margin = ms(50);
    (t.empty_poll_floor, t.drain_time, t.stop_timeout) = (ms(50), ms(1500), ms(3000));
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pods_share_deliver_and_drain_in_real_time() {
    let world = FakeWorld::new(fast_settings());
    let a = Tree::start(fast_config("pod-a"), world.ports("pod-a")).await.unwrap();
    let b = Tree::start(fast_config("pod-b"), world.ports("pod-b")).await.unwrap();
    let held = |pod: &str| world.leases.held_by(CPM, pod).len();
    eventually("two pods hold two each", ms(5000), || held("pod-a") == 2 && held("pod-b") == 2).await;
    let feed = trickle(&world, "rt");
    tokio::time::sleep(ms(500)).await;
    let report = a.drain().await;
    assert_eq!((report.handed_over, report.closed, report.unanswered), (2, 0, 0), "{report:?}");
    assert_eq!(a.wait().await, TreeExit::Normal);
    eventually("pod-b holds all four", ms(3000), || held("pod-b") == 4).await;
    tokio::time::sleep(ms(300)).await;
    feed.abort();
    assert_all_delivered_once(&world, ms(5000)).await;
    assert_eq!(world.icom.audit(CPM).streams_started, 4);
    let report = b.drain().await;
    assert_eq!(report.closed, 4, "{report:?}");
    assert_eq!(world.icom.audit(CPM).open_streams, 0);
}
