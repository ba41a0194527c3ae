//! `cabine chaos`, short profile (CI): each scenario runs 15 s of traffic
//! (100 inbound/s, 50 outbound/s) and faults against 4 real pods, a child
//! simulator (50 ms latency) and a private redis-server, then is judged from the simulator and
//! the stores (see `src/chaos/`). One scenario at a time (nextest group
//! `cluster`). The long profile is in the README ("Chaos").

use std::time::Duration;

use cabine::chaos::{ChaosConfig, ChaosReport, Outcome, Scenario, run_scenario};

/// Until the durable request gate (DESIGN §2.5) is merged, cabine loses
/// acknowledged messages and goes over the cap under key eviction, snapshot
/// rollback and rolling deploys, so those scenarios are judged but their
/// verdict is not asserted. Flip to `true` with the gate: then they must pass.
const GATE_MERGED: bool = false;

/// The long profile's world (4 pods, 100 inbound/s, 50 outbound/s, 50 ms latency), 15 s per scenario.
fn short_profile(seed: u64) -> ChaosConfig {
    ChaosConfig { seed, seconds: Duration::from_secs(15), ..ChaosConfig::default() }
}

async fn judged(scenario: Scenario, seed: u64) -> Box<ChaosReport> {
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_cabine"));
    match run_scenario(&exe, &short_profile(seed), scenario).await {
        Outcome::Judged(report) => {
            eprintln!("{}", serde_json::to_string(&report).unwrap_or_default());
            report
        }
        other => panic!("{scenario} was not judged: {other:?}"),
    }
}

/// What every run must show, fixed or not: faults applied cleanly, traffic that
/// got through, a cluster that settled, no payment accepted twice by the SPI.
fn exercised(r: &ChaosReport) {
    assert!(
        r.faults > 0 && r.fault_errors == 0,
        "{}: faults {} (errors {:?})",
        r.scenario,
        r.faults,
        r.fault_error_sample
    );
    assert!(r.injected > 0 && r.persisted > 0 && r.outbound_published > 0, "{}: traffic flowed", r.scenario);
    assert_eq!(r.duplicates_at_sim, 0, "{}: an outbound MsgId accepted twice", r.scenario);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_pause_and_redis_restart_keep_every_invariant() {
    for scenario in [Scenario::Kill, Scenario::Pause, Scenario::RedisRestart] {
        let r = judged(scenario, 1).await;
        exercised(&r);
        assert!(r.ok, "{scenario} failed {:?}: {}", r.failed, serde_json::to_string(&r).unwrap_or_default());
    }
}

/// Today, before the gate: the long profile (60 s, README "Chaos") fails `redis-evict`
/// on every seed (`over_cap` 4–6: a 7th simultaneous request refused, `max_in_flight` 7)
/// and `redis-rollback` under a heavier load (`over_cap` 8); with the simulator of main,
/// which drops an aborted request at once, nothing is lost and `term` passes. This short
/// profile applies one fault per scenario and passed all three on 2026-12-01, so no
/// failure is asserted: only that each was exercised. With the simulator that keeps an
/// aborted GET in flight (branch `sim`), `term` and `redis-rollback` are expected to show
/// `lost` and `concurrent_reads`. With the gate, all three must pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_evict_rollback_and_term_are_judged_and_must_pass_once_the_gate_merges() {
    for scenario in [Scenario::RedisEvict, Scenario::RedisRollback, Scenario::Term] {
        let r = judged(scenario, 1).await;
        exercised(&r);
        if GATE_MERGED {
            assert!(r.ok, "{scenario} failed {:?}: {}", r.failed, serde_json::to_string(&r).unwrap_or_default());
        } else if !r.ok {
            eprintln!("{scenario}: fails today as expected without the gate: {:?}", r.failed);
        }
    }
}
