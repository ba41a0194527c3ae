//! When a holding slot polls next: long-poll pacing (a floor after an
//! immediate 204) and scheduled polls aligned to UNIX-time multiples of the
//! cycle, slot n offset by `(n − 1) × stagger`, so every pod — and a restarted
//! slot — keeps the same schedule.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::config::PollMode;

/// UNIX time read once, then advanced by the monotonic clock: immune to wall
/// clock steps while running (and consistent with tokio's paused time in tests).
#[derive(Clone, Copy, Debug)]
pub struct WallClock {
    unix_at_base: Duration,
    base: Instant,
}

impl WallClock {
    pub fn start() -> Self {
        let unix_at_base = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        WallClock { unix_at_base, base: Instant::now() }
    }

    pub fn unix_now(&self) -> Duration {
        self.unix_at_base + self.base.elapsed()
    }

    /// The same instant as a `SystemTime` (deadlines are wall-clock instants).
    pub fn now(&self) -> SystemTime {
        UNIX_EPOCH + self.unix_now()
    }
}

/// Slot `n`'s offset within the cycle.
pub fn slot_offset(n: u8, cycle: Duration, stagger: Duration) -> Duration {
    let offset = stagger.as_nanos() * u128::from(n.saturating_sub(1));
    Duration::from_nanos((offset % cycle.as_nanos().max(1)) as u64)
}

/// Time from `unix_now` to the next instant `k × cycle + offset` strictly after it.
pub fn until_next_tick(unix_now: Duration, cycle: Duration, offset: Duration) -> Duration {
    let (now, cycle, offset) = (unix_now.as_nanos(), cycle.as_nanos().max(1), offset.as_nanos());
    let since = (now + cycle - offset % cycle) % cycle;
    Duration::from_nanos((cycle - since) as u64)
}

/// Delay before the next poll after an empty answer that took `took`.
pub fn after_empty(mode: PollMode, n: u8, took: Duration, floor: Duration, clock: &WallClock) -> Duration {
    match mode {
        PollMode::LongPoll => floor.saturating_sub(took),
        PollMode::Scheduled { cycle, stagger } => {
            until_next_tick(clock.unix_now(), cycle, slot_offset(n, cycle, stagger))
        }
    }
}

/// Delay before a freshly granted slot's first poll.
pub fn first_poll(mode: PollMode, n: u8, clock: &WallClock) -> Duration {
    match mode {
        PollMode::LongPoll => Duration::ZERO,
        PollMode::Scheduled { cycle, stagger } => {
            until_next_tick(clock.unix_now(), cycle, slot_offset(n, cycle, stagger))
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn ticks_are_aligned_to_the_cycle_plus_the_slot_offset() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        assert_eq!(slot_offset(3, s(1), ms(300)), ms(600));
        assert_eq!(slot_offset(5, s(1), ms(300)), ms(200));
        assert_eq!(until_next_tick(ms(10_250), s(1), ms(600)), ms(350));
        assert_eq!(until_next_tick(ms(10_600), s(1), ms(600)), s(1));
        assert_eq!(until_next_tick(ms(10_700), s(1), ms(600)), ms(900));
    }

    proptest! {
        #[test]
        fn the_next_tick_lands_on_the_grid_within_one_cycle(now in 0u64..10_000_000, cycle in 1u64..100_000, off in 0u64..100_000) {
            let (now, cycle, off) = (Duration::from_millis(now), Duration::from_millis(cycle), Duration::from_millis(off));
            let wait = until_next_tick(now, cycle, off);
            prop_assert!(wait > Duration::ZERO && wait <= cycle);
            prop_assert_eq!((now + wait).as_nanos() % cycle.as_nanos(), off.as_nanos() % cycle.as_nanos());
        }
    }
}
