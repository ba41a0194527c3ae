//! The fault schedule of one run, decided by the seed alone: after a warm-up,
//! faults at roughly regular intervals (a seeded jitter within each interval),
//! each with its own length and a number that picks the victim among the pods
//! holding stream slots at that moment; the end of the run is left fault-free
//! so that the cluster settles before the verdict.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::scenario::{Scenario, Timing};

/// One fault to apply.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedFault {
    /// Since the traffic started.
    pub at: Duration,
    /// The fault's length (see [`Scenario::hold_range`]).
    pub hold: Duration,
    /// Picks the victim: index into the holders, modulo their number.
    pub pick: u64,
}

/// Every fault of one run, in time order.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub scenario: Scenario,
    pub faults: Vec<PlannedFault>,
    /// No fault starts at or after this point.
    pub quiet_from: Duration,
}

impl Plan {
    /// The schedule of `scenario` for a run of `run` under `timing`, from `seed`.
    pub fn new(scenario: Scenario, seed: u64, run: Duration, timing: Timing) -> Plan {
        let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (scenario.index() + 1));
        let warm_up = (run / 10).clamp(Duration::from_secs(2), Duration::from_secs(10));
        let quiet = (run / 4).clamp(Duration::from_secs(5), Duration::from_secs(15));
        let quiet_from = run.saturating_sub(quiet);
        let window = quiet_from.saturating_sub(warm_up);
        let spacing = scenario.spacing(timing);
        let count = if window.is_zero() { 0 } else { (window.as_millis() / spacing.as_millis().max(1)).max(1) as u32 };
        let step = if count == 0 { Duration::ZERO } else { window / count };
        let (short, long) = scenario.hold_range(timing);
        let faults = (0..count)
            .map(|i| {
                // Jitter within the first 30 % of the interval, so the rest stays for the recovery.
                let jitter = step.mul_f64(rng.random_range(0.0..0.3));
                let hold = short + (long - short).mul_f64(rng.random_range(0.0..=1.0));
                PlannedFault { at: warm_up + step * i + jitter, hold, pick: rng.random() }
            })
            .collect();
        Plan { scenario, faults, quiet_from }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timing = Timing { lease: Duration::from_secs(2), lock_delay: Duration::from_secs(1) };
    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn the_same_seed_gives_the_same_plan_and_another_seed_another() {
        let a = Plan::new(Scenario::Kill, 1, MINUTE, T);
        assert_eq!(a, Plan::new(Scenario::Kill, 1, MINUTE, T));
        assert_ne!(a, Plan::new(Scenario::Kill, 2, MINUTE, T));
        assert_ne!(a.faults, Plan::new(Scenario::Term, 1, MINUTE, T).faults);
    }

    #[test]
    fn a_minute_holds_many_faults_in_order_with_a_quiet_end() {
        for s in Scenario::ALL {
            let plan = Plan::new(s, 7, MINUTE, T);
            assert!(plan.faults.len() >= 3, "{s}: {}", plan.faults.len());
            assert!(plan.faults.windows(2).all(|w| w[1].at >= w[0].at + s.spacing(T).mul_f64(0.7)), "{s}");
            let last = plan.faults.last().map(|f| f.at + f.hold).unwrap_or_default();
            assert!(last <= plan.quiet_from + s.hold_range(T).1, "{s}");
            assert!(plan.quiet_from <= MINUTE - Duration::from_secs(5));
        }
    }

    #[test]
    fn holds_stay_within_the_scenario_range() {
        for s in Scenario::ALL {
            let (short, long) = s.hold_range(T);
            for f in Plan::new(s, 3, MINUTE, T).faults {
                assert!(f.hold >= short && f.hold <= long, "{s}: {:?}", f.hold);
            }
        }
    }

    #[test]
    fn a_short_run_still_applies_a_fault_and_a_tiny_one_none() {
        assert!(!Plan::new(Scenario::Kill, 1, Duration::from_secs(15), T).faults.is_empty());
        assert!(Plan::new(Scenario::Kill, 1, Duration::from_secs(5), T).faults.is_empty());
    }
}
