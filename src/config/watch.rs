//! The `[failover]` and `[watchdog]` sections — never a slot silently dead:
//! when a holder whose cycles keep failing hands its slot over, how long its
//! pod stays out, when a free slot is adopted beyond the fair share, and the
//! watchdog's alert thresholds. Their rules are the tree's own
//! ([`cabine_actors::FailoverConfig::validate`], [`cabine_actors::WatchdogConfig::validate`]),
//! checked at load through `check_tree` and named by these keys.

use std::time::Duration;

use cabine_actors::{FailoverConfig, WatchdogConfig};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailoverSettings {
    pub after_failures: u32,
    #[serde(with = "humantime_serde")]
    pub after: Duration,
    #[serde(with = "humantime_serde")]
    pub cooldown: Duration,
    #[serde(with = "humantime_serde")]
    pub cooldown_max: Duration,
    #[serde(with = "humantime_serde")]
    pub orphan_grace: Duration,
}

impl FailoverSettings {
    pub fn config(&self) -> FailoverConfig {
        FailoverConfig {
            after_failures: self.after_failures,
            after: self.after,
            cooldown: self.cooldown,
            cooldown_max: self.cooldown_max,
            orphan_grace: self.orphan_grace,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchdogSettings {
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    #[serde(with = "humantime_serde")]
    pub stale_after: Duration,
    #[serde(with = "humantime_serde")]
    pub unheld_after: Duration,
    #[serde(with = "humantime_serde")]
    pub zero_active_after: Duration,
    #[serde(with = "humantime_serde")]
    pub lag_after: Duration,
}

impl WatchdogSettings {
    /// `send_pool`: `pools.send`, for the cap check of the send pools.
    pub fn config(&self, send_pool: u8) -> WatchdogConfig {
        WatchdogConfig {
            interval: self.interval,
            stale_after: self.stale_after,
            unheld_after: self.unheld_after,
            zero_active_after: self.zero_active_after,
            lag_after: self.lag_after,
            send_pool,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigError;
    use crate::config::load_with_env as load;

    #[test]
    fn the_tree_gets_the_failover_and_watchdog_settings() {
        let s = load(&[("CABINE__FAILOVER__AFTER_FAILURES", "3"), ("CABINE__WATCHDOG__LAG_AFTER", "90s")]).unwrap();
        let c = s.tree_config("pod-x");
        assert_eq!((c.failover.after_failures, c.failover.orphan_grace), (3, Duration::from_secs(21)));
        assert_eq!((c.watchdog.lag_after, c.watchdog.send_pool), (Duration::from_secs(90), 2));
    }

    #[test]
    fn broken_values_name_their_keys() {
        let key = |env: &[(&str, &str)]| match load(env) {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("expected a violation, got {other:?}"),
        };
        assert_eq!(key(&[("CABINE__FAILOVER__ORPHAN_GRACE", "1s")]), "failover.orphan_grace");
        assert_eq!(key(&[("CABINE__FAILOVER__COOLDOWN", "11m")]), "failover.cooldown");
        assert!(key(&[("CABINE__FAILOVER__AFTER_FAILURES", "0")]).contains("failover.after_failures"));
        assert_eq!(key(&[("CABINE__WATCHDOG__STALE_AFTER", "10s")]), "watchdog.stale_after");
        assert_eq!(key(&[("CABINE__WATCHDOG__LAG_AFTER", "40s")]), "watchdog.lag_after");
        assert_eq!(key(&[("CABINE__WATCHDOG__UNHELD_AFTER", "21s")]), "watchdog.unheld_after");
        assert_eq!(key(&[("CABINE__WATCHDOG__INTERVAL", "0s")]), "watchdog.interval");
        assert_eq!(key(&[("CABINE__WATCHDOG__BOGUS", "1s")]).split('.').next(), Some("watchdog"));
    }
}
