//! Poison requests at the intake (DESIGN §2.2): one the store chokes on is
//! isolated on redelivery (the requests pulled with it are stored), parked
//! past `max_deliver` and acknowledged; a request the store refuses is parked
//! at once; the dispatcher keeps pulling throughout.

use cabine_actors::ports::outbound::{OutboundError, OutboundStatus as S, ParkedState, Priority};

use super::*;

#[tokio::test(start_paused = true)]
async fn a_request_the_store_fails_on_is_parked_past_max_deliver_and_the_rest_is_stored() {
    let world = world(1, |_| {});
    world.outbound.poison("P0000", OutboundError::Fatal("the store chokes on this one".into()));
    let mut o = outbound_config(1);
    o.max_deliver = 3;
    let tree = start_pod(&world, "pod-a", o).await;
    let good = ids("G", 20);
    publish(&world, &good[..10], Priority::Normal, 600);
    publish(&world, &["P0000".into()], Priority::Normal, 600);
    publish(&world, &good[10..], Priority::Normal, 600);
    // First round: the batch fails; the redelivery (ack_wait 2 s) is stored one by one.
    all_in(&world, &good, S::Sent, ms(20_000)).await;
    eventually("poison parked", ms(20_000), || world.outbound.parked_rows().len() == 1).await;
    let parked = &world.outbound.parked_rows()[0];
    assert_eq!((parked.state, parked.arrival.deliveries), (ParkedState::Parked, 4), "parked on delivery 4 of max 3");
    assert!(parked.reason.contains("outbound.max_deliver (3)"), "{}", parked.reason);
    eventually("nothing left on the bus", ms(5_000), || world.ingress.pending() == 0).await;
    assert_eq!(world.outbound.status_of("P0000"), None, "never stored: parked as it came");
    assert_eq!(detail(&tree, "outbound-dispatcher", "parked"), 1);
    eventually("parked shown", ms(2_000), || detail(&tree, "outbound-dispatcher", "parked_waiting") == 1).await;
    assert_sim_clean(&world, 1);
    tree.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_request_whose_values_the_store_refuses_is_parked_at_once() {
    let world = world(1, |_| {});
    world.outbound.poison("R0000", OutboundError::Refused("value refused (22P02)".into()));
    let tree = start_pod(&world, "pod-a", outbound_config(1)).await;
    let good = ids("G", 5);
    publish(&world, &good, Priority::Normal, 600);
    publish(&world, &["R0000".into()], Priority::Normal, 600);
    all_in(&world, &good, S::Sent, ms(5_000)).await;
    eventually("refused request parked", ms(2_000), || world.outbound.parked_rows().len() == 1).await;
    let parked = &world.outbound.parked_rows()[0];
    assert_eq!(parked.arrival.deliveries, 1, "no redelivery needed");
    assert!(parked.reason.contains("refused by the store") && parked.reason.contains("22P02"), "{}", parked.reason);
    assert_eq!(world.ingress.pending(), 0);
    assert_eq!(world.ingress.audit().redelivered, 0, "nothing came back");
    tree.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_store_outage_spends_no_deliveries_and_nothing_is_parked() {
    let world = world(1, |_| {});
    let mut o = outbound_config(1);
    o.max_deliver = 2;
    let tree = start_pod(&world, "pod-a", o).await;
    tokio::time::sleep(ms(500)).await;
    world.outbound.set_unavailable(true);
    let all = ids("U", 10);
    publish(&world, &all, Priority::Normal, 600);
    // Ten ack_waits of outage: a dispatcher pulling on would spend every delivery.
    tokio::time::sleep(ms(20_000)).await;
    let delivered = world.ingress.audit().delivered;
    assert!(delivered <= 10, "pulled once, then waits for the store: {delivered} deliveries");
    world.outbound.set_unavailable(false);
    all_in(&world, &all, S::Sent, ms(10_000)).await;
    assert!(world.outbound.parked_rows().is_empty(), "an outage parks nothing");
    tree.shutdown().await;
}
