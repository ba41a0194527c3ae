//! The shared Redis circuit breaker: what opens it, what never does, lazy
//! half-open, limited and expiring probes, stale outcomes, two pods.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cabine::config::{ChannelId, Settings};
use cabine::redis::breaker::RedisBreaker;
use cabine::redis::guard::ScriptClock;
use cabine_actors::ports::breaker::{Admission, BreakerState, Call, CallOutcome, CircuitBreaker};
use fred::prelude::*;

use crate::common::{clean_redis, keys, redis, settings};

const CPM: ChannelId = ChannelId::Cpm;
const T0: u64 = 1_704_200_000_000;

struct Rig {
    s: Settings,
    client: Client,
    now: Arc<AtomicU64>,
    breaker: RedisBreaker,
}

impl Rig {
    async fn new() -> Rig {
        let s = settings("brk", &[]);
        let client = redis(&s).await;
        let (clock, now) = ScriptClock::pinned(T0);
        let breaker = RedisBreaker::new(client.clone(), keys(&s), &s.outbound.breaker, clock);
        Rig { s, client, now, breaker }
    }

    fn advance(&self, ms: u64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }

    async fn call(&self, outcome: CallOutcome) -> BreakerState {
        let call = admitted(self.breaker.admit(CPM).await.unwrap());
        self.breaker.record(CPM, &call, outcome).await.unwrap()
    }

    async fn state(&self) -> BreakerState {
        self.breaker.state(CPM).await.unwrap().state
    }

    async fn open_it(&self) {
        for _ in 0..5 {
            self.call(CallOutcome::Failure).await;
        }
        assert_eq!(self.state().await, BreakerState::Open);
    }

    async fn clean(self) {
        clean_redis(&self.client, &self.s).await;
    }
}

fn admitted(a: Admission) -> Call {
    match a {
        Admission::Admit(call) => call,
        refused => panic!("expected an admission, got {refused:?}"),
    }
}

#[tokio::test]
async fn five_consecutive_failures_open_it() {
    let rig = Rig::new().await;
    for _ in 0..4 {
        assert_ne!(rig.call(CallOutcome::Failure).await, BreakerState::Open);
    }
    assert_eq!(rig.call(CallOutcome::Failure).await, BreakerState::Open);
    match rig.breaker.admit(CPM).await.unwrap() {
        Admission::Refused { state: BreakerState::Open, retry_after } => {
            assert_eq!(retry_after, Duration::from_secs(30))
        }
        other => panic!("{other:?}"),
    }
    rig.clean().await;
}

#[tokio::test]
async fn half_failures_over_twenty_calls_open_it_and_degrade_it_first() {
    let rig = Rig::new().await;
    for i in 0..19 {
        let outcome = if i % 2 == 0 { CallOutcome::Success } else { CallOutcome::Failure };
        let state = rig.call(outcome).await;
        if i >= 9 {
            assert_eq!(state, BreakerState::Degraded, "call {i}: elevated failure rate, traffic flows");
        }
        rig.advance(100);
    }
    let view = rig.breaker.state(CPM).await.unwrap();
    assert_eq!((view.calls, view.failures), (19, 9));
    assert_eq!(rig.call(CallOutcome::Failure).await, BreakerState::Open, "10 of 20 failed");
    rig.clean().await;
}

#[tokio::test]
async fn the_window_forgets_old_calls() {
    let rig = Rig::new().await;
    for i in 0..19 {
        rig.call(if i % 2 == 0 { CallOutcome::Success } else { CallOutcome::Failure }).await;
    }
    rig.advance(31_000);
    assert_eq!(rig.state().await, BreakerState::Closed, "the window slid past them");
    assert_eq!(rig.call(CallOutcome::Failure).await, BreakerState::Closed);
    assert_eq!(rig.breaker.state(CPM).await.unwrap().calls, 1);
    rig.clean().await;
}

#[tokio::test]
async fn client_errors_and_429s_never_open_it() {
    let rig = Rig::new().await;
    for _ in 0..50 {
        assert_eq!(rig.call(CallOutcome::Ignored).await, BreakerState::Closed);
    }
    let view = rig.breaker.state(CPM).await.unwrap();
    assert_eq!((view.state, view.calls, view.consecutive_failures), (BreakerState::Closed, 0, 0));
    rig.clean().await;
}

#[tokio::test]
async fn slow_calls_degrade_it_without_opening_it() {
    let rig = Rig::new().await;
    for _ in 0..30 {
        rig.call(CallOutcome::Slow).await;
    }
    let view = rig.breaker.state(CPM).await.unwrap();
    assert_eq!((view.state, view.slow), (BreakerState::Degraded, 30));
    rig.clean().await;
}

