//! The operation token bucket per (ispb, channel), DESIGN §1 (I): primary 3750
//! tokens refilled at 750/s; secondary 350/35 per s from 08:00 to 23:59 and
//! 5000/350 from 00:00 to 07:59 (Brasília time). A pacs.008 costs 1, a pacs.002
//! 0.2, anything else 1. Refill is lazy, on each take.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use cabine_actors::domain::ChannelId;

use super::clock::brasilia_hour;

/// Capacity and refill of one bucket, written `capacity/refill_per_s` (e.g. `3750/750`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BucketRate {
    pub capacity: f64,
    pub refill_per_s: f64,
}

impl BucketRate {
    pub const fn new(capacity: f64, refill_per_s: f64) -> Self {
        BucketRate { capacity, refill_per_s }
    }
}

impl FromStr for BucketRate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let err = || format!("a bucket is `capacity/refill_per_s` with positive numbers, got {s:?}");
        let (cap, rate) = s.split_once('/').ok_or_else(err)?;
        let capacity: f64 = cap.trim().parse().map_err(|_| err())?;
        let refill_per_s: f64 = rate.trim().parse().map_err(|_| err())?;
        if !(capacity.is_finite() && refill_per_s.is_finite() && capacity > 0.0 && refill_per_s > 0.0) {
            return Err(err());
        }
        Ok(BucketRate { capacity, refill_per_s })
    }
}

impl fmt::Display for BucketRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.capacity, self.refill_per_s)
    }
}

/// The rates of both channels, the secondary's by time of day.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BucketRates {
    pub primary: BucketRate,
    /// 08:00–23:59 Brasília time.
    pub secondary_day: BucketRate,
    /// 00:00–07:59 Brasília time.
    pub secondary_night: BucketRate,
}

impl Default for BucketRates {
    fn default() -> Self {
        BucketRates {
            primary: BucketRate::new(3750.0, 750.0),
            secondary_day: BucketRate::new(350.0, 35.0),
            secondary_night: BucketRate::new(5000.0, 350.0),
        }
    }
}

impl BucketRates {
    pub fn for_channel(&self, channel: ChannelId, now: SystemTime) -> BucketRate {
        match channel {
            ChannelId::Cpm => self.primary,
            ChannelId::Csm if brasilia_hour(now) < 8 => self.secondary_night,
            ChannelId::Csm => self.secondary_day,
        }
    }
}

/// What one message costs, by its message definition (`pacs.008.spi.1.16` …).
pub fn cost_of(msg_def: Option<&str>) -> f64 {
    match msg_def {
        Some(d) if d.starts_with("pacs.002") => 0.2,
        _ => 1.0,
    }
}

/// One bucket. Tokens are fractional (a pacs.002 costs 0.2).
#[derive(Debug)]
pub struct TokenBucket {
    tokens: f64,
    last: SystemTime,
}

/// Rounding slack so that five 0.2 costs make exactly one token.
const EPSILON: f64 = 1e-9;

impl TokenBucket {
    /// A full bucket.
    pub fn full(rate: BucketRate, now: SystemTime) -> Self {
        TokenBucket { tokens: rate.capacity, last: now }
    }

    /// Takes `cost` tokens, or says how long until they would be there. A cost above the
    /// capacity is capped at it (a full bucket always admits one request).
    pub fn try_take(&mut self, cost: f64, rate: BucketRate, now: SystemTime) -> Result<(), Duration> {
        self.refill(rate, now);
        let cost = cost.min(rate.capacity);
        if self.tokens + EPSILON >= cost {
            self.tokens = (self.tokens - cost).max(0.0);
            Ok(())
        } else {
            Err(Duration::from_secs_f64((cost - self.tokens) / rate.refill_per_s))
        }
    }

    #[cfg(test)]
    pub fn tokens(&mut self, rate: BucketRate, now: SystemTime) -> f64 {
        self.refill(rate, now);
        self.tokens
    }

    fn refill(&mut self, rate: BucketRate, now: SystemTime) {
        let elapsed = now.duration_since(self.last).unwrap_or(Duration::ZERO);
        if now > self.last {
            self.last = now;
        }
        self.tokens = (self.tokens + elapsed.as_secs_f64() * rate.refill_per_s).min(rate.capacity);
    }
}

/// `Retry-After` in whole seconds (at least 1) for a wait.
pub fn retry_after_secs(wait: Duration) -> u64 {
    wait.as_secs_f64().ceil().max(1.0) as u64
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    fn at(secs: f64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs_f64(1_000_000.0 + secs)
    }

    #[test]
    fn a_bucket_empties_then_refills_at_its_rate() {
        let rate = BucketRate::new(10.0, 5.0);
        let mut b = TokenBucket::full(rate, at(0.0));
        for _ in 0..10 {
            assert!(b.try_take(1.0, rate, at(0.0)).is_ok());
        }
        let wait = b.try_take(1.0, rate, at(0.0)).unwrap_err();
        assert!((wait.as_secs_f64() - 0.2).abs() < 1e-6, "{wait:?}");
        assert_eq!(retry_after_secs(wait), 1);
        assert!(b.try_take(1.0, rate, at(0.2)).is_ok());
        assert!(b.try_take(1.0, rate, at(0.2)).is_err());
        assert!((b.tokens(rate, at(100.0)) - 10.0).abs() < 1e-9, "refill is capped at capacity");
    }

    #[test]
    fn five_pacs002_cost_one_token() {
        let rate = BucketRate::new(1.0, 0.001);
        let mut b = TokenBucket::full(rate, at(0.0));
        for _ in 0..5 {
            assert!(b.try_take(cost_of(Some("pacs.002.spi.1.17")), rate, at(0.0)).is_ok());
        }
        assert!(b.try_take(0.2, rate, at(0.0)).is_err());
        assert_eq!(cost_of(Some("pacs.008.spi.1.16")), 1.0);
        assert_eq!(cost_of(None), 1.0);
    }

    #[test]
    fn the_secondary_rate_follows_brasilia_time() {
        let rates = BucketRates::default();
        let day = UNIX_EPOCH + Duration::from_secs(86_400 + 12 * 3_600); // 09:00 in Brasília
        let night = UNIX_EPOCH + Duration::from_secs(86_400 + 5 * 3_600); // 02:00 in Brasília
        assert_eq!(rates.for_channel(ChannelId::Csm, day), BucketRate::new(350.0, 35.0));
        assert_eq!(rates.for_channel(ChannelId::Csm, night), BucketRate::new(5000.0, 350.0));
        assert_eq!(rates.for_channel(ChannelId::Cpm, night), BucketRate::new(3750.0, 750.0));
    }

    #[test]
    fn rates_parse_from_the_command_line() {
        assert_eq!("3750/750".parse::<BucketRate>(), Ok(BucketRate::new(3750.0, 750.0)));
        assert!("3750".parse::<BucketRate>().is_err());
        assert!("0/1".parse::<BucketRate>().is_err());
    }
}
