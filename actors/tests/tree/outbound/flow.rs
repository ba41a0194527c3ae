//! The outbound flow: exactly once across pods within the send pool, the same
//! MsgId published twice, unreadable requests, priority with a backlog,
//! back-pressure, confirmation by the SPI, restart by id.

use cabine_actors::RestartError;
use cabine_actors::ports::Pool;
use cabine_actors::ports::outbound::{InvalidOutbound, OutboundStatus as S, Priority};
use cabine_actors::ports::outbound_bus::{OutboundRequest, ResultStatus};
use cabine_actors::testkit::status_report;

use super::*;

#[tokio::test(start_paused = true)]
async fn every_msg_id_is_sent_exactly_once_by_three_pods_within_the_send_pool() {
    let world = world(2, |_| {});
    let pods: Vec<Tree> = futures_join(&world, &["pod-a", "pod-b", "pod-c"], 2).await;
    let sent = ids("M", 300);
    publish(&world, &sent, Priority::Normal, 120);
    all_in(&world, &sent, S::Sent, ms(20_000)).await;
    assert_sim_clean(&world, 2);
    let a = world.icom_out.audit(CPM);
    assert_eq!(a.stored, 300);
    assert_eq!(a.max_in_flight, 2, "the whole send pool was used: {a:?}");
    assert_eq!((world.results.count(ResultStatus::Accepted), world.results.count(ResultStatus::Sent)), (300, 300));
    assert_eq!(world.ingress.pending(), 0, "every request acknowledged");
    let pulled: u64 = pods.iter().map(|p| detail(p, "outbound-dispatcher", "inserted")).sum();
    assert_eq!(pulled, 300);
    let hints = world.hints.sent();
    assert!(
        !hints.is_empty() && hints.len() < 300 && hints.iter().all(|c| *c == CPM),
        "the other pods hinted once per round with new rows, not once per row: {} hints",
        hints.len()
    );
    eventually("idle senders give their leases back", ms(3000), || {
        (1..=2).all(|n| world.leases.holder_pod(Pool::Send(CPM), n).is_none())
    })
    .await;
    for pod in &pods {
        pod.shutdown().await;
    }
}

async fn futures_join(world: &FakeWorld, names: &[&str], senders: u8) -> Vec<Tree> {
    let mut pods = Vec::new();
    for name in names {
        pods.push(start_pod(world, name, outbound_config(senders)).await);
    }
    pods
}

