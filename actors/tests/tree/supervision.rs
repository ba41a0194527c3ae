//! Supervisors: restart intensity escalates to Root's failure; an operator
//! restart of one actor restarts only it and releases its lease.

use cabine_actors::ports::Pool;
use cabine_actors::{RestartError, TreeExit};

use crate::common::*;

#[tokio::test(start_paused = true)]
async fn restart_intensity_escalates_to_root_failure() {
    let world = world_with_slots(2);
    world.inbox.set_fatal_claims(true);
    let tree = start(&world, "pod-a", 2).await;
    let exit = tokio::time::timeout(ms(60_000), tree.wait()).await.expect("the tree gives up");
    let TreeExit::Escalated(why) = exit else { panic!("expected an escalation, got {exit:?}") };
    assert!(why.contains("channel/cpm"), "{why}");
    assert!(exit_is_failure(&why));
    let status = tree.status();
    assert_eq!(status.state, "failed");
    assert!(find(&status, "channel/cpm").unwrap().restarts >= 3, "Root restarted the channel first");
    assert!(world.leases.held_by(CPM, "pod-a").is_empty(), "stream leases released");
    assert_eq!(world.leases.holder_pod(Pool::Leader, 1), None, "leader lease released");
    assert!(world.pods.live_ids().is_empty(), "heartbeat key removed");
}

fn exit_is_failure(why: &str) -> bool {
    TreeExit::Escalated(why.into()).is_failure()
}

#[tokio::test(start_paused = true)]
async fn restart_of_one_slot_restarts_only_it_and_releases_its_lease() {
    let world = world_with_slots(3);
    let tree = start(&world, "pod-a", 3).await;
    let polling = |tree: &cabine_actors::Tree| (1..=3).all(|n| state_of(tree, &format!("slot/cpm/{n}")) == "polling");
    eventually("three slots polling", ms(5000), || polling(&tree)).await;
    inject(&world, "r", 30);

    tree.restart("slot/cpm/2").await.expect("slot restart accepted");
    eventually("slot 2 back with a new fence", ms(5000), || fence(&world, 2) == 2 && polling(&tree)).await;
    let releases = world.leases.audit().releases;
    assert_eq!(releases.get("cpm:stream/2"), Some(&1));
    assert_eq!((releases.get("cpm:stream/1"), releases.get("cpm:stream/3")), (None, None));
    assert_eq!((fence(&world, 1), fence(&world, 3)), (1, 1), "siblings kept their claims");
    let status = tree.status();
    let restarts = |id: &str| find(&status, id).unwrap().restarts;
    assert_eq!((restarts("slot/cpm/1"), restarts("slot/cpm/2"), restarts("slot/cpm/3")), (0, 1, 0));
    assert_eq!(world.icom.audit(CPM).streams_started, 3, "slot 2 resumed its stream");

    assert_eq!(tree.restart("root").await, Err(RestartError::NotRestartable("root".into())));
    assert_eq!(tree.restart("slot/cpm/9").await, Err(RestartError::UnknownActor("slot/cpm/9".into())));
    assert_eq!(tree.restart("slot/csm/1").await, Err(RestartError::UnknownActor("slot/csm/1".into())));

    // A whole channel: its slots' leases are released, they come back with new fences.
    tree.restart("channel/cpm").await.expect("channel restart accepted");
    eventually("every slot re-claimed", ms(8000), || {
        (1..=3).all(|n| fence(&world, n) >= 2 && fence(&world, 1) == 2) && polling(&tree)
    })
    .await;
    assert_eq!(find(&tree.status(), "channel/cpm").unwrap().restarts, 1);
    eventually("leader elected", ms(3000), || state_of(&tree, "leader") == "leading").await;
    tree.restart("sweeper").await.expect("sweeper restart accepted");
    eventually("sweeper restarted", ms(3000), || find(&tree.status(), "sweeper").is_some_and(|s| s.restarts == 1))
        .await;

    // The heartbeat owns no lease: restarting it costs no slot.
    let fences: Vec<i64> = (1..=3).map(|n| fence(&world, n)).collect();
    tree.restart("lease-heartbeat").await.expect("heartbeat restart accepted");
    eventually("heartbeat restarted", ms(3000), || {
        find(&tree.status(), "lease-heartbeat").is_some_and(|h| h.restarts == 1)
    })
    .await;
    tokio::time::sleep(ms(3000)).await;
    assert_eq!((1..=3).map(|n| fence(&world, n)).collect::<Vec<_>>(), fences, "leases kept renewing");

    assert_all_delivered_once(&world, ms(10_000)).await;
    assert_eq!(world.icom.audit(CPM).streams_started, 3, "no stream was abandoned");
    tree.shutdown().await;
}
