//! Failover of a stream slot that this pod cannot serve: a holder whose poll
//! cycles keep failing (`after_failures` in a row, or for `after`) hands the
//! slot over — the stream and its stored cursor stay for the next holder — and
//! this pod's Slot(n) stays out of acquiring for a cooldown, so another pod
//! takes it. A fault local to the pod (its network, its certificate) then
//! costs one failover instead of a slot dead while held.
//!
//! The cooldown doubles with each failover of the channel on this pod that no
//! successful cycle separates (a pod-local fault that outlives a cooldown is
//! probed ever more rarely), capped at `cooldown_max`. While any slot of a
//! channel cools, the pod steps back from that channel's fair share (see
//! [`crate::fair`]) and publishes the cooldown in its heartbeat.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{TreeConfigError, TreeTiming};
use crate::domain::{ChannelId, SlotId};
use crate::ledger::slot_name;
use crate::ports::Pool;

/// When a failing holder gives its slot up, and for how long it stays out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailoverConfig {
    /// Consecutive failed poll cycles that make a holder hand its slot over...
    pub after_failures: u32,
    /// ...or continuous failure for this long, whichever comes first.
    pub after: Duration,
    /// How long the slot's actor on this pod stays out after a failover (first time).
    pub cooldown: Duration,
    /// Ceiling of the doubling cooldown.
    pub cooldown_max: Duration,
    /// A slot free for this long (no holder) may be adopted by a pod over its
    /// fair share: its rightful pod is alive but does not take it.
    pub orphan_grace: Duration,
}

impl Default for FailoverConfig {
    /// Orphan grace = lease 12 s + lock-delay 8 s + one acquire interval (DESIGN §6).
    fn default() -> Self {
        FailoverConfig {
            after_failures: 5,
            after: Duration::from_secs(20),
            cooldown: Duration::from_secs(60),
            cooldown_max: Duration::from_secs(600),
            orphan_grace: Duration::from_secs(21),
        }
    }
}

impl FailoverConfig {
    pub fn validate(&self, timing: &TreeTiming) -> Result<(), TreeConfigError> {
        let fail = |key, rule| Err(TreeConfigError { key, rule });
        if self.after_failures == 0 || self.after.is_zero() {
            return fail("failover.after_failures, failover.after", "must be > 0");
        }
        if self.cooldown.is_zero() || self.cooldown > self.cooldown_max {
            return fail("failover.cooldown", "must be > 0 and <= cooldown_max");
        }
        if self.orphan_grace < timing.acquire_interval * 2 + timing.heartbeat {
            return fail(
                "failover.orphan_grace",
                "must be >= 2 x acquire_interval + heartbeat (the rightful pod takes a free slot first)",
            );
        }
        Ok(())
    }

    /// The cooldown of the `streak`-th failover in a row (1-based): doubling, capped.
    pub fn cooldown_for(&self, streak: u32) -> Duration {
        let doublings = streak.saturating_sub(1).min(20);
        self.cooldown.saturating_mul(1u32 << doublings).min(self.cooldown_max)
    }
}

/// Consecutive failed poll cycles of one holding slot.
#[derive(Clone, Debug, Default)]
pub struct FailureRun {
    count: u32,
    since: Option<Instant>,
}

impl FailureRun {
    /// One more failed cycle at `now`; returns how many in a row.
    pub fn record(&mut self, now: Instant) -> u32 {
        self.count = self.count.saturating_add(1);
        self.since.get_or_insert(now);
        self.count
    }

    pub fn reset(&mut self) {
        *self = FailureRun::default();
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    /// How long the cycles have been failing.
    pub fn failing_for(&self, now: Instant) -> Duration {
        self.since.map_or(Duration::ZERO, |s| now.saturating_duration_since(s))
    }

    /// The failover rule: `after_failures` in a row, or failing for `after`.
    pub fn due(&self, now: Instant, config: &FailoverConfig) -> bool {
        self.count > 0 && (self.count >= config.after_failures || self.failing_for(now) >= config.after)
    }

    /// Time left until continuous failure reaches `after` (a backoff never sleeps past it).
    pub fn time_left(&self, now: Instant, config: &FailoverConfig) -> Duration {
        config.after.saturating_sub(self.failing_for(now))
    }
}

#[derive(Default)]
struct Book {
    until: BTreeMap<SlotId, Instant>,
    /// Failovers per channel since the last successful cycle on this pod.
    streak: BTreeMap<ChannelId, u32>,
}

/// The pod's failover cooldowns, shared by its slots (a restarted slot still
/// sits its cooldown out) and read by the heartbeat.
#[derive(Default)]
pub struct FailoverBook {
    book: Mutex<Book>,
}

impl FailoverBook {
    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `slot` failed over at `now`: returns its cooldown.
    pub fn start_cooldown(&self, slot: SlotId, config: &FailoverConfig, now: Instant) -> Duration {
        let mut book = self.lock();
        let streak = book.streak.entry(slot.channel).or_default();
        *streak = streak.saturating_add(1);
        let cooldown = config.cooldown_for(*streak);
        book.until.insert(slot, now + cooldown);
        cooldown
    }

