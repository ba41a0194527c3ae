//! Partial Redis amnesia (DESIGN §3) against a real Redis: a lease key lost
//! while its holder still holds it (eviction, a rollback, a lagging replica)
//! is reported and quarantines every pod, with its reason readable; the
//! server's identity is kept in Redis so a restart from an older snapshot is
//! seen by the first script that runs there; a stale pod coming back with an
//! old epoch long after a quarantine does not stop the cluster again.

mod lease_support;

use std::time::Duration;

use cabine_actors::ports::{Acquired, LeaseStore, LostCause};
use fred::prelude::KeysInterface;
use lease_support::*;
use tokio::time::Instant;

#[tokio::test]
async fn a_holders_key_gone_while_it_holds_is_reported_and_quarantines_every_pod_with_its_reason() {
    let cluster = Cluster::shared().await;
    let (a, b) = (cluster.pod("a").await, cluster.pod("b").await);
    boot(&a).await;
    let lease = granted(&a, STREAM, Some(1)).await;
    // Eviction of the key with a TTL; the epoch (no TTL) survives.
    let _: i64 = cluster.client.del(cluster.keys().slot(STREAM, 1)).await.unwrap();
    let answers = a.renew_many(std::slice::from_ref(&lease)).await.unwrap();
    assert_eq!(answers, vec![Err(LostCause::Missing)], "renewed while locally valid: the key is missing");
    assert!(lease.is_valid(), "the lease was still valid by the holder's clock: proof of amnesia");
    let regranted = b.acquire(STREAM, Some(1)).await.unwrap();
    assert!(matches!(regranted, Acquired::Granted(_)), "undetected, Redis grants it again: {regranted:?}");
    let reported_at = Instant::now();
    let left = a.report_amnesia("cpm:stream/1 missing (slot/cpm/1)").await.unwrap();
    assert_eq!(left, TTL);
    for pod in [&a, &b] {
        assert!(matches!(pod.acquire(STREAM, None).await.unwrap(), Acquired::Quarantined { .. }));
    }
    let q = b.quarantine().await.unwrap().expect("a quarantine runs");
    assert!(q.reason.starts_with("partial amnesia: cpm:stream/1 missing"), "{q:?}");
    assert!(q.remaining_ms <= TTL.as_millis() as u64);
    let (_, got_at) = first_grant(&b, STREAM, TTL + Duration::from_secs(1)).await.expect("grants resume");
    assert!(
        got_at >= reported_at + TTL - Duration::from_millis(5),
        "granted {:?} after the report",
        got_at - reported_at
    );
    assert_eq!(b.quarantine().await.unwrap(), None);
    cluster.cleanup().await;
}

#[tokio::test]
async fn a_stale_pod_back_with_an_old_epoch_does_not_quarantine_the_cluster_again() {
    let cluster = Cluster::shared().await;
    let (stale, b) = (cluster.pod("stale").await, cluster.pod("b").await);
    boot(&stale).await;
    let old = granted(&stale, STREAM, Some(1)).await;
    // Redis forgets everything while the stale pod is paused; b sees it and waits the quarantine out.
    let keys = cluster.keys();
    let _: i64 = cluster.client.del(vec![keys.epoch(), keys.slot(STREAM, 1), keys.quarantine()]).await.unwrap();
    assert!(matches!(b.acquire(STREAM, None).await.unwrap(), Acquired::Quarantined { .. }), "amnesia seen by b");
    first_grant(&b, STREAM, TTL + Duration::from_secs(1)).await.expect("b granted after the quarantine");
    // Long after, the stale pod comes back with the epoch it knew and asks for a slot.
    assert!(!old.is_valid(), "its lease ran out while it was away");
    let back = stale.acquire(STREAM, None).await.unwrap();
    assert!(matches!(back, Acquired::Quarantined { remaining } if remaining.is_zero()), "{back:?}");
    assert_eq!(b.quarantine().await.unwrap(), None, "no new quarantine for an epoch change long past");
    assert!(matches!(b.acquire(STREAM, None).await.unwrap(), Acquired::Granted(_)), "the cluster keeps granting");
    assert!(matches!(stale.acquire(STREAM, None).await.unwrap(), Acquired::Full | Acquired::Granted(_)));
    cluster.cleanup().await;
}
