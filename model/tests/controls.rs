//! Negative controls: with one safeguard off, the checker must find the counterexample it is
//! meant to find. A checker that cannot fail proves nothing.

use cabine_model::config::Expect;
use cabine_model::{Config, SlotProtocol, check, describe};

fn violates(cfg: Config) {
    let Expect::Violates(expected) = cfg.expect else { panic!("{} is not a control", cfg.name) };
    let model = SlotProtocol::new(cfg.clone());
    let outcome = check(cfg);
    println!("{}: {} states, depth {}, {:.1?}", outcome.name, outcome.states, outcome.depth, outcome.elapsed);
    for property in expected {
        let path = outcome.path(property).unwrap_or_else(|| panic!("no counterexample to \"{property}\""));
        println!(
            "counterexample to \"{property}\" ({} actions):\n{}",
            path.clone().into_actions().len(),
            describe(&model, property, path)
        );
    }
}

#[test]
fn no_gate_eviction() {
    violates(Config::no_gate_eviction());
}

#[test]
fn no_gate_drain() {
    violates(Config::no_gate_drain());
}

#[test]
fn no_lock_delay() {
    violates(Config::no_lock_delay());
}

#[test]
fn no_quarantine() {
    violates(Config::no_quarantine());
}

#[test]
fn no_fence() {
    violates(Config::no_fence());
}

#[test]
fn no_abort_wait() {
    violates(Config::no_abort_wait());
}

#[test]
fn short_recovery_bound() {
    violates(Config::short_recovery());
}
