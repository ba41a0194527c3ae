//! Runs the checker on a configuration and reports what it found: the figures (unique states,
//! depth, time) and, for each violated property, the path that breaks it.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, HasDiscoveries, Model, Path};

use crate::config::{Config, Expect};
use crate::model::{Action, SlotProtocol};
use crate::properties::{PERSISTED, SAFETY};
use crate::state::World;

/// What one run of the checker found.
pub struct Outcome {
    pub name: &'static str,
    pub states: usize,
    pub depth: usize,
    pub elapsed: Duration,
    /// Properties with a discovery: counterexamples for `always`/`eventually`, examples for
    /// `sometimes`.
    pub found: Vec<(&'static str, Path<World, Action>)>,
    /// The checker ran to its end: every reachable state visited, or (a control) every
    /// counterexample it looks for found.
    pub complete: bool,
}

impl Outcome {
    pub fn violated(&self) -> Vec<&'static str> {
        let failures: BTreeSet<&str> = SAFETY.iter().copied().chain([PERSISTED]).collect();
        self.found.iter().map(|(name, _)| *name).filter(|n| failures.contains(n)).collect()
    }

    pub fn path(&self, property: &str) -> Option<&Path<World, Action>> {
        self.found.iter().find(|(n, _)| *n == property).map(|(_, p)| p)
    }
}

/// Explores the configuration breadth first (shortest counterexamples first). A control stops
/// as soon as it found every counterexample it expects.
pub fn check(cfg: Config) -> Outcome {
    let name = cfg.name;
    let expect = cfg.expect.clone();
    let mut builder = SlotProtocol::new(cfg).checker();
    if let Expect::Violates(props) = expect {
        builder = builder.finish_when(HasDiscoveries::AllOf(props.iter().copied().collect()));
    }
    let start = Instant::now();
    let checker = builder.spawn_bfs().join();
    let elapsed = start.elapsed();
    let mut found: Vec<_> = checker.discoveries().into_iter().collect();
    found.sort_by_key(|(n, _)| *n);
    Outcome {
        name,
        states: checker.unique_state_count(),
        depth: checker.max_depth(),
        elapsed,
        found,
        complete: checker.is_done(),
    }
}

/// The path as one line per action, each followed by a short account of the world after it.
/// Stateright keeps the path of the last violating state it visited, not the first, so a path
/// to a broken `always` property is cut at the first state that breaks it.
pub fn describe(model: &SlotProtocol, property: &str, path: &Path<World, Action>) -> String {
    let mut out = String::new();
    let steps = path.clone().into_vec();
    let always = model.property_named(property).filter(|p| p.expectation == Expectation::Always);
    let mut tick = 0;
    for (i, (_, action)) in steps.iter().enumerate() {
        let Some(action) = action else { continue };
        if *action == Action::Tick {
            tick += 1;
            continue;
        }
        let after = &steps[i + 1].0;
        let _ = writeln!(out, "  t={tick:<2} {action:?}\n         {}", after.summary(&model.cfg));
        if always.as_ref().is_some_and(|p| !(p.condition)(model, after)) {
            let _ = writeln!(out, "  t={tick:<2} (\"{property}\" is broken here)");
            return out;
        }
    }
    let _ = writeln!(out, "  t={tick:<2} (end of the path)");
    out
}
