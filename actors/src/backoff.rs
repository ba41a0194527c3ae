//! Retry delays: exponential with full jitter (errors of a slot or a campaign)
//! and a jittered interval (standby acquire attempts), so that pods and slots
//! never retry in lock step.

use std::time::Duration;

/// Exponential backoff with full jitter: the k-th delay is uniform in
/// `[0, min(max, base × 2^k)]`.
#[derive(Clone, Debug)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    pub fn new(base: Duration, max: Duration) -> Self {
        Backoff { base, max, attempt: 0 }
    }

    /// The ceiling of the next delay, before jitter.
    pub fn ceiling(&self) -> Duration {
        self.base.saturating_mul(1u32 << self.attempt.min(20)).min(self.max)
    }

    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling();
        self.attempt = self.attempt.saturating_add(1);
        ceiling.mul_f64(rand::random_range(0.0..=1.0))
    }

    /// Consecutive failures so far.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }

    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// `every` spread uniformly over `[every/2, every × 3/2]`.
pub fn jittered(every: Duration) -> Duration {
    every.mul_f64(rand::random_range(0.5..=1.5))
}

/// `d` spread over `[d/2, d]`: restart delays keep their order of magnitude.
pub fn half_jittered(d: Duration) -> Duration {
    d.mul_f64(rand::random_range(0.5..=1.0))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn delays_stay_under_a_doubling_ceiling_capped_at_max(base_ms in 1u64..1000, max_ms in 1000u64..60_000, n in 1usize..40) {
            let (base, max) = (Duration::from_millis(base_ms), Duration::from_millis(max_ms));
            let mut b = Backoff::new(base, max);
            for k in 0..n {
                let ceiling = b.ceiling();
                prop_assert_eq!(ceiling, base.saturating_mul(1u32 << (k as u32).min(20)).min(max));
                prop_assert!(b.next_delay() <= ceiling);
            }
            b.reset();
            prop_assert_eq!(b.ceiling(), base.min(max));
        }
    }
}
