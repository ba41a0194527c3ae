//! The send path: a row inserted while a turn runs is sent right
//! after that turn (not one `idle_poll` later), and a standby sender refused a
//! lease acquires no more often than `acquire_interval` however often woken,
//! a turn does not wait for the PubAck of its result events, and records
//! slower than POSTs run side by side with their events still in turn order.

use cabine_actors::ports::Pool;
use cabine_actors::ports::outbound::{OutboundStatus as S, Priority};
use cabine_actors::ports::outbound_bus::ResultStatus;
use tokio::time::Instant;

use super::*;

fn last_outcome(tree: &Tree, id: &str) -> String {
    find(&tree.status(), id).and_then(|n| n.details.get("last_outcome").cloned()).unwrap_or_default().to_string()
}

#[tokio::test(start_paused = true)]
async fn a_row_inserted_during_a_turn_that_finds_nothing_is_sent_without_waiting_idle_poll() {
    let world = world(1, |_| {});
    // A take answers 500 ms after claiming: a row inserted meanwhile is not in it.
    world.outbound.set_take_latency(ms(500));
    let mut o = outbound_config(1);
    // Long enough that neither a poll nor a depth probe serves the new row.
    (o.idle_poll, o.idle_release, o.status_interval) = (ms(3000), ms(20_000), ms(20_000));
    let tree = start_pod(&world, "pod-a", o).await;
    publish(&world, &["W1".into()], Priority::Normal, 60);
    all_in(&world, &["W1".into()], S::Sent, ms(5000)).await;
    eventually("a turn that finds nothing, then another in flight", ms(10_000), || {
        last_outcome(&tree, "sender/cpm/1").contains("empty") && state_of(&tree, "sender/cpm/1") == "sending"
    })
    .await;
    let published = Instant::now();
    publish(&world, &["W2".into()], Priority::Normal, 60);
    all_in(&world, &["W2".into()], S::Sent, ms(2000)).await;
    assert!(
        published.elapsed() < ms(1500),
        "served by the turn right after, not after idle_poll: {:?}",
        published.elapsed()
    );
    assert_sim_clean(&world, 1);
    tree.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_standby_sender_refused_a_lease_does_not_acquire_more_often_than_acquire_interval() {
    // One send slot, two senders: one holds it, the other is refused.
    let world = world(1, |_| {});
    let tree = start_pod(&world, "pod-a", outbound_config(2)).await;
    publish(&world, &ids("A", 5), Priority::Normal, 60);
    all_in(&world, &ids("A", 5), S::Sent, ms(5000)).await;
    let acquires = || world.leases.audit().acquires.get(&Pool::Send(CPM)).copied().unwrap_or(0);
    let before = acquires();
    // An insert every 20 ms for 3 s: 150 wakes of both senders.
    let all = ids("H", 150);
    for id in &all {
        publish(&world, std::slice::from_ref(id), Priority::Normal, 60);
        tokio::time::sleep(ms(20)).await;
    }
    let calls = acquires() - before;
    // acquire_interval 300 ms, jittered down to 150 ms at worst: ≤ 20 in 3 s.
    assert!(calls <= 22, "{calls} acquire calls in 3 s");
    all_in(&world, &all, S::Sent, ms(5000)).await;
    assert_sim_clean(&world, 1);
    tree.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_turn_does_not_wait_for_its_result_events_to_be_published() {
    let world = world(1, |s| s.outbound.send.latency = ms(200));
    world.results.set_latency(ms(200));
    let tree = start_pod(&world, "pod-a", one_per_post(outbound_config(1))).await;
    publish(&world, &["P0".into()], Priority::Normal, 60);
    all_in(&world, &["P0".into()], S::Sent, ms(5000)).await;
    let all = ids("P", 10);
    let started = Instant::now();
    publish(&world, &all, Priority::Normal, 60);
    all_in(&world, &all, S::Sent, ms(10_000)).await;
    // One POST after another (200 ms each), each publish overlapping the next POST: not 10 × 400 ms.
    assert!(started.elapsed() < ms(3000), "took {:?}", started.elapsed());
    eventually("every Sent event published", ms(2000), || {
        all.iter().all(|id| world.results.statuses(id).contains(&ResultStatus::Sent))
    })
    .await;
    assert_sim_clean(&world, 1);
    tree.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn records_slower_than_posts_run_side_by_side_and_publish_their_events_in_turn_order() {
    let world = world(1, |s| s.outbound.send.latency = ms(50));
    world.outbound.set_record_latency(ms(200));
    let tree = start_pod(&world, "pod-a", one_per_post(outbound_config(1))).await;
    publish(&world, &["R0".into()], Priority::Normal, 60);
    all_in(&world, &["R0".into()], S::Sent, ms(5000)).await;
    let all = ids("R", 20);
    let started = Instant::now();
    publish(&world, &all, Priority::Normal, 60);
    all_in(&world, &all, S::Sent, ms(10_000)).await;
    // Two records of 200 ms side by side: ~20 × 100 ms; one after the other it was 20 × 200 ms.
    assert!(started.elapsed() < ms(2800), "took {:?}", started.elapsed());
    eventually("every Sent event published", ms(2000), || {
        all.iter().all(|id| world.results.statuses(id).contains(&ResultStatus::Sent))
    })
    .await;
    let posted: Vec<String> = world.icom_out.log().into_iter().flat_map(|r| r.msg_ids).collect();
    assert_eq!(world.results.published_order(ResultStatus::Sent), posted, "events in the order of the POSTs");
    assert_sim_clean(&world, 1);
    tree.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn full_batches_are_posted_back_to_back_with_the_next_prepared_and_the_last_recorded_meanwhile() {
    // One after the other a turn takes 290 ms: take 40, arm 50, POST 100, record 100.
    let world = world(1, |s| s.outbound.send.latency = ms(100));
    world.outbound.set_take_latency(ms(40));
    world.outbound.set_record_latency(ms(100));
    world.gates.set_arm_latency(ms(50));
    let tree = start_pod(&world, "pod-a", outbound_config(1)).await;
    publish(&world, &["F0".into()], Priority::Normal, 60);
    all_in(&world, &["F0".into()], S::Sent, ms(5000)).await;
    let all = ids("F", 100);
    let started = Instant::now();
    publish(&world, &all, Priority::Normal, 60);
    all_in(&world, &all, S::Sent, ms(10_000)).await;
    // Pipelined: ten POSTs of 100 ms back to back (plus the first take and arm, the last record), not
    // 10 × 290 ms; the next batch's take and gate write ride along each POST.
    // (With the gate armed between the POSTs instead of during them: 10 × 150 ms.)
    assert!(started.elapsed() < ms(1300), "took {:?}", started.elapsed());
    let audit = world.icom_out.audit(CPM);
    assert_eq!((audit.stored, audit.max_in_flight), (101, 1), "{audit:?}");
    assert_sim_clean(&world, 1);
    tree.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_batch_prepared_during_the_last_post_goes_back_to_the_queue_when_the_sender_drains() {
    let world = world(1, |s| s.outbound.send.latency = ms(400));
    let tree = start_pod(&world, "pod-a", outbound_config(1)).await;
    let all = ids("D", 30);
    publish(&world, &all, Priority::Normal, 60);
    eventually("the first POST in flight, the next batch prepared", ms(5000), || {
        world.icom_out.audit(CPM).max_in_flight == 1 && world.outbound.count(S::Sending) == 20
    })
    .await;
    let report = tree.drain().await;
    assert_eq!(report.senders_released, 1, "{report:?}");
    assert_eq!(world.outbound.count(S::Sending), 0, "no row left claimed by a prepared batch");
    assert_eq!(world.outbound.count(S::Sent), 10, "the POST in flight was finished and recorded");
    assert_eq!(world.outbound.count(S::Queued), 20, "the prepared batch went back unsent, not as an attempt");
    assert!(all.iter().all(|id| world.icom_out.stored(id) <= 1));

    let b = start_pod(&world, "pod-b", outbound_config(1)).await;
    all_in(&world, &all, S::Sent, ms(10_000)).await;
    assert_sim_clean(&world, 1);
    assert_eq!(world.icom_out.audit(CPM).stored, 30);
    b.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_sender_restarted_between_prepare_and_post_loses_nothing_and_never_doubles_the_prepared_batch() {
    let world = world(1, |s| s.outbound.send.latency = ms(400));
    let tree = start_pod(&world, "pod-a", outbound_config(1)).await;
    let all = ids("K", 30);
    publish(&world, &all, Priority::Normal, 120);
    eventually("a POST in flight, the next batch prepared", ms(5000), || {
        world.icom_out.audit(CPM).max_in_flight == 1 && world.outbound.count(S::Sending) == 20
    })
    .await;
    // The restart aborts the POST in flight and drops the prepared batch (claimed, never posted).
    tree.restart("sender/cpm/1").await.expect("restart");
    // The janitor recovers both claims (processing_timeout) as possible attempts; everything goes out.
    all_in(&world, &all, S::Sent, ms(30_000)).await;
    let first_post: Vec<String> = world.icom_out.log().first().map(|r| r.msg_ids.clone()).unwrap_or_default();
    assert_eq!(first_post.len(), 10);
    for id in all.iter().filter(|id| !first_post.contains(id)) {
        assert_eq!(world.icom_out.stored(id), 1, "{id}: a prepared row is posted once, after its claim is recovered");
    }
    let audit = world.icom_out.audit(CPM);
    assert_eq!((audit.max_in_flight, audit.over_cap, audit.without_lease), (1, 0, 0), "{audit:?}");
    tree.shutdown().await;
}
