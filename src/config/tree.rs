//! The supervision tree's settings (`[polling]`, `[restart]` and the tree's
//! `[timing]` keys) and the [`TreeConfig`] `cabine run` builds from them.

use std::time::Duration;

use cabine_actors::{PollMode, RestartPolicy, TreeConfig, TreeTiming};
use serde::{Deserialize, Serialize};

use super::{ConfigError, Settings};

/// How a holding slot paces its polls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PollModeName {
    /// Re-poll at once (the server holds an empty GET ~5 s).
    LongPoll,
    /// Polls aligned to UNIX-time multiples of `cycle`, slot n offset by `(n − 1) × stagger`.
    Scheduled,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PollingSettings {
    pub mode: PollModeName,
    #[serde(with = "humantime_serde")]
    pub cycle: Duration,
    #[serde(with = "humantime_serde")]
    pub stagger: Duration,
}

/// Restart intensity of every supervisor.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestartSettings {
    pub max_restarts: u32,
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    #[serde(with = "humantime_serde")]
    pub backoff_base: Duration,
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
}

impl Settings {
    /// The tree of a pod with id `pod_id`: every enabled channel, the stream pool, the timings.
    pub fn tree_config(&self, pod_id: &str) -> TreeConfig {
        let t = &self.timing;
        let mut config = TreeConfig::new(pod_id);
        config.version = crate::VERSION.to_owned();
        config.channels = self.enabled_channels().map(|(id, _)| id).collect();
        config.stream_pool = self.pools.stream;
        config.timing = TreeTiming {
            heartbeat: t.heartbeat,
            long_poll_timeout: t.long_poll_timeout,
            request_margin: t.request_margin,
            gate_margin: t.gate_margin,
            acquire_interval: t.acquire_interval,
            empty_poll_floor: t.empty_poll_floor,
            backoff_base: t.backoff_base,
            backoff_max: t.backoff_max,
            drain_time: t.drain_time,
            stop_timeout: t.stop_timeout,
            republish_after: t.republish_after,
            sweep_interval: t.sweep_interval,
        };
        config.poll_mode = match self.polling.mode {
            PollModeName::LongPoll => PollMode::LongPoll,
            PollModeName::Scheduled => PollMode::Scheduled { cycle: self.polling.cycle, stagger: self.polling.stagger },
        };
        let r = &self.restart;
        config.restart = RestartPolicy {
            max_restarts: r.max_restarts,
            window: r.window,
            backoff_base: r.backoff_base,
            backoff_max: r.backoff_max,
        };
        config.failover = self.failover.config();
        config.watchdog = self.watchdog.config(self.pools.send.get());
        config.outbound = self.outbound.enabled.then(|| self.outbound_actors());
        config.reconcile = self.reconciles().then(|| self.reconcile.schedule());
        config.dict_sync = self.dict.enabled.then_some(self.dict.policy_sync_interval);
        config
    }
}

/// The tree's own rules, named by their keys: a fresh lease must leave room for a
/// request plus its margin, and the tree's validation must pass.
pub fn check_tree(s: &Settings) -> Result<(), ConfigError> {
    let t = &s.timing;
    if t.acquire_interval.is_zero() || t.sweep_interval.is_zero() {
        return Err(ConfigError::invalid(
            "timing.acquire_interval, timing.sweep_interval",
            "must be greater than zero",
        ));
    }
    if t.request_margin.is_zero() {
        return Err(ConfigError::invalid("timing.request_margin", "must be greater than zero"));
    }
    if t.gate_margin.is_zero() {
        return Err(ConfigError::invalid("timing.gate_margin", "must be greater than zero"));
    }
    if t.long_poll_timeout + t.request_margin + t.heartbeat + t.drift_margin > t.lease {
        return Err(ConfigError::invalid(
            "timing.long_poll_timeout, timing.request_margin, timing.heartbeat, timing.drift_margin, timing.lease",
            format!(
                "long_poll_timeout ({:?}) + request_margin ({:?}) + heartbeat ({:?}) + drift_margin ({:?}) must be \
                 <= lease ({:?}): a lease renewed one beat ago must still admit a whole stream request",
                t.long_poll_timeout, t.request_margin, t.heartbeat, t.drift_margin, t.lease
            ),
        ));
    }
    if s.polling.mode == PollModeName::Scheduled && s.polling.cycle.is_zero() {
        return Err(ConfigError::invalid("polling.cycle", "must be greater than zero in scheduled mode"));
    }
    let r = &s.restart;
    if r.max_restarts == 0 || r.window.is_zero() || r.backoff_base.is_zero() || r.backoff_base > r.backoff_max {
        return Err(ConfigError::invalid(
            "restart.max_restarts, restart.window, restart.backoff_base, restart.backoff_max",
            "max_restarts >= 1, window > 0, 0 < backoff_base <= backoff_max",
        ));
    }
    s.tree_config("boot-check").validate().map_err(|e| ConfigError::invalid(e.key, e.rule))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_with_env as load;

    #[test]
    fn the_tree_config_follows_the_settings() {
        let s = load(&[("CABINE__POLLING__MODE", "scheduled"), ("CABINE__RESTART__MAX_RESTARTS", "7")]).unwrap();
        let c = s.tree_config("pod-x");
        assert_eq!(c.pod_id, "pod-x");
        assert_eq!(c.restart.max_restarts, 7);
        assert_eq!(c.timing.acquire_interval, Duration::from_secs(1));
        assert_eq!(
            c.poll_mode,
            PollMode::Scheduled { cycle: Duration::from_secs(1), stagger: Duration::from_millis(100) }
        );
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn tree_rules_name_their_keys() {
        let key = |env: &[(&str, &str)]| match load(env) {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("expected a violation, got {other:?}"),
        };
        assert_eq!(key(&[("CABINE__TIMING__REQUEST_MARGIN", "0s")]), "timing.request_margin");
        assert!(key(&[("CABINE__TIMING__REQUEST_MARGIN", "1s")]).contains("timing.request_margin"));
        assert!(key(&[("CABINE__RESTART__MAX_RESTARTS", "0")]).contains("restart.max_restarts"));
        assert!(key(&[("CABINE__TIMING__ACQUIRE_INTERVAL", "0s")]).contains("timing.acquire_interval"));
        assert_eq!(key(&[("CABINE__POLLING__MODE", "scheduled"), ("CABINE__POLLING__CYCLE", "0s")]), "polling.cycle");
    }
}
