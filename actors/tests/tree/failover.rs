//! Never a slot silently dead: a pod that cannot reach ICOM fails its slots
//! over and sits out a cooldown (nobody hands them back meanwhile), a pod
//! alone keeps trying, and a slot its rightful pod does not take is adopted
//! after the orphan grace.

use std::sync::Arc;

use cabine_actors::ports::{Acquired, Holder, Lease, LeaseError, LeaseStore, LostCause, PodRegistry, Pool};
use cabine_actors::testkit::{FakeWorld, LinkFault};
use cabine_actors::{Tree, TreeConfig};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::common::*;

/// A pod whose own link to ICOM is cut (`down`) from the start.
pub async fn start_cut_off(world: &FakeWorld, pod: &str, config: TreeConfig) -> (Tree, LinkFault) {
    let link = LinkFault::default();
    link.set_down(true);
    let mut ports = world.ports(pod);
    ports.icom = link.wrap(ports.icom);
    (Tree::start(config, ports).await.expect("tree starts"), link)
}

fn held(world: &FakeWorld, pod: &str) -> Vec<u8> {
    world.leases.held_by(CPM, pod)
}

fn failovers(tree: &Tree) -> u64 {
    (1..=4).map(|n| detail(tree, &format!("slot/cpm/{n}"), "failovers")).sum()
}

#[tokio::test(start_paused = true)]
async fn a_pod_that_cannot_reach_icom_fails_over_sits_out_its_cooldown_and_loses_nothing() {
    let world = world_with_slots(4);
    let feed = trickle(&world, "f");
    let a = start(&world, "pod-a", 4).await;
    let b = start(&world, "pod-b", 4).await;
    let two_each = || held(&world, "pod-a").len() == 2 && held(&world, "pod-b").len() == 2;
    eventually("a and b hold two each", ms(8000), two_each).await;
    let (c, _link) = start_cut_off(&world, "pod-c", config("pod-c", 4)).await;
    // Fair share gives pod-c a slot; its cycles fail at once (3 in a row): it fails the slot over.
    eventually("pod-c fails a slot over", ms(8000), || failovers(&c) == 1).await;
    let failed_over = Instant::now();
    let n = (1..=4u8).find(|n| detail(&c, &format!("slot/cpm/{n}"), "failovers") == 1).unwrap();
    let taken = || world.leases.holder_pod(Pool::Stream(CPM), n).is_some_and(|p| p != "pod-c");
    eventually("another pod takes the slot over", ms(6000), taken).await;
    // Failed over within the failover bound (3 cycles, at most 2 s); taken within lease + one acquire interval.
    assert!(failed_over.elapsed() <= ms(2300), "taken over {:?} after the failover", failed_over.elapsed());
    let id = format!("slot/cpm/{n}");
    assert_eq!(detail(&c, &id, "failovers"), 1);
    assert_eq!(state_of(&c, &id), "cooldown");
    let node = find(&c.status(), &id).cloned().unwrap();
    assert!(node.last_error.as_deref().is_some_and(|e| e.contains("failed over after 3 failed cycles")), "{node:?}");
    assert!(node.details.contains_key("cooldown_until_ms"));
    let pods = world.pods.clone();
    let beat_says = async || {
        let beats = pods.live_pods().await.unwrap_or_default();
        beats.iter().any(|p| p.pod_id == "pod-c" && p.cooldown == vec![format!("cpm:stream/{n}")])
    };
    let deadline = Instant::now() + ms(1000);
    while !beat_says().await {
        assert!(Instant::now() < deadline, "the cooldown is not in pod-c's heartbeat");
        tokio::time::sleep(ms(50)).await;
    }

    // During the cooldown nobody hands anything back to pod-c and nothing moves.
    eventually("a and b hold everything", ms(2000), || held(&world, "pod-a").len() + held(&world, "pod-b").len() == 4)
        .await;
    let grants = world.leases.audit().grants;
    let until = failed_over + ms(3800);
    while Instant::now() < until {
        assert!(held(&world, "pod-c").is_empty(), "pod-c got a slot back during its cooldown");
        tokio::time::sleep(ms(50)).await;
    }
    assert_eq!(world.leases.audit().grants, grants, "no ping-pong: holders stayed put during the cooldown");

    // After the cooldown pod-c rejoins, fails once more, and the cooldown doubles.
    eventually("pod-c fails over a second time", ms(10_000), || failovers(&c) == 2).await;
    let errors: Vec<String> = (1..=4)
        .filter_map(|n| find(&c.status(), &format!("slot/cpm/{n}")).and_then(|s| s.last_error.clone()))
        .collect();
    assert!(errors.iter().any(|e| e.contains("cooldown 8s")), "{errors:?}");
    feed.abort();
    assert_all_delivered_once(&world, ms(15_000)).await;
    assert_eq!(world.icom.audit(CPM).streams_started, 4, "failovers resumed the same streams");
    for tree in [a, b, c] {
        tree.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_pod_alone_keeps_trying_and_fails_over_once_a_healthy_pod_joins() {
    let world = world_with_slots(2);
    let (a, link) = start_cut_off(&world, "pod-a", config("pod-a", 2)).await;
    eventually("pod-a holds both slots", ms(8000), || held(&world, "pod-a").len() == 2).await;
    tokio::time::sleep(ms(4000)).await;
    assert_eq!(failovers(&a), 0, "alone: no one to hand over to, it keeps trying");
    assert!(detail(&a, "slot/cpm/1", "failures") >= 3);
    let b = start(&world, "pod-b", 2).await;
    eventually("pod-b takes both over", ms(6000), || held(&world, "pod-b").len() == 2).await;
    // One failover puts pod-a in cooldown on the channel: its other slot goes by fair share.
    assert!(failovers(&a) >= 1);
    inject(&world, "j", 20);
    assert_all_delivered_once(&world, ms(5000)).await;
    // The link comes back: after its cooldown pod-a takes its fair share again.
    link.set_down(false);
    eventually("pod-a holds its share again", ms(12_000), || held(&world, "pod-a").len() == 1).await;
    inject(&world, "k", 20);
    assert_all_delivered_once(&world, ms(5000)).await;
    a.shutdown().await;
    b.shutdown().await;
}

/// A lease store whose acquire of one stream slot hangs while `stuck` is true:
/// the pod is alive and beating, its Slot(n) is stuck.
pub struct StuckAcquire {
    pub inner: Arc<dyn LeaseStore>,
    pub slot: u8,
    pub stuck: watch::Receiver<bool>,
}

#[async_trait::async_trait]
impl LeaseStore for StuckAcquire {
    async fn acquire(&self, pool: Pool, slot: Option<u8>) -> Result<Acquired, LeaseError> {
        if pool == Pool::Stream(CPM) && slot == Some(self.slot) {
            let _ = self.stuck.clone().wait_for(|stuck| !*stuck).await;
        }
        self.inner.acquire(pool, slot).await
    }
    async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        self.inner.renew(lease).await
    }
    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease, LostCause>>, LeaseError> {
        self.inner.renew_many(leases).await
    }
    async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        self.inner.release(lease).await
    }
    async fn holders(&self, pool: Pool) -> Result<Vec<Holder>, LeaseError> {
        self.inner.holders(pool).await
    }
    async fn report_amnesia(&self, evidence: &str) -> Result<std::time::Duration, LeaseError> {
        self.inner.report_amnesia(evidence).await
    }
    async fn quarantine(&self) -> Result<Option<cabine_actors::ports::Quarantine>, LeaseError> {
        self.inner.quarantine().await
    }
}

