//! Random walks through one configuration, printing where they end (for sizing).

use cabine_model::{Config, SlotProtocol};
use stateright::Model;

fn main() {
    let name = std::env::args().nth(1).unwrap_or_default();
    let cfg = Config::protocols().into_iter().chain(Config::controls()).find(|c| c.name.contains(&name)).unwrap();
    let model = SlotProtocol::new(cfg.clone());
    let mut seed: u64 = 12345;
    for _ in 0..5 {
        let mut w = model.init_states().remove(0);
        for _ in 0..300 {
            let mut acts = Vec::new();
            model.actions(&w, &mut acts);
            if acts.is_empty() {
                break;
            }
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let a = acts[(seed >> 33) as usize % acts.len()];
            w = model.next_state(&w, a).unwrap();
        }
        println!("{}\n{:?}\n", w.summary(&cfg), w.ghost);
    }
}