#[tokio::test]
async fn it_half_opens_lazily_and_a_probe_success_closes_it() {
    let rig = Rig::new().await;
    rig.open_it().await;
    rig.advance(29_999);
    assert!(matches!(rig.breaker.admit(CPM).await.unwrap(), Admission::Refused { state: BreakerState::Open, .. }));
    rig.advance(1);
    assert_eq!(rig.state().await, BreakerState::HalfOpen, "seen as half-open once the break is over");
    let probe = admitted(rig.breaker.admit(CPM).await.unwrap());
    assert!(probe.is_probe());
    match rig.breaker.admit(CPM).await.unwrap() {
        Admission::Refused { state: BreakerState::HalfOpen, retry_after } => {
            assert_eq!(retry_after, Duration::from_secs(10), "until the probe admission expires")
        }
        other => panic!("one probe at a time: {other:?}"),
    }
    assert_eq!(rig.breaker.state(CPM).await.unwrap().probes_in_flight, 1);
    assert_eq!(rig.breaker.record(CPM, &probe, CallOutcome::Success).await.unwrap(), BreakerState::Closed);
    let call = admitted(rig.breaker.admit(CPM).await.unwrap());
    assert!(!call.is_probe());
    rig.clean().await;
}

#[tokio::test]
async fn a_probe_failure_reopens_it_for_another_break() {
    let rig = Rig::new().await;
    rig.open_it().await;
    rig.advance(30_000);
    let probe = admitted(rig.breaker.admit(CPM).await.unwrap());
    assert_eq!(rig.breaker.record(CPM, &probe, CallOutcome::Failure).await.unwrap(), BreakerState::Open);
    match rig.breaker.admit(CPM).await.unwrap() {
        Admission::Refused { state: BreakerState::Open, retry_after } => {
            assert_eq!(retry_after, Duration::from_secs(30))
        }
        other => panic!("{other:?}"),
    }
    rig.clean().await;
}

#[tokio::test]
async fn a_probe_that_never_reports_expires() {
    let rig = Rig::new().await;
    rig.open_it().await;
    rig.advance(30_000);
    let lost = admitted(rig.breaker.admit(CPM).await.unwrap());
    rig.advance(9_999);
    assert!(matches!(rig.breaker.admit(CPM).await.unwrap(), Admission::Refused { .. }));
    rig.advance(1);
    let next = admitted(rig.breaker.admit(CPM).await.unwrap());
    assert!(next.is_probe() && next.probe != lost.probe);
    assert_eq!(rig.breaker.record(CPM, &next, CallOutcome::Success).await.unwrap(), BreakerState::Closed);
    rig.clean().await;
}

#[tokio::test]
async fn an_outcome_from_before_it_opened_changes_nothing() {
    let rig = Rig::new().await;
    let early = admitted(rig.breaker.admit(CPM).await.unwrap());
    rig.open_it().await;
    rig.advance(30_000);
    let probe = admitted(rig.breaker.admit(CPM).await.unwrap());
    assert_eq!(rig.breaker.record(CPM, &early, CallOutcome::Success).await.unwrap(), BreakerState::HalfOpen);
    assert_ne!(probe.generation, early.generation);
    rig.breaker.reset(CPM).await.unwrap();
    assert_eq!(rig.breaker.record(CPM, &probe, CallOutcome::Failure).await.unwrap(), BreakerState::Closed);
    rig.clean().await;
}

#[tokio::test]
async fn one_pod_opens_it_for_both() {
    let rig = Rig::new().await;
    let other_client = redis(&rig.s).await;
    let other =
        RedisBreaker::new(other_client, keys(&rig.s), &rig.s.outbound.breaker, ScriptClock::Pinned(rig.now.clone()));
    rig.open_it().await;
    assert!(matches!(other.admit(CPM).await.unwrap(), Admission::Refused { state: BreakerState::Open, .. }));
    rig.advance(30_000);
    let probe = admitted(other.admit(CPM).await.unwrap());
    assert!(matches!(rig.breaker.admit(CPM).await.unwrap(), Admission::Refused { state: BreakerState::HalfOpen, .. }));
    other.record(CPM, &probe, CallOutcome::Success).await.unwrap();
    assert_eq!(rig.state().await, BreakerState::Closed);
    assert_eq!(rig.breaker.state(ChannelId::Csm).await.unwrap().state, BreakerState::Closed, "per channel");
    rig.clean().await;
}

#[tokio::test]
async fn with_the_server_clock_it_half_opens_after_the_break() {
    let s = settings("brk", &[("CABINE__OUTBOUND__BREAKER__BREAK_TIME", "300ms")]);
    let client = redis(&s).await;
    let breaker = RedisBreaker::new(client.clone(), keys(&s), &s.outbound.breaker, ScriptClock::Server);
    for _ in 0..5 {
        let call = admitted(breaker.admit(CPM).await.unwrap());
        breaker.record(CPM, &call, CallOutcome::Failure).await.unwrap();
    }
    assert!(matches!(breaker.admit(CPM).await.unwrap(), Admission::Refused { state: BreakerState::Open, .. }));
    tokio::time::sleep(Duration::from_millis(350)).await;
    let probe = admitted(breaker.admit(CPM).await.unwrap());
    assert!(probe.is_probe());
    breaker.record(CPM, &probe, CallOutcome::Slow).await.unwrap();
    assert_eq!(breaker.state(CPM).await.unwrap().state, BreakerState::Closed);
    clean_redis(&client, &s).await;
}
