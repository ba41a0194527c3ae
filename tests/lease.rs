//! Leased slots against the shared Redis (each test its own key prefix): fresh
//! cluster quarantine, expiry then lock-delay, release, stale grants, unique
//! grant ids, renew-many, holders, the local quarantine rule, pod heartbeats.

mod lease_support;

use std::collections::HashSet;
use std::time::Duration;

use cabine::redis::RedisPodRegistry;
use cabine_actors::ports::{Acquired, LeaseError, LeaseStore, LostCause, PodBeat, PodRegistry, Pool};
use fred::prelude::KeysInterface;
use lease_support::*;
use tokio::time::Instant;

const TOLERANCE: Duration = Duration::from_millis(5);

#[tokio::test]
async fn a_fresh_cluster_waits_lease_plus_lock_delay_once() {
    let cluster = Cluster::shared().await;
    let (a, b) = (cluster.pod("a").await, cluster.pod("b").await);
    boot(&a).await;
    // The quarantine is over for everyone, and a pod that starts later does not wait again.
    granted(&b, Pool::Leader, None).await;
    let c = cluster.pod("c").await;
    assert_eq!(granted(&c, STREAM, None).await.slot, 1);
    cluster.cleanup().await;
}

#[tokio::test]
async fn a_second_pod_sees_the_quarantine_the_first_one_started() {
    let cluster = Cluster::shared().await;
    let (a, b) = (cluster.pod("a").await, cluster.pod("b").await);
    assert!(matches!(a.acquire(STREAM, None).await.unwrap(), Acquired::Quarantined { .. }));
    match b.acquire(STREAM, Some(1)).await.unwrap() {
        Acquired::Quarantined { remaining } => assert!(remaining > TTL - Duration::from_millis(200)),
        other => panic!("b must be quarantined too, got {other:?}"),
    }
    cluster.cleanup().await;
}

#[tokio::test]
async fn a_holder_that_stops_renewing_loses_its_slot_and_it_is_free_only_after_lease_plus_lock_delay() {
    let cluster = Cluster::shared().await;
    let (a, b) = (cluster.pod("a").await, cluster.pod("b").await);
    boot(&a).await;
    let t0 = Instant::now();
    let lease = granted(&a, Pool::Leader, None).await;
    assert!(lease.valid_until <= t0 + LEASE - DRIFT + Duration::from_millis(50));
    assert_eq!(b.acquire(Pool::Leader, Some(1)).await.unwrap(), Acquired::Full);

    let (_, got_at) = first_grant(&b, Pool::Leader, TTL + Duration::from_secs(1)).await.expect("slot freed");
    assert!(got_at + TOLERANCE >= t0 + TTL, "granted {:?} after t0, before lease + lock_delay", got_at - t0);
    assert!(got_at <= t0 + TTL + Duration::from_millis(400), "granted {:?} after t0", got_at - t0);
    assert!(!lease.is_valid(), "the holder's own view expired first");
    assert_eq!(a.renew(&lease).await, Err(LeaseError::Lost(LostCause::Expired)));
    cluster.cleanup().await;
}

#[tokio::test]
async fn a_late_renewal_is_lost_and_never_re_acquires() {
    let cluster = Cluster::shared().await;
    let a = cluster.pod("a").await;
    boot(&a).await;
    let lease = granted(&a, Pool::Leader, None).await;
    tokio::time::sleep_until(lease.valid_until + Duration::from_millis(10)).await;
    // Redis still holds the key (lock-delay), but the holder's validity is over.
    assert_eq!(a.holders(Pool::Leader).await.unwrap().len(), 1);
    assert_eq!(a.renew(&lease).await, Err(LeaseError::Lost(LostCause::Expired)));
    assert_eq!(a.renew_many(std::slice::from_ref(&lease)).await.unwrap(), vec![Err(LostCause::Expired)]);
    cluster.cleanup().await;
}

