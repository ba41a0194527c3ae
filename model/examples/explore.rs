//! Explores one configuration by name (optionally with another fault budget and message count)
//! and prints its figures: a sizing tool, `cargo run -p cabine-model --example explore -- NAME`.

use std::time::Instant;

use cabine_model::properties::SAFETY;
use cabine_model::{Config, SlotProtocol, describe};
use stateright::{Checker, Model};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let name = args.get(1).cloned().unwrap_or_default();
    let mut cfg = Config::protocols()
        .into_iter()
        .chain(Config::controls())
        .find(|c| c.name.contains(&name))
        .expect("no such configuration");
    if let Some(b) = args.get(2).and_then(|s| s.parse().ok()) {
        cfg.faults.budget = b;
    }
    if let Some(m) = args.get(3).and_then(|s| s.parse().ok()) {
        cfg.messages = m;
    }
    cfg.symmetry = !args.iter().any(|a| a == "nosym");
    if let Some(kinds) = args.iter().find_map(|a| a.strip_prefix("kinds=")) {
        use cabine_model::config::FaultKind::*;
        let all = [Pause, Crash, Drain, RedisForget, RedisEvict, RedisRollback, RequestDelay, AnswerLost];
        let picked: Vec<_> = all.into_iter().filter(|k| kinds.split(',').any(|n| format!("{k:?}") == n)).collect();
        cfg.faults.kinds = Box::leak(picked.into_boxed_slice());
    }
    if let Some(r) = args.iter().find_map(|a| a.strip_prefix("recovery=")) {
        cfg.recovery = r.parse().unwrap();
    }
    let show = args.iter().any(|a| a == "show");
    let limit: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(20_000_000);
    let start = Instant::now();
    let model = SlotProtocol::new(cfg.clone());
    let c = SlotProtocol::new(cfg.clone()).checker().target_state_count(limit).spawn_bfs().join();
    let mut found: Vec<_> = c.discoveries().into_keys().collect();
    found.sort();
    println!(
        "{} budget {} messages {}: {} states, depth {}, {:.1?}, done {}, found {:?}",
        cfg.name,
        cfg.faults.budget,
        cfg.messages,
        c.unique_state_count(),
        c.max_depth(),
        start.elapsed(),
        c.is_done(),
        found
    );
    if show {
        for (name, path) in c.discoveries() {
            if SAFETY.contains(&name) || name.starts_with("once") {
                println!("{name}:\n{}", describe(&model, name, &path));
            }
        }
    }
}
