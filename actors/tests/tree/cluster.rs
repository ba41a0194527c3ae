//! Several pods sharing one fake world: fair share, a dead pod's slots,
//! lease-store amnesia, drain, the leader's sweeper.

use cabine_actors::TreeExit;
use cabine_actors::ports::Pool;

use crate::common::*;

#[tokio::test(start_paused = true)]
async fn fair_share_converges_with_one_two_three_pods_and_a_dead_pods_slots_resume_their_streams() {
    let world = world_with_slots(4);
    let feed = trickle(&world, "f");
    let held = |pod: &str| world.leases.held_by(CPM, pod).len();
    let grants = || world.leases.audit().grants;
    let a = start(&world, "pod-a", 4).await;
    eventually("one pod holds all four", ms(5000), || held("pod-a") == 4).await;
    let before = grants();
    let b = start(&world, "pod-b", 4).await;
    eventually("two pods hold two each", ms(8000), || held("pod-a") == 2 && held("pod-b") == 2).await;
    settled(&world, &["pod-a", "pod-b"], [2, 2].as_slice()).await;
    assert_eq!(grants() - before, 2, "exactly the two extras moved, no churn");
    let before = grants();
    let c = start(&world, "pod-c", 4).await;
    eventually("three pods share 2/1/1", ms(8000), || (held("pod-a"), held("pod-b"), held("pod-c")) == (2, 1, 1)).await;
    settled(&world, &["pod-a", "pod-b", "pod-c"], [2, 1, 1].as_slice()).await;
    assert_eq!(grants() - before, 1, "exactly one slot moved to the newcomer");
    assert_eq!(world.icom.audit(CPM).streams_started, 4, "handovers resumed the same streams");

    let b_slots = world.leases.held_by(CPM, "pod-b");
    let before = grants();
    b.kill();
    let killed_at = tokio::time::Instant::now();
    eventually("a and c hold everything", ms(10_000), || held("pod-a") + held("pod-c") == 4).await;
    let took = killed_at.elapsed();
    // lease + lock_delay + one heartbeat (view) + one acquire interval (jittered ≤ 1.5×).
    assert!(took <= ms(2000 + 1200 + 500 + 450 + 100), "takeover took {took:?}");
    settled(&world, &["pod-a", "pod-c"], [2, 2].as_slice()).await;
    assert_eq!(grants() - before, b_slots.len() as u64, "only the dead pod's slots moved");
    feed.abort();
    assert_all_delivered_once(&world, ms(15_000)).await;
    assert_eq!(world.icom.audit(CPM).streams_started, 4, "the dead pod's streams were resumed, none started");
    a.shutdown().await;
    c.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn after_amnesia_new_holders_claim_higher_fences_and_resume_the_same_streams() {
    let world = world_with_slots(4);
    let feed = trickle(&world, "m");
    let a = start(&world, "pod-a", 4).await;
    let b = start(&world, "pod-b", 4).await;
    let held = |pod: &str| world.leases.held_by(CPM, pod).len();
    eventually("two pods hold two each", ms(8000), || held("pod-a") == 2 && held("pod-b") == 2).await;
    let before: Vec<i64> = (1..=4).map(|n| fence(&world, n)).collect();

    world.leases.forget_everything();
    eventually("every slot lost", ms(3000), || {
        (1..=4).all(|n| world.leases.holder_pod(Pool::Stream(CPM), n).is_none())
    })
    .await;
    eventually("every slot held again", ms(10_000), || held("pod-a") + held("pod-b") == 4).await;
    assert!(world.leases.audit().quarantined_answers > 0, "the quarantine was enforced");
    for n in 1..=4u8 {
        assert!(fence(&world, n) > before[usize::from(n) - 1], "slot {n}: fence must grow past {before:?}");
    }
    feed.abort();
    assert_all_delivered_once(&world, ms(15_000)).await;
    assert_eq!(world.icom.audit(CPM).streams_started, 4, "cursors in the inbox survived the amnesia");
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn drain_hands_over_without_closing_when_another_pod_is_live_and_closes_when_alone() {
    let world = world_with_slots(4);
    let feed = trickle(&world, "d");
    let a = start(&world, "pod-a", 4).await;
    let b = start(&world, "pod-b", 4).await;
    let held = |pod: &str| world.leases.held_by(CPM, pod).len();
    eventually("two pods hold two each", ms(8000), || held("pod-a") == 2 && held("pod-b") == 2).await;

    let started = tokio::time::Instant::now();
    let report = a.drain().await;
    assert!(started.elapsed() <= ms(3000), "drain within drain_time: {report:?}");
    assert_eq!((report.handed_over, report.closed, report.unanswered), (2, 0, 0), "{report:?}");
    assert_eq!(held("pod-a"), 0, "every lease of the drained pod released");
    assert_ne!(world.leases.holder_pod(Pool::Leader, 1).as_deref(), Some("pod-a"));
    assert_eq!(a.wait().await, TreeExit::Normal);
    assert_eq!(world.icom.audit(CPM).streams_closed, 0);
    eventually("the other pod takes the slots over", ms(5000), || held("pod-b") == 4).await;
    assert_eq!(world.icom.audit(CPM).streams_started, 4, "handed-over streams were resumed");

    feed.abort();
    assert_all_delivered_once(&world, ms(10_000)).await;
    let report = b.drain().await;
    assert_eq!((report.closed, report.handed_over), (4, 0), "alone: close every stream: {report:?}");
    let audit = world.icom.audit(CPM);
    assert_eq!((audit.open_streams, audit.streams_closed, audit.unacked), (0, 4, 0), "{audit:?}");
    assert!((1..=4).all(|n| world.inbox.cursor(slot(n)).unwrap().pull_next.is_none()), "cursors cleared");
    assert_eq!(b.wait().await, TreeExit::Normal);
    assert!(world.pods.live_ids().is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_leader_sweeps_unpublished_rows_and_another_pod_takes_over_leadership() {
    let world = world_with_slots(2);
    world.publisher.set_down(true);
    let a = start(&world, "pod-a", 2).await;
    eventually("pod-a leads", ms(3000), || state_of(&a, "leader") == "leading").await;
    let b = start(&world, "pod-b", 2).await;
    inject(&world, "s", 5);
    eventually("rows committed but unpublished", ms(5000), || world.inbox.rows().len() == 5).await;
    assert_eq!(world.publisher.unpublished(), 5);
    eventually("sweeper retrying", ms(3000), || state_of(&a, "sweeper") == "retrying").await;
    world.publisher.set_down(false);
    eventually("the sweep republished them", ms(5000), || world.publisher.unpublished() == 0).await;
    assert!(detail(&a, "sweeper", "republished") >= 5);
    assert_eq!(state_of(&b, "leader"), "following");

    a.kill();
    eventually("pod-b leads", ms(8000), || state_of(&b, "leader") == "leading").await;
    assert_eq!(world.leases.holder_pod(Pool::Leader, 1).as_deref(), Some("pod-b"));
    b.shutdown().await;
}

/// The holders stay as they are for two heartbeats and more.
async fn settled(world: &cabine_actors::testkit::FakeWorld, pods: &[&str], counts: &[usize]) {
    let snapshot = || pods.iter().map(|p| world.leases.held_by(CPM, p)).collect::<Vec<_>>();
    let first = snapshot();
    assert_eq!(first.iter().map(Vec::len).collect::<Vec<_>>(), counts);
    tokio::time::sleep(ms(1500)).await;
    assert_eq!(snapshot(), first, "holders moved after convergence");
}
