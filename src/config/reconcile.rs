//! The `[reconcile]` section: when the Reconciler compares our records with
//! the Central Bank's statement, which closed windows it takes, how long it
//! waits for a statement, and the channel its `camt.060` goes out on (it is
//! sent through the outbound queue, so it needs `outbound.enabled`).

use std::time::Duration;

use cabine_actors::domain::ChannelId;
use cabine_actors::tree::reconciler::ReconcileSchedule;
use serde::{Deserialize, Serialize};

use super::{ConfigError, Settings};

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconcileSettings {
    pub enabled: bool,
    /// Window length and period: windows are aligned to multiples of it (UNIX time).
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// A window is reconciled once it ended this long ago (late settlements, deliveries in flight).
    #[serde(with = "humantime_serde")]
    pub settle_margin: Duration,
    /// How long a run waits for the whole statement before it gives up (and retries).
    #[serde(with = "humantime_serde")]
    pub report_timeout: Duration,
    /// After a failed run.
    #[serde(with = "humantime_serde")]
    pub retry_after: Duration,
    /// With nothing reconciled yet, the first window starts this far back.
    #[serde(with = "humantime_serde")]
    pub lookback: Duration,
    /// Most windows one run takes (the oldest first); the rest wait for the next run.
    pub max_windows: u32,
    /// The channel the camt.060 is sent on; unset: the secondary when enabled, else the primary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<ChannelId>,
}

impl ReconcileSettings {
    pub fn schedule(&self) -> ReconcileSchedule {
        ReconcileSchedule { interval: self.interval, retry_after: self.retry_after }
    }
}

impl Settings {
    /// The channel the Reconciler's camt.060 goes out on.
    pub fn reconcile_channel(&self) -> ChannelId {
        self.reconcile.channel.unwrap_or_else(|| {
            if self.enabled_channels().any(|(id, _)| id == ChannelId::Csm) { ChannelId::Csm } else { ChannelId::Cpm }
        })
    }

    /// Whether this pod's leader runs the Reconciler.
    pub fn reconciles(&self) -> bool {
        self.reconcile.enabled && self.outbound.enabled
    }
}

pub fn check_reconcile(s: &Settings) -> Result<(), ConfigError> {
    let r = &s.reconcile;
    if !r.enabled {
        return Ok(());
    }
    for (key, value) in [
        ("reconcile.interval", r.interval),
        ("reconcile.report_timeout", r.report_timeout),
        ("reconcile.retry_after", r.retry_after),
    ] {
        if value.is_zero() {
            return Err(ConfigError::invalid(key, "must be greater than zero"));
        }
    }
    if r.max_windows == 0 {
        return Err(ConfigError::invalid("reconcile.max_windows", "must be at least 1"));
    }
    let channel = s.reconcile_channel();
    if s.outbound.enabled && !s.enabled_channels().any(|(id, _)| id == channel) {
        return Err(ConfigError::invalid(
            "reconcile.channel",
            format!("{} is not an enabled channel (icom.channels.{}.enabled)", channel.as_str(), channel.as_str()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_with_env as load;

    #[test]
    fn defaults_reconcile_and_bad_values_name_their_key() {
        let s = load(&[]).unwrap();
        assert!(s.reconciles());
        assert_eq!(s.reconcile.interval, Duration::from_secs(600));
        let e = load(&[("CABINE__RECONCILE__INTERVAL", "0s")]).unwrap_err();
        assert!(e.to_string().contains("reconcile.interval"), "{e}");
        assert_eq!(s.reconcile_channel(), ChannelId::Cpm, "the secondary is disabled by default");
        let e = load(&[("CABINE__RECONCILE__CHANNEL", "csm")]).unwrap_err();
        assert!(e.to_string().contains("reconcile.channel"), "{e}");
    }
}