#[tokio::test]
async fn release_frees_the_slot_at_once() {
    let cluster = Cluster::shared().await;
    let (a, b) = (cluster.pod("a").await, cluster.pod("b").await);
    boot(&a).await;
    let lease = granted(&a, Pool::Leader, None).await;
    assert_eq!(b.acquire(Pool::Leader, None).await.unwrap(), Acquired::Full);
    a.release(&lease).await.unwrap();
    let taken = granted(&b, Pool::Leader, None).await;
    assert_ne!(taken.grant, lease.grant);
    cluster.cleanup().await;
}

#[tokio::test]
async fn a_stale_grant_is_refused_and_changes_nothing() {
    let cluster = Cluster::shared().await;
    let (a, b) = (cluster.pod("a").await, cluster.pod("b").await);
    boot(&a).await;
    let stale = granted(&a, STREAM, Some(2)).await;
    a.release(&stale).await.unwrap();
    let current = granted(&b, STREAM, Some(2)).await;
    let before = b.holders(STREAM).await.unwrap();
    assert_eq!(before.len(), 1);
    assert_eq!((before[0].slot, before[0].grant.as_str(), before[0].pod.as_str()), (2, current.grant.0.as_str(), "b"));

    assert_eq!(a.renew(&stale).await, Err(LeaseError::Lost(LostCause::Stolen)));
    a.release(&stale).await.unwrap();
    let after = b.holders(STREAM).await.unwrap();
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].grant, current.grant.0, "still b's grant");
    assert!(after[0].ttl_ms <= before[0].ttl_ms, "the stale renew did not extend b's key");
    assert!(b.renew(&current).await.is_ok());

    let key = cluster.keys().slot(STREAM, 2);
    let _: i64 = cluster.client.del(&key).await.unwrap();
    assert_eq!(b.renew(&current).await, Err(LeaseError::Lost(LostCause::Missing)));
    cluster.cleanup().await;
}

#[tokio::test]
async fn grant_ids_never_repeat() {
    let cluster = Cluster::shared().await;
    let (a, b) = (cluster.pod("a").await, cluster.pod("b").await);
    boot(&a).await;
    let mut seen = HashSet::new();
    for _ in 0..150 {
        for store in [&a, &b] {
            let lease = granted(store, STREAM, None).await;
            assert!(seen.insert(lease.grant.clone()), "grant {} repeated", lease.grant);
            store.release(&lease).await.unwrap();
        }
    }
    assert_eq!(seen.len(), 300);
    cluster.cleanup().await;
}

#[tokio::test]
async fn acquire_takes_the_requested_slot_or_the_first_free_one() {
    let cluster = Cluster::shared().await;
    let (a, b) = (cluster.pod("a").await, cluster.pod("b").await);
    boot(&a).await;
    assert_eq!(granted(&a, STREAM, Some(2)).await.slot, 2);
    assert_eq!(b.acquire(STREAM, Some(2)).await.unwrap(), Acquired::Full);
    assert_eq!(granted(&b, STREAM, None).await.slot, 1);
    assert_eq!(a.acquire(STREAM, None).await.unwrap(), Acquired::Full);
    assert!(matches!(a.acquire(STREAM, Some(3)).await, Err(LeaseError::Fatal(_))), "slot outside the pool");
    cluster.cleanup().await;
}

#[tokio::test]
async fn renew_many_extends_every_lease_in_one_call_and_reports_each_loss() {
    let cluster = Cluster::shared().await;
    let (a, b) = (cluster.pod("a").await, cluster.pod("b").await);
    boot(&a).await;
    let held = vec![
        granted(&a, STREAM, Some(1)).await,
        granted(&a, STREAM, Some(2)).await,
        granted(&a, Pool::Leader, None).await,
    ];
    let _: i64 = cluster.client.del(cluster.keys().slot(STREAM, 2)).await.unwrap();
    granted(&b, STREAM, Some(2)).await;
    tokio::time::sleep(Duration::from_millis(100)).await;

    let out = a.renew_many(&held).await.unwrap();
    assert_eq!(out.len(), 3);
    assert_eq!(out[1], Err(LostCause::Stolen));
    for (i, renewed) in [(0, &out[0]), (2, &out[2])] {
        let renewed = renewed.as_ref().expect("still ours");
        assert_eq!((renewed.slot, &renewed.grant), (held[i].slot, &held[i].grant));
        assert!(renewed.valid_until > held[i].valid_until + Duration::from_millis(90));
    }
    assert_eq!(a.renew_many(&[]).await.unwrap(), vec![]);
    cluster.cleanup().await;
}

