//! The simulator's wall clock, injectable so tests can stand at any hour of the
//! day (the secondary channel's token bucket changes with the Brasília time).

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Wall-clock time as the simulator sees it (message timestamps, bucket refill, ledger times).
pub trait SimClock: Send + Sync + 'static {
    fn now(&self) -> SystemTime;
}

/// The machine's clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl SimClock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told: for tests of time-of-day and refill behaviour.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<SystemTime>,
}

impl ManualClock {
    pub fn at(now: SystemTime) -> Self {
        ManualClock { now: Mutex::new(now) }
    }

    /// A clock at `unix_secs` seconds after the epoch.
    pub fn at_unix(unix_secs: u64) -> Self {
        Self::at(UNIX_EPOCH + Duration::from_secs(unix_secs))
    }

    pub fn set(&self, now: SystemTime) {
        *self.now.lock().unwrap_or_else(|p| p.into_inner()) = now;
    }

    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(|p| p.into_inner());
        *now += by;
    }
}

impl SimClock for ManualClock {
    fn now(&self) -> SystemTime {
        *self.now.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Milliseconds since the Unix epoch (0 before it).
pub fn unix_millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The hour (0..=23) on the Brasília wall clock (UTC-3, no daylight saving since 2019).
pub fn brasilia_hour(t: SystemTime) -> u32 {
    let secs = t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let local = secs + 86_400 - 3 * 3_600;
    ((local % 86_400) / 3_600) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brasilia_is_three_hours_behind_utc() {
        // 1970-01-02T02:00:00Z is 23:00 of Jan 1st in Brasília.
        assert_eq!(brasilia_hour(UNIX_EPOCH + Duration::from_secs(86_400 + 2 * 3_600)), 23);
        assert_eq!(brasilia_hour(UNIX_EPOCH + Duration::from_secs(86_400 + 11 * 3_600)), 8);
        assert_eq!(brasilia_hour(UNIX_EPOCH + Duration::from_secs(86_400 + 3 * 3_600)), 0);
    }

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let clock = ManualClock::at_unix(1_000);
        assert_eq!(unix_millis(clock.now()), 1_000_000);
        clock.advance(Duration::from_millis(1_500));
        assert_eq!(unix_millis(clock.now()), 1_001_500);
    }
}
