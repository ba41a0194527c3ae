//! One pod's inbound pipeline: GET → commit → publish → acknowledge, lease
//! loss mid-poll, a stale fence, malformed messages.

use cabine_actors::TreeExit;
use cabine_actors::ports::{InboxStore, Pool};
use cabine_actors::testkit::{RequestKind, malformed, message};
use tokio::time::Instant;

use crate::common::*;

#[tokio::test(start_paused = true)]
async fn one_pod_holds_every_slot_and_commits_each_message_once() {
    let world = world_with_slots(4);
    let tree = start(&world, "pod-a", 4).await;
    eventually("four slots polling", ms(5000), || {
        (1..=4).all(|n| state_of(&tree, &format!("slot/cpm/{n}")) == "polling")
    })
    .await;
    for burst in 0..4 {
        inject(&world, &format!("b{burst}"), 50);
        tokio::time::sleep(ms(700)).await;
    }
    assert_all_delivered_once(&world, ms(20_000)).await;
    let persisted: u64 = (1..=4).map(|n| detail(&tree, &format!("slot/cpm/{n}"), "messages_persisted")).sum();
    assert_eq!(persisted, 200);
    assert_eq!(world.publisher.published(), 200);
    assert_eq!(world.icom.audit(CPM).streams_started, 4);
    assert_eq!(detail(&tree, "slot/cpm/1", "fence"), 1);
    assert!(find(&tree.status(), "slot/cpm/1").unwrap().details.contains_key("lease_remaining_ms"));
    tree.shutdown().await;
    assert_eq!(tree.wait().await, TreeExit::Normal);
}

#[tokio::test(start_paused = true)]
async fn malformed_messages_are_committed_and_the_stream_continues() {
    let world = world_with_slots(1);
    let tree = start(&world, "pod-a", 1).await;
    eventually("slot polling", ms(3000), || state_of(&tree, "slot/cpm/1") == "polling").await;
    world.icom.inject(CPM, [message("m1"), malformed("m2", "unparseable XML"), message("m3")]);
    eventually("first batch acknowledged", ms(5000), || world.icom.audit(CPM).acked == 3).await;
    world.icom.inject(CPM, [message("m4")]);
    assert_all_delivered_once(&world, ms(5000)).await;
    let rows = world.inbox.rows();
    let m2 = rows.iter().find(|r| r.message.resource_id == "m2").expect("malformed row persisted");
    assert_eq!(m2.message.malformed.as_deref(), Some("unparseable XML"));
    assert_eq!(detail(&tree, "slot/cpm/1", "malformed"), 1);
    assert_eq!(world.icom.audit(CPM).streams_started, 1);
    tree.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn lease_lost_mid_poll_aborts_the_task_and_nothing_is_acknowledged() {
    let world = world_with_slots(1);
    let tree = start(&world, "pod-a", 1).await;
    eventually("stream started, cursor stored", ms(3000), || stored_cursor(&world)).await;
    world.inbox.set_commit_delay(ms(3000));
    inject(&world, "x", 3);
    eventually("batch received, being persisted", ms(3000), || world.icom.audit(CPM).delivered == 3).await;
    let conn = world.icom.log().last().expect("a request").conn;
    world.leases.steal(Pool::Stream(CPM), 1);
    eventually("slot lost", ms(2000), || state_of(&tree, "slot/cpm/1") == "standby").await;
    let lost_at = Instant::now();
    let a = world.icom.audit(CPM);
    assert_eq!((a.acked, a.connections), (0, 0), "nothing acknowledged, connection dropped: {a:?}");
    assert!(world.inbox.rows().is_empty(), "the aborted commit wrote nothing");
    world.inbox.set_commit_delay(ms(0));
    assert_all_delivered_once(&world, ms(10_000)).await;
    let late = world.icom.log().into_iter().filter(|r| r.conn == conn && r.at >= lost_at).count();
    assert_eq!(late, 0, "the old connection sent nothing after the loss");
    let a = world.icom.audit(CPM);
    assert_eq!((a.streams_started, a.redelivered), (1, 3), "same stream resumed, batch redelivered: {a:?}");
    assert_eq!(fence(&world, 1), 2);
    tree.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_stale_fence_cannot_commit() {
    let world = world_with_slots(1);
    let tree = start(&world, "pod-a", 1).await;
    eventually("stream started, cursor stored", ms(3000), || stored_cursor(&world)).await;
    world.inbox.set_commit_delay(ms(1000));
    inject(&world, "y", 2);
    eventually("batch received", ms(3000), || world.icom.audit(CPM).delivered == 2).await;
    // Another holder claims the slot (e.g. after a partition): fence 2.
    world.inbox.claim(slot(1), "intruder", ms(1400)).await.unwrap();
    eventually("commit refused", ms(3000), || world.inbox.audit().fence_rejections >= 1).await;
    assert_eq!(world.icom.audit(CPM).acked, 0, "a refused commit acknowledges nothing");
    assert_all_delivered_once(&world, ms(10_000)).await;
    assert!(world.inbox.rows().iter().all(|r| r.fence == 3), "only the new claim's fence committed");
    assert_eq!(fence(&world, 1), 3);
    assert!(world.leases.audit().releases.get("cpm:stream/1").copied().unwrap_or(0) >= 1);
    let a = world.icom.audit(CPM);
    assert_eq!(a.streams_started, 1);
    assert!(world.icom.log().iter().filter(|r| r.kind == RequestKind::Start).count() == 1);
    tree.shutdown().await;
}

fn stored_cursor(world: &cabine_actors::testkit::FakeWorld) -> bool {
    world.inbox.cursor(slot(1)).is_some_and(|c| c.pull_next.is_some())
}

#[tokio::test(start_paused = true)]
async fn a_commit_refused_by_a_down_inbox_is_retried_without_a_second_get_or_stream() {
    let world = world_with_slots(1);
    let tree = start(&world, "pod-a", 1).await;
    eventually("slot polling", ms(3000), || state_of(&tree, "slot/cpm/1") == "polling").await;
    world.inbox.fail_next_commits(3);
    // The start's hold is still running: this batch arrives on the new stream's first answer.
    inject(&world, "z", 4);
    assert_all_delivered_once(&world, ms(10_000)).await;
    let a = world.icom.audit(CPM);
    assert_eq!((a.streams_started, a.delivered, a.redelivered), (1, 4, 0), "{a:?}");
    assert!(detail(&tree, "slot/cpm/1", "polls") >= 4);
    tree.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn drain_ends_within_drain_time_even_when_a_commit_hangs() {
    let world = world_with_slots(1);
    let tree = start(&world, "pod-a", 1).await;
    eventually("stream started, cursor stored", ms(3000), || stored_cursor(&world)).await;
    world.inbox.set_commit_delay(ms(60_000));
    inject(&world, "h", 2);
    eventually("batch received, being persisted", ms(3000), || world.icom.audit(CPM).delivered == 2).await;
    let started = Instant::now();
    let report = tree.drain().await;
    assert!(started.elapsed() <= ms(3000 + 300), "drain took {:?}", started.elapsed());
    assert_eq!((report.unanswered, report.forced), (1, 1), "{report:?}");
    assert_eq!(tree.wait().await, TreeExit::Normal);
    assert!(world.leases.held_by(CPM, "pod-a").is_empty(), "the stuck slot's lease was released by force");
    let a = world.icom.audit(CPM);
    assert_eq!((a.acked, a.connections), (0, 0), "nothing acknowledged, connection closed: {a:?}");
}
