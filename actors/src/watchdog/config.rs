//! The watchdog's thresholds, validated against the tree's timings so that a
//! healthy cluster never raises an alert.

use std::time::Duration;

use crate::config::{PollMode, TreeConfig, TreeConfigError};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchdogConfig {
    /// How often the cluster view is rebuilt (also how fresh orphan sightings are).
    pub interval: Duration,
    /// A held slot whose stream has not moved for this long, while other slots of
    /// its channel deliver, is stale.
    pub stale_after: Duration,
    /// A slot with no holder for this long is stale (orphan pickup failed too).
    pub unheld_after: Duration,
    /// No slot of a channel moved its stream for this long: the channel is dead.
    pub zero_active_after: Duration,
    /// The oldest inbox row not yet on the bus is older than this.
    pub lag_after: Duration,
    /// Send slots per channel, for the cap check of the send pools.
    pub send_pool: u8,
}

impl Default for WatchdogConfig {
    fn default() -> Self {
        WatchdogConfig {
            interval: Duration::from_secs(2),
            stale_after: Duration::from_secs(30),
            unheld_after: Duration::from_secs(60),
            zero_active_after: Duration::from_secs(30),
            lag_after: Duration::from_secs(60),
            send_pool: 2,
        }
    }
}

impl WatchdogConfig {
    /// The longest a healthy holder goes between two answered polls.
    fn poll_gap(tree: &TreeConfig) -> Duration {
        let cycle = match tree.poll_mode {
            PollMode::LongPoll => Duration::ZERO,
            PollMode::Scheduled { cycle, .. } => cycle,
        };
        tree.timing.long_poll_timeout + cycle
    }

    pub fn validate(&self, tree: &TreeConfig) -> Result<(), TreeConfigError> {
        let fail = |key, rule| Err(TreeConfigError { key, rule });
        let gap = Self::poll_gap(tree);
        if self.interval.is_zero() || self.interval * 2 > tree.failover.orphan_grace {
            return fail("watchdog.interval", "must be > 0 and <= failover.orphan_grace / 2");
        }
        if self.stale_after < gap * 2 || self.stale_after < self.interval * 2 {
            return fail(
                "watchdog.stale_after",
                "must be >= 2 x (long_poll_timeout + scheduled cycle) and >= 2 x watchdog.interval",
            );
        }
        if self.zero_active_after < gap * 2 || self.zero_active_after < self.interval * 2 {
            return fail(
                "watchdog.zero_active_after",
                "must be >= 2 x (long_poll_timeout + scheduled cycle) and >= 2 x watchdog.interval",
            );
        }
        if self.unheld_after <= tree.failover.orphan_grace {
            return fail("watchdog.unheld_after", "must be > failover.orphan_grace (orphan pickup comes first)");
        }
        if self.lag_after <= tree.timing.republish_after + tree.timing.sweep_interval {
            return fail("watchdog.lag_after", "must be > republish_after + sweep_interval (the sweep comes first)");
        }
        if !(1..=6).contains(&self.send_pool) {
            return fail("watchdog.send_pool", "must be in 1..=6");
        }
        Ok(())
    }
}
