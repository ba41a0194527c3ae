//! The outbound flow on a multi-threaded runtime in real time (short
//! timings): no paused clock hides a race between senders, tasks and fakes.

use cabine_actors::TreeExit;
use cabine_actors::ports::outbound::{OutboundStatus as S, Priority};

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pods_send_each_message_once_and_drain_in_real_time() {
    let world = world(2, |s| {
        s.lease.lease = ms(600);
        s.lease.lock_delay = ms(250);
        s.lease.drift_margin = ms(20);
        s.outbound.send.latency = ms(3);
        s.pod_ttl = ms(300);
    });
    let fast = |pod: &str| {
        let mut o = outbound_config(2);
        (o.send_timeout, o.idle_release, o.idle_poll, o.status_interval) = (ms(200), ms(200), ms(20), ms(50));
        let mut c = tree_config(pod, o);
        let t = &mut c.timing;
        (t.heartbeat, t.long_poll_timeout, t.request_margin, t.acquire_interval) = (ms(100), ms(250), ms(10), ms(50));
        t.gate_margin = ms(50);
        (t.empty_poll_floor, t.drain_time, t.stop_timeout) = (ms(50), ms(1500), ms(3000));
        c
    };
    let a = Tree::start(fast("pod-a"), world.ports("pod-a")).await.unwrap();
    let b = Tree::start(fast("pod-b"), world.ports("pod-b")).await.unwrap();
    let all = ids("RT", 400);
    publish(&world, &all, Priority::Normal, 60);
    all_in(&world, &all, S::Sent, ms(15_000)).await;
    assert_sim_clean(&world, 2);
    assert_eq!(world.icom_out.audit(CPM).stored, 400);
    let inserted = |t: &Tree| detail(t, "outbound-dispatcher", "inserted");
    assert_eq!(inserted(&a) + inserted(&b), 400, "the pods shared the consumer, each request stored once");
    for pod in [&a, &b] {
        let report = pod.drain().await;
        assert_eq!((report.senders_unanswered, report.forced), (0, 0), "{report:?}");
        assert_eq!(pod.wait().await, TreeExit::Normal);
    }
}