    /// When `slot`'s cooldown ends, if it is still running.
    pub fn cooling_until(&self, slot: SlotId, now: Instant) -> Option<Instant> {
        self.lock().until.get(&slot).copied().filter(|u| *u > now)
    }

    /// Some slot of `channel` is cooling on this pod.
    pub fn channel_cooling(&self, channel: ChannelId, now: Instant) -> bool {
        self.cooling(now).iter().any(|s| s.channel == channel)
    }

    /// A cycle of `channel` succeeded on this pod: the next failover starts from the base cooldown.
    pub fn succeeded(&self, channel: ChannelId) {
        let mut book = self.lock();
        if book.streak.get(&channel).is_some_and(|s| *s > 0) {
            book.streak.insert(channel, 0);
        }
    }

    /// Slots cooling now.
    pub fn cooling(&self, now: Instant) -> Vec<SlotId> {
        self.lock().until.iter().filter(|(_, u)| **u > now).map(|(s, _)| *s).collect()
    }

    /// Cooling slots as `pool/slot` names (`cpm:stream/3`), for the pod's heartbeat.
    pub fn cooling_names(&self, now: Instant) -> Vec<String> {
        self.cooling(now).into_iter().map(|s| slot_name(Pool::Stream(s.channel), s.n)).collect()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn config() -> FailoverConfig {
        FailoverConfig {
            after_failures: 3,
            after: Duration::from_secs(2),
            cooldown: Duration::from_secs(4),
            cooldown_max: Duration::from_secs(20),
            orphan_grace: Duration::from_millis(1500),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_is_due_after_k_failures_or_t_of_failure_and_a_success_resets_it() {
        let c = config();
        let mut run = FailureRun::default();
        let t0 = Instant::now();
        assert!(!run.due(t0, &c), "no failure, nothing due");
        run.record(t0);
        run.record(t0 + Duration::from_millis(100));
        assert!(!run.due(t0 + Duration::from_millis(100), &c));
        assert_eq!(run.time_left(t0 + Duration::from_millis(500), &c), Duration::from_millis(1500));
        assert!(run.due(t0 + Duration::from_secs(2), &c), "T of continuous failure");
        run.record(t0 + Duration::from_millis(200));
        assert!(run.due(t0 + Duration::from_millis(200), &c), "K in a row");
        run.reset();
        assert_eq!((run.count(), run.failing_for(t0 + Duration::from_secs(9))), (0, Duration::ZERO));
    }

    #[tokio::test(start_paused = true)]
    async fn cooldowns_double_per_streak_and_a_success_restarts_from_the_base() {
        let (c, book, now) = (config(), FailoverBook::default(), Instant::now());
        let slot = |n| SlotId { channel: ChannelId::Cpm, n };
        assert_eq!(book.start_cooldown(slot(1), &c, now), Duration::from_secs(4));
        assert_eq!(book.start_cooldown(slot(2), &c, now), Duration::from_secs(8));
        assert!(book.channel_cooling(ChannelId::Cpm, now) && !book.channel_cooling(ChannelId::Csm, now));
        assert_eq!(book.cooling_names(now), vec!["cpm:stream/1".to_owned(), "cpm:stream/2".to_owned()]);
        assert_eq!(book.cooling_until(slot(1), now + Duration::from_secs(4)), None, "over at its end");
        book.succeeded(ChannelId::Cpm);
        assert_eq!(book.start_cooldown(slot(3), &c, now), Duration::from_secs(4));
    }

    #[test]
    fn broken_values_name_their_key() {
        let timing = TreeTiming::default();
        assert_eq!(FailoverConfig::default().validate(&timing), Ok(()));
        let bad = FailoverConfig { after_failures: 0, ..FailoverConfig::default() };
        assert_eq!(bad.validate(&timing).unwrap_err().key, "failover.after_failures, failover.after");
        let bad = FailoverConfig { cooldown_max: Duration::from_secs(1), ..FailoverConfig::default() };
        assert_eq!(bad.validate(&timing).unwrap_err().key, "failover.cooldown");
        let bad = FailoverConfig { orphan_grace: Duration::from_secs(1), ..FailoverConfig::default() };
        assert_eq!(bad.validate(&timing).unwrap_err().key, "failover.orphan_grace");
    }

    proptest! {
        #[test]
        fn cooldowns_never_shrink_with_the_streak_and_stay_within_base_and_max(base in 1u64..100_000, factor in 1u64..64, streak in 1u32..80) {
            let c = FailoverConfig {
                cooldown: Duration::from_millis(base),
                cooldown_max: Duration::from_millis(base * factor),
                ..config()
            };
            let (now, next) = (c.cooldown_for(streak), c.cooldown_for(streak + 1));
            prop_assert!(now >= c.cooldown && now <= c.cooldown_max);
            prop_assert!(next >= now);
            prop_assert!(next <= now * 2);
        }
    }
}
