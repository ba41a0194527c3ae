//! Latency histograms of the benchmarks (microseconds, hdrhistogram), carried
//! from worker processes to the parent as `[value, count]` pairs and merged there.

use std::time::Duration;

use hdrhistogram::Histogram;

/// Microseconds from 1 µs to 10 min, 3 significant digits.
pub struct Latency(Histogram<u64>);

impl Default for Latency {
    fn default() -> Self {
        Latency(Histogram::new_with_bounds(1, 600_000_000, 3).expect("static bounds are valid"))
    }
}

impl Latency {
    pub fn record(&mut self, d: Duration) {
        self.0.saturating_record(u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1));
    }

    /// Value at quantile `q` (0..=1) in µs; 0 when empty.
    pub fn quantile_us(&self, q: f64) -> u64 {
        if self.0.is_empty() { 0 } else { self.0.value_at_quantile(q) }
    }

    pub fn len(&self) -> u64 {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn add(&mut self, other: &Latency) {
        let _ = self.0.add(&other.0);
    }

    /// Every recorded value with its count.
    pub fn to_pairs(&self) -> Vec<(u64, u64)> {
        self.0.iter_recorded().map(|v| (v.value_iterated_to(), v.count_at_value())).collect()
    }

    pub fn add_pairs(&mut self, pairs: &[(u64, u64)]) {
        for &(value, count) in pairs {
            self.0.saturating_record_n(value.max(1), count);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip_and_merge() {
        let mut a = Latency::default();
        for us in [100, 200, 300, 400] {
            a.record(Duration::from_micros(us));
        }
        let mut b = Latency::default();
        b.add_pairs(&a.to_pairs());
        b.add_pairs(&a.to_pairs());
        assert_eq!(b.len(), 8);
        assert_eq!(b.quantile_us(0.5), a.quantile_us(0.5));
        assert_eq!(Latency::default().quantile_us(0.5), 0);
    }
}