#[tokio::test]
async fn amnesia_loses_every_lease_and_quarantines_every_pod() {
    let server = cabine::harness::RedisServer::start().await.unwrap();
    let cluster = Cluster::on(&server.url()).await;
    let (a, b) = (cluster.pod("a").await, cluster.pod("b").await);
    boot(&a).await;
    let a_leases = vec![granted(&a, STREAM, None).await, granted(&a, Pool::Leader, None).await];
    let b_lease = granted(&b, STREAM, None).await;

    server.flush_all().await.unwrap();
    let detected = Instant::now();
    let lost = a.renew_many(&a_leases).await.unwrap();
    assert_eq!(lost, vec![Err(LostCause::Amnesia), Err(LostCause::Amnesia)], "a found the epoch gone");
    assert_eq!(b.renew(&b_lease).await, Err(LeaseError::Lost(LostCause::Amnesia)), "b sees the epoch changed");
    assert!(matches!(b.acquire(STREAM, None).await.unwrap(), Acquired::Quarantined { .. }));

    let (_, got_at) = first_grant(&b, STREAM, TTL + Duration::from_secs(1)).await.expect("grants resume");
    assert!(got_at + TOLERANCE >= detected + TTL, "granted {:?} after detection", got_at - detected);
    cluster.cleanup().await;
}

#[tokio::test]
async fn a_pod_that_saw_amnesia_keeps_its_local_quarantine_even_if_redis_forgets_it() {
    let cluster = Cluster::shared().await;
    let a = cluster.pod("a").await;
    boot(&a).await;
    // Only the quarantine key is lost (e.g. evicted); the epoch survives.
    let _: i64 = cluster.client.del(cluster.keys().quarantine()).await.unwrap();
    granted(&a, STREAM, None).await;
    let _: i64 = cluster.client.del(cluster.keys().epoch()).await.unwrap();
    assert!(matches!(a.acquire(STREAM, None).await.unwrap(), Acquired::Quarantined { .. }), "amnesia seen");
    let _: i64 = cluster.client.del(cluster.keys().quarantine()).await.unwrap();
    match a.acquire(STREAM, None).await.unwrap() {
        Acquired::Quarantined { remaining } => assert!(remaining > TTL - Duration::from_millis(300)),
        other => panic!("the local rule must refuse while Redis forgot the quarantine, got {other:?}"),
    }
    cluster.cleanup().await;
}

#[tokio::test]
async fn pods_beat_are_listed_while_alive_and_leave() {
    let cluster = Cluster::shared().await;
    let registry = RedisPodRegistry::new(cluster.client.clone(), cluster.keys(), HEARTBEAT, COMMAND_TIMEOUT);
    let beat = |id: &str| PodBeat {
        pod_id: id.to_owned(),
        pid: 7,
        version: "t".to_owned(),
        uptime_s: 1,
        held: vec!["cpm:stream/1".to_owned()],
        streams: [(cabine_actors::domain::ChannelId::Cpm, 4)].into_iter().collect(),
        cooldown: vec!["cpm:stream/2".to_owned()],
    };
    registry.beat(&beat("p1")).await.unwrap();
    registry.beat(&beat("p2")).await.unwrap();
    assert_eq!(registry.live_pods().await.unwrap(), vec![beat("p1"), beat("p2")]);
    registry.leave("p1").await.unwrap();
    assert_eq!(registry.live_pods().await.unwrap(), vec![beat("p2")]);
    tokio::time::sleep(HEARTBEAT * 3 + Duration::from_millis(100)).await;
    assert_eq!(registry.live_pods().await.unwrap(), vec![], "p2 stopped beating");
    cluster.cleanup().await;
}
