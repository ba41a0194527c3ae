//! The watchdog raises and clears each alert — zero-active, stale-slot
//! (unheld; held but not moving while others deliver), lag, cap — in
//! `Tree::alerts()` and on its status node.

use cabine_actors::ports::{PollOutcome, Pool};
use cabine_actors::{AlertKind, Tree};

use crate::common::*;
use crate::failover::{start_cut_off, start_stuck};

fn has(tree: &Tree, kind: AlertKind, slot: Option<u8>) -> bool {
    tree.alerts().iter().any(|a| a.kind == kind && a.slot == slot)
}

/// The alerts on the watchdog's status node, as `kind/slot` strings.
fn on_node(tree: &Tree) -> Vec<String> {
    let node = find(&tree.status(), "watchdog").cloned().unwrap_or_default();
    node.details["alerts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| format!("{}/{}", a["kind"].as_str().unwrap_or(""), a["slot"]))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn zero_active_is_raised_while_every_holder_fails_and_cleared_when_a_stream_moves() {
    let world = world_with_slots(2);
    let a = start(&world, "pod-a", 2).await;
    eventually("both slots polling", ms(5000), || state_of(&a, "slot/cpm/2") == "polling").await;
    tokio::time::sleep(ms(1000)).await;
    assert!(a.alerts().is_empty(), "healthy and idle: no alert: {:?}", a.alerts());
    world.icom.set_outage(CPM, Some(PollOutcome::ServerError { status: 503 }));
    eventually("zero-active raised", ms(6000), || has(&a, AlertKind::ZeroActive, None)).await;
    assert!(on_node(&a).contains(&"zero_active/null".to_owned()), "{:?}", on_node(&a));
    let alert = a.alerts().into_iter().find(|x| x.kind == AlertKind::ZeroActive).unwrap();
    assert!(alert.detail.contains("every holder failing"), "{}", alert.detail);
    world.icom.set_outage(CPM, None);
    eventually("zero-active cleared", ms(5000), || !has(&a, AlertKind::ZeroActive, None)).await;
    inject(&world, "z", 10);
    assert_all_delivered_once(&world, ms(5000)).await;
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_slot_nobody_holds_is_stale_until_it_is_held() {
    let world = world_with_slots(2);
    let (a, stuck) = start_stuck(&world, "pod-a", 2, 2).await;
    eventually("slot 1 polling", ms(5000), || state_of(&a, "slot/cpm/1") == "polling").await;
    // unheld_after 4 s; alone, the stuck slot has no one to adopt it.
    tokio::time::sleep(ms(3000)).await;
    assert!(!has(&a, AlertKind::StaleSlot, Some(2)));
    eventually("stale-slot raised", ms(3000), || has(&a, AlertKind::StaleSlot, Some(2))).await;
    assert!(on_node(&a).contains(&"stale_slot/2".to_owned()));
    assert!(!has(&a, AlertKind::ZeroActive, None), "slot 1 delivers");
    stuck.send_replace(false);
    eventually("stale-slot cleared", ms(5000), || !has(&a, AlertKind::StaleSlot, Some(2))).await;
    assert_eq!(world.leases.holder_pod(Pool::Stream(CPM), 2).as_deref(), Some("pod-a"));
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_held_slot_that_does_not_move_while_others_deliver_is_stale() {
    let world = world_with_slots(4);
    let a = start(&world, "pod-a", 4).await;
    eventually("pod-a holds all", ms(5000), || world.leases.held_by(CPM, "pod-a").len() == 4).await;
    // pod-b cannot reach ICOM and never fails over here: its slot is held and dead.
    let mut b_config = config("pod-b", 4);
    (b_config.failover.after_failures, b_config.failover.after) = (1000, ms(3_600_000));
    let (b, link) = start_cut_off(&world, "pod-b", b_config).await;
    eventually("pod-b holds its share", ms(8000), || world.leases.held_by(CPM, "pod-b").len() == 2).await;
    let dead = world.leases.held_by(CPM, "pod-b");
    let feed = trickle(&world, "t");
    eventually("stale-slot raised for pod-b's slots", ms(6000), || {
        dead.iter().all(|n| has(&a, AlertKind::StaleSlot, Some(*n)))
    })
    .await;
    let alert = a.alerts().into_iter().find(|x| x.slot == Some(dead[0])).unwrap();
    assert!(alert.detail.contains("held by pod-b"), "{}", alert.detail);
    assert!(!has(&a, AlertKind::ZeroActive, None), "pod-a's slots deliver");
    eventually("every pod's watchdog sees it", ms(500), || has(&b, AlertKind::StaleSlot, Some(dead[0]))).await;
    link.set_down(false);
    eventually("cleared once they move", ms(6000), || a.alerts().is_empty()).await;
    feed.abort();
    assert_all_delivered_once(&world, ms(10_000)).await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn lag_and_cap_are_raised_and_cleared() {
    let world = world_with_slots(4);
    world.publisher.set_down(true);
    let a = start(&world, "pod-a", 4).await;
    inject(&world, "l", 5);
    eventually("committed, not published", ms(5000), || world.inbox.rows().len() == 5).await;
    eventually("lag raised", ms(6000), || has(&a, AlertKind::Lag, None)).await;
    world.publisher.set_down(false);
    eventually("lag cleared after the sweep", ms(6000), || !has(&a, AlertKind::Lag, None)).await;

    // A fifth holder in a pool of four: must never happen, the watchdog says so.
    world.leases.steal(Pool::Stream(CPM), 5);
    eventually("cap raised", ms(2000), || has(&a, AlertKind::Cap, None)).await;
    let alert = a.alerts().into_iter().find(|x| x.kind == AlertKind::Cap).unwrap();
    assert!(alert.detail.contains("5 holders for 4 slots"), "{}", alert.detail);
    // The intruder's key expires (lease + lock-delay): cleared.
    eventually("cap cleared", ms(5000), || !has(&a, AlertKind::Cap, None)).await;
    a.shutdown().await;
}
