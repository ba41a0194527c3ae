//! The full protocol under every fault: no safety counterexample, and every received message
//! is persisted within the recovery bound once faults stop.

use cabine_model::properties::{ALL_PERSISTED, TAKEOVER};
use cabine_model::{Config, SlotProtocol, check, describe};

fn holds(cfg: Config) {
    let model = SlotProtocol::new(cfg.clone());
    let outcome = check(cfg);
    println!("{}: {} states, depth {}, {:.1?}", outcome.name, outcome.states, outcome.depth, outcome.elapsed);
    for property in outcome.violated() {
        let path = outcome.path(property).expect("a discovery has a path");
        println!("counterexample to \"{property}\":\n{}", describe(&model, property, path));
    }
    assert!(outcome.complete, "the checker stopped before exploring every state");
    assert!(outcome.violated().is_empty(), "violated: {:?}", outcome.violated());
    // Not vacuous: takeovers happen and messages get through.
    for example in [TAKEOVER, ALL_PERSISTED] {
        assert!(outcome.path(example).is_some(), "never reached: {example}");
    }
}

#[test]
fn pod_faults() {
    holds(Config::pod_faults());
}

#[test]
fn redis_restarts() {
    holds(Config::redis_restarts());
}

#[test]
fn redis_eviction_and_pauses() {
    holds(Config::redis_eviction());
}

#[test]
fn redis_snapshot_restores() {
    holds(Config::redis_rollback());
}

#[test]
fn any_fault_two_messages() {
    holds(Config::any_fault());
}
