//! Shared fixture: short timings, fake world, pods, waiting and the
//! "nothing lost, nothing duplicated" judge.

use std::time::Duration;

use cabine_actors::domain::{ChannelId, PoolSize, SlotId};
use cabine_actors::testkit::{
    FakeIcomSettings, FakeLeaseSettings, FakeOutboundSettings, FakeSettings, FakeWorld, message,
};
use cabine_actors::{
    ActorStatus, FailoverConfig, PollMode, RestartPolicy, Tree, TreeConfig, TreeTiming, WatchdogConfig,
};

pub const CPM: ChannelId = ChannelId::Cpm;

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// lease 2 s, lock_delay 1.2 s, heartbeat 0.5 s, long-poll 1.2 s (server hold 1 s).
pub fn settings() -> FakeSettings {
    FakeSettings {
        lease: FakeLeaseSettings {
            lease: ms(2000),
            lock_delay: ms(1200),
            drift_margin: ms(100),
            stream_slots: 4,
            send_slots: 2,
        },
        icom: FakeIcomSettings {
            max_streams: 6,
            max_in_flight: 6,
            hold: ms(1000),
            batch_max: 10,
            idle_expiry: Some(ms(60_000)),
        },
        pod_ttl: ms(1500),
        outbound: FakeOutboundSettings::default(),
    }
}

pub fn world_with_slots(slots: u8) -> FakeWorld {
    let mut s = settings();
    s.lease.stream_slots = slots;
    FakeWorld::new(s)
}

pub fn config(pod: &str, slots: u8) -> TreeConfig {
    TreeConfig {
        pod_id: pod.into(),
        version: "test".into(),
        channels: vec![CPM],
        stream_pool: PoolSize::try_from(u64::from(slots)).unwrap(),
        timing: TreeTiming {
            heartbeat: ms(500),
            long_poll_timeout: ms(1200),
            request_margin: ms(50),
            gate_margin: ms(200),
            acquire_interval: ms(300),
            empty_poll_floor: ms(200),
            backoff_base: ms(50),
            backoff_max: ms(2000),
            drain_time: ms(3000),
            stop_timeout: ms(5000),
            republish_after: ms(2000),
            sweep_interval: ms(1000),
        },
        poll_mode: PollMode::LongPoll,
        restart: RestartPolicy { max_restarts: 3, window: ms(10_000), backoff_base: ms(50), backoff_max: ms(1000) },
        outbound: None,
        failover: failover(),
        watchdog: watchdog(),
        reconcile: None,
        dict_sync: None,
    }
}

/// Fail over after 3 failed cycles or 2 s of failure; cooldown 4 s doubling up to 16 s; orphan grace 1.5 s.
pub fn failover() -> FailoverConfig {
    FailoverConfig {
        after_failures: 3,
        after: ms(2000),
        cooldown: ms(4000),
        cooldown_max: ms(16_000),
        orphan_grace: ms(1500),
    }
}

/// A look every 250 ms; stale 3 s, unheld 4 s, zero-active 3 s, lag 4 s.
pub fn watchdog() -> WatchdogConfig {
    WatchdogConfig {
        interval: ms(250),
        stale_after: ms(3000),
        unheld_after: ms(4000),
        zero_active_after: ms(3000),
        lag_after: ms(4000),
        send_pool: 2,
    }
}

pub async fn start(world: &FakeWorld, pod: &str, slots: u8) -> Tree {
    Tree::start(config(pod, slots), world.ports(pod)).await.expect("tree starts")
}

pub fn slot(n: u8) -> SlotId {
    SlotId { channel: CPM, n }
}

/// Polls `cond` every 50 ms (virtual) until true; fails the test after `within`.
pub async fn eventually(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(ms(50)).await;
    }
}

/// Injects `count` messages named `{prefix}-{i}`.
pub fn inject(world: &FakeWorld, prefix: &str, count: usize) -> Vec<String> {
    let ids: Vec<String> = (0..count).map(|i| format!("{prefix}-{i}")).collect();
    world.icom.inject(CPM, ids.iter().map(|id| message(id)));
    ids
}

/// Injects a few messages every 100 ms until aborted.
pub fn trickle(world: &FakeWorld, prefix: &'static str) -> tokio::task::JoinHandle<()> {
    let world = world.clone();
    tokio::spawn(async move {
        for round in 0.. {
            inject(&world, &format!("{prefix}{round}"), 3);
            tokio::time::sleep(ms(100)).await;
        }
    })
}

/// Everything injected was acknowledged exactly once, after its commit, and
/// is in the inbox exactly once; nothing waits or hangs unacknowledged.
pub async fn assert_all_delivered_once(world: &FakeWorld, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let a = world.icom.audit(CPM);
        if a.acked == a.injected && a.pending == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not everything acknowledged: {a:?}\n{:?}\n{:?}",
            world.inbox.cursor(slot(1)),
            world.icom.log().iter().rev().take(6).collect::<Vec<_>>()
        );
        tokio::time::sleep(ms(50)).await;
    }
    let a = world.icom.audit(CPM);
    assert_eq!(a.acked_twice, 0, "{a:?}");
    assert_eq!(a.acked_before_commit, 0, "acknowledged before commit: {a:?}");
    assert_eq!(a.concurrent_reads, 0, "two requests read one stream at once: {a:?}");
    assert_eq!(a.unacked, 0, "{a:?}");
    assert_eq!(world.inbox.rows().len() as u64, a.injected, "inbox rows vs injected: {a:?}");
    assert!(a.max_open_streams <= 4 && a.max_in_flight <= 4, "cap: {a:?}");
    assert_eq!((a.too_many_streams, a.rate_limited), (0, 0), "429s: {a:?}");
}

pub fn find<'a>(tree: &'a ActorStatus, id: &str) -> Option<&'a ActorStatus> {
    if tree.id == id {
        return Some(tree);
    }
    tree.children.iter().find_map(|c| find(c, id))
}

pub fn state_of(tree: &Tree, id: &str) -> String {
    find(&tree.status(), id).map(|n| n.state.clone()).unwrap_or_default()
}

pub fn detail(tree: &Tree, id: &str, key: &str) -> u64 {
    find(&tree.status(), id).and_then(|n| n.details.get(key)).and_then(|v| v.as_u64()).unwrap_or(0)
}

pub fn fence(world: &FakeWorld, n: u8) -> i64 {
    world.inbox.cursor(slot(n)).map_or(0, |c| c.fence)
}