/// A pod whose Slot(`slot`) cannot acquire while the returned sender holds `true`.
pub async fn start_stuck(world: &FakeWorld, pod: &str, slots: u8, slot: u8) -> (Tree, watch::Sender<bool>) {
    let (tx, stuck) = watch::channel(true);
    let mut ports = world.ports(pod);
    ports.leases = Arc::new(StuckAcquire { inner: ports.leases, slot, stuck });
    (Tree::start(config(pod, slots), ports).await.expect("tree starts"), tx)
}

#[tokio::test(start_paused = true)]
async fn a_slot_its_rightful_pod_does_not_take_is_adopted_after_the_grace_and_not_handed_back() {
    let world = world_with_slots(2);
    let feed = trickle(&world, "o");
    let a = start(&world, "pod-a", 2).await;
    eventually("pod-a holds both", ms(8000), || held(&world, "pod-a").len() == 2).await;
    let (b, _stuck) = start_stuck(&world, "pod-b", 2, 2).await;
    let free = || world.leases.holder_pod(Pool::Stream(CPM), 2).is_none();
    eventually("pod-a hands slot 2 to pod-b's fair share", ms(5000), free).await;
    let freed = Instant::now();
    eventually("slot 2 adopted", ms(5000), || !free()).await;
    let took = freed.elapsed();
    // orphan_grace 1.5 s + one acquire interval (pod-b, holding none, goes first) + sighting and jitter.
    assert!(took >= ms(1500) && took <= ms(3000), "adopted after {took:?}");
    assert_eq!(held(&world, "pod-a"), vec![1, 2]);
    assert_eq!(detail(&a, "slot/cpm/2", "orphans_adopted"), 1);
    assert_eq!(state_of(&b, "slot/cpm/2"), "acquiring", "pod-b's slot 2 is still stuck");
    let grants = world.leases.audit().grants;
    tokio::time::sleep(ms(3000)).await;
    assert_eq!(held(&world, "pod-a"), vec![1, 2], "not handed back to the pod that did not take it");
    assert_eq!(world.leases.audit().grants, grants);
    feed.abort();
    assert_all_delivered_once(&world, ms(10_000)).await;
    a.shutdown().await;
    b.kill();
}