#[tokio::test(start_paused = true)]
async fn the_same_msg_id_published_twice_is_sent_once_and_an_unreadable_request_is_kept() {
    let world = world(2, |_| {});
    let tree = start_pod(&world, "pod-a", outbound_config(2)).await;
    publish(&world, &["M1".into(), "M2".into()], Priority::Normal, 60);
    publish(&world, &["M1".into()], Priority::High, 60);
    let invalid = InvalidOutbound {
        ingress_ref: None,
        channel: Some(CPM),
        claimed_msg_id: None,
        reason: "no MsgId".into(),
        raw: "<Envelope/>".into(),
    };
    world.ingress.publish(OutboundRequest::Invalid(invalid));
    all_in(&world, &["M1".into(), "M2".into()], S::Sent, ms(5000)).await;
    tokio::time::sleep(ms(1000)).await;
    assert_eq!(world.icom_out.stored("M1"), 1);
    assert_eq!(world.results.statuses("M1"), vec![ResultStatus::Accepted, ResultStatus::Sent]);
    assert_eq!(detail(&tree, "outbound-dispatcher", "duplicates"), 1);
    assert_eq!(detail(&tree, "outbound-dispatcher", "invalid"), 1);
    assert_eq!(world.outbound.count(S::RejectedInvalid), 1);
    assert_eq!(world.results.count(ResultStatus::RejectedInvalid), 1);
    assert_eq!(world.ingress.pending(), 0);
    assert_sim_clean(&world, 2);
    tree.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn critical_rows_are_sent_before_normal_ones_with_a_backlog() {
    let world = world(1, |_| {});
    // Someone else holds the only send slot while the backlog builds up.
    world.leases.steal(Pool::Send(CPM), 1);
    let tree = start_pod(&world, "pod-a", outbound_config(1)).await;
    let normal = ids("N", 30);
    let critical = ids("C", 5);
    publish(&world, &normal, Priority::Normal, 60);
    publish(&world, &critical, Priority::Critical, 60);
    eventually("backlog stored", ms(2000), || world.outbound.count(S::Queued) == 35).await;
    all_in(&world, &normal, S::Sent, ms(10_000)).await;
    let order: Vec<String> = world.icom_out.log().into_iter().flat_map(|r| r.msg_ids).collect();
    let first_normal = order.iter().position(|m| m.starts_with('N')).unwrap();
    let last_critical = order.iter().rposition(|m| m.starts_with('C')).unwrap();
    assert!(last_critical < first_normal, "critical first: {order:?}");
    assert_sim_clean(&world, 1);
    tree.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn back_pressure_stops_pulling_above_max_queued_and_resumes_when_the_queue_drains() {
    let world = world(1, |_| {});
    let mut o = outbound_config(1);
    (o.max_queued, o.pull_batch) = (20, 10);
    world.bucket.set_down(true);
    let tree = start_pod(&world, "pod-a", o).await;
    let all = ids("B", 100);
    publish(&world, &all, Priority::Normal, 120);
    eventually("back-pressure on", ms(5000), || state_of(&tree, "outbound-dispatcher") == "backpressure").await;
    tokio::time::sleep(ms(1000)).await;
    let stored = world.outbound.rows().len();
    assert!((20..=30).contains(&stored), "stops within one pull of max_queued: {stored}");
    assert!(world.ingress.pending() >= 70, "the rest waits on the bus");
    let node = find(&tree.status(), "outbound-dispatcher").unwrap().clone();
    assert_eq!(node.details["backpressure"], true);
    assert!(node.details["queue_depth"]["cpm"]["normal"].as_u64().unwrap() >= 20);
    assert_eq!(world.icom_out.audit(CPM).posts, 0, "no tokens, no send (fail closed)");
    world.bucket.set_down(false);
    all_in(&world, &all, S::Sent, ms(20_000)).await;
    assert_eq!(detail(&tree, "outbound-dispatcher", "inserted"), 100);
    assert_sim_clean(&world, 1);
    tree.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn spi_verdicts_on_the_inbound_stream_confirm_or_reject_sent_rows_durably() {
    let world = world(1, |_| {});
    let tree = start_pod(&world, "pod-a", outbound_config(1)).await;
    publish(&world, &["K1".into(), "K2".into(), "K3".into()], Priority::Normal, 60);
    all_in(&world, &["K1".into(), "K2".into(), "K3".into()], S::Sent, ms(5000)).await;
    eventually("slot polling", ms(3000), || state_of(&tree, "slot/cpm/1") == "polling").await;
    world.icom.inject(CPM, [status_report("r1", "EK1", true), status_report("r2", "EK2", false)]);
    eventually("K1 confirmed", ms(3000), || status(&world, "K1") == Some(S::Confirmed)).await;
    assert_eq!(status(&world, "K2"), Some(S::RejectedBySpi));
    assert_eq!(world.results.statuses("K1"), vec![ResultStatus::Accepted, ResultStatus::Sent, ResultStatus::Confirmed]);
    assert_eq!(world.results.count(ResultStatus::RejectedBySpi), 1);

    // Committed while the confirmations store is down: applied later by the periodic pass.
    world.confirmations.set_down(true);
    world.icom.inject(CPM, [status_report("r3", "EK3", true)]);
    eventually("report committed", ms(3000), || world.inbox.rows().len() == 3).await;
    tokio::time::sleep(ms(300)).await;
    assert_eq!(status(&world, "K3"), Some(S::Sent));
    world.confirmations.set_down(false);
    eventually("K3 confirmed by the periodic pass", ms(2000), || status(&world, "K3") == Some(S::Confirmed)).await;
    assert_eq!(detail(&tree, "confirmer", "confirmed"), 2);
    assert_eq!(detail(&tree, "confirmer", "rejected_by_spi"), 1);
    tree.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn restart_by_id_restarts_only_that_outbound_actor_and_the_flow_goes_on() {
    let world = world(2, |_| {});
    let tree = start_pod(&world, "pod-a", outbound_config(2)).await;
    eventually("leader elected", ms(3000), || state_of(&tree, "leader") == "leading").await;
    for id in ["sender/cpm/1", "outbound-dispatcher", "confirmer", "senders/cpm", "outbound-janitor"] {
        tree.restart(id).await.unwrap_or_else(|e| panic!("{id}: {e}"));
        eventually(id, ms(3000), || find(&tree.status(), id).is_some_and(|n| n.restarts >= 1)).await;
    }
    let status = tree.status();
    assert_eq!(find(&status, "sender/cpm/1").unwrap().restarts, 1);
    assert_eq!(
        find(&status, "sender/cpm/2").unwrap().restarts,
        0,
        "its supervisor's restart is counted on the supervisor"
    );
    assert_eq!(find(&status, "senders/cpm").unwrap().restarts, 1);
    assert_eq!(find(&status, "slot/cpm/1").unwrap().restarts, 0);
    assert_eq!(tree.restart("sender/cpm/3").await, Err(RestartError::UnknownActor("sender/cpm/3".into())));
    assert_eq!(tree.restart("sender/csm/1").await, Err(RestartError::UnknownActor("sender/csm/1".into())));
    let all = ids("R", 20);
    publish(&world, &all, Priority::Normal, 60);
    all_in(&world, &all, S::Sent, ms(5000)).await;
    let node = find(&tree.status(), "senders/cpm").unwrap().clone();
    assert_eq!(node.details["breaker"]["state"], "closed");
    assert!(node.details["bucket"]["tokens_milli"].as_u64().is_some());
    assert_sim_clean(&world, 2);
    tree.shutdown().await;
}
