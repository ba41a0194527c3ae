//! Send leases: a lease lost during a POST (its outcome still recorded, no
//! send without a lease afterwards), a lease store that is down (nothing
//! sent), and the drain (stop pulling, finish the send in flight, release).

use cabine_actors::TreeExit;
use cabine_actors::ports::Pool;
use cabine_actors::ports::outbound::{OutboundStatus as S, Priority};
use cabine_actors::ports::outbound_bus::ResultStatus;
use tokio::time::Instant;

use super::*;

#[tokio::test(start_paused = true)]
async fn a_lease_lost_mid_batch_still_records_the_send_and_nothing_is_sent_without_a_lease() {
    // The POST outlasts a heartbeat: the loss is noticed while it is in flight.
    let world = world(1, |s| s.outbound.send.latency = ms(900));
    let mut o = outbound_config(1);
    o.send_timeout = ms(1000);
    let tree = start_pod(&world, "pod-a", o).await;
    publish(&world, &["S1".into()], Priority::Normal, 60);
    eventually("a POST in flight", ms(3000), || world.icom_out.audit(CPM).posts == 1).await;
    let stolen_at = Instant::now();
    world.leases.steal(Pool::Send(CPM), 1);
    eventually("sender lost its lease", ms(2000), || state_of(&tree, "sender/cpm/1") == "standby").await;
    assert_eq!(status(&world, "S1"), Some(S::Sent), "the POST that started inside the lease was recorded");
    assert_eq!(world.results.statuses("S1"), vec![ResultStatus::Accepted, ResultStatus::Sent]);
    let node = find(&tree.status(), "sender/cpm/1").unwrap().clone();
    assert!(node.last_error.unwrap_or_default().contains("lease lost"));
    assert!(!node.details.contains_key("lease_remaining_ms"));

    publish(&world, &["S2".into()], Priority::Normal, 60);
    // The intruder's key lives lease + lock_delay (3.2 s): no POST meanwhile.
    tokio::time::sleep_until(stolen_at + ms(3000)).await;
    assert_eq!(world.icom_out.audit(CPM).posts, 1, "no send without a lease");
    assert_eq!(status(&world, "S2"), Some(S::Queued));
    all_in(&world, &["S2".into()], S::Sent, ms(5000)).await;
    assert_sim_clean(&world, 1);
    tree.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn nothing_is_sent_while_the_lease_store_is_down() {
    let world = world(2, |_| {});
    world.leases.set_unavailable(true);
    let tree = start_pod(&world, "pod-a", outbound_config(2)).await;
    let all = ids("D", 10);
    publish(&world, &all, Priority::Normal, 60);
    eventually("stored", ms(3000), || world.outbound.count(S::Queued) == 10).await;
    tokio::time::sleep(ms(2000)).await;
    assert_eq!(world.icom_out.audit(CPM).posts, 0, "fail closed: no lease, no request");
    world.leases.set_unavailable(false);
    all_in(&world, &all, S::Sent, ms(10_000)).await;
    assert_sim_clean(&world, 2);
    tree.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn drain_stops_pulling_finishes_the_send_in_flight_and_releases_every_send_lease() {
    let world = world(2, |s| s.outbound.send.latency = ms(300));
    let mut o = outbound_config(2);
    o.pull_batch = 10;
    let a = start_pod(&world, "pod-a", o.clone()).await;
    let all = ids("Q", 200);
    publish(&world, &all, Priority::Normal, 120);
    eventually("two POSTs in flight", ms(5000), || world.icom_out.audit(CPM).max_in_flight == 2).await;
    let report = a.drain().await;
    assert!(report.dispatcher_stopped, "{report:?}");
    assert_eq!((report.senders_released, report.senders_unanswered, report.forced), (2, 0, 0), "{report:?}");
    assert!(report.sends_finished >= 1, "{report:?}");
    assert_eq!(a.wait().await, TreeExit::Normal);
    assert_eq!(world.outbound.count(S::Sending), 0, "the sends in flight were recorded");
    assert!((1..=2).all(|n| world.leases.holder_pod(Pool::Send(CPM), n).is_none()), "send leases released");
    let sent = world.outbound.count(S::Sent);
    assert!(sent > 0 && sent < 200, "drained mid-way: {sent}");
    let late = ids("Z", 20);
    publish(&world, &late, Priority::Normal, 120);
    tokio::time::sleep(ms(500)).await;
    assert_eq!(world.ingress.pending(), 20, "a drained pod pulls nothing");

    let b = start_pod(&world, "pod-b", o).await;
    all_in(&world, &all, S::Sent, ms(20_000)).await;
    all_in(&world, &late, S::Sent, ms(5_000)).await;
    assert_sim_clean(&world, 2);
    assert_eq!(world.icom_out.audit(CPM).stored, 220);
    b.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn requests_are_acknowledged_only_once_stored_and_come_back_once_the_store_is_back() {
    let world = world(1, |_| {});
    let tree = start_pod(&world, "pod-a", outbound_config(1)).await;
    eventually("dispatcher pulling", ms(2000), || state_of(&tree, "outbound-dispatcher") == "pulling").await;
    world.outbound.set_unavailable(true);
    let all = ids("W", 10);
    publish(&world, &all, Priority::Normal, 60);
    eventually("the store's refusal reported", ms(3000), || {
        find(&tree.status(), "outbound-dispatcher")
            .and_then(|n| n.last_error.clone())
            .is_some_and(|e| e.contains("storing"))
    })
    .await;
    tokio::time::sleep(ms(3000)).await;
    assert_eq!(world.ingress.pending(), 10, "nothing acknowledged while nothing is stored");
    assert_eq!(world.ingress.audit().redelivered, 0, "no pull while the store is down: no delivery spent");
    world.outbound.set_unavailable(false);
    all_in(&world, &all, S::Sent, ms(10_000)).await;
    assert!(world.ingress.audit().redelivered > 0, "unacknowledged requests came back");
    assert_eq!((world.ingress.pending(), world.outbound.rows().len()), (0, 10));
    assert_sim_clean(&world, 1);
    tree.shutdown().await;
}
