//! What the watchdog raises: typed alerts with a stable key (kind, channel,
//! slot), shared with `/cluster` through an [`AlertBoard`], and their metrics
//! and log lines on every transition.

use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

use crate::domain::ChannelId;
use crate::metrics;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertKind {
    /// A channel with no slot delivering: no holder, or every holder failing.
    ZeroActive,
    /// A slot unheld too long, or held with a stream that does not move while others do.
    StaleSlot,
    /// The oldest inbox row not yet on the bus is too old.
    Lag,
    /// More holders than a pool has slots: must never happen.
    Cap,
}

impl AlertKind {
    pub const ALL: [AlertKind; 4] = [AlertKind::ZeroActive, AlertKind::StaleSlot, AlertKind::Lag, AlertKind::Cap];

    /// The metric label and JSON name (`zero_active`, `stale_slot`, `lag`, `cap`).
    pub fn label(self) -> &'static str {
        match self {
            AlertKind::ZeroActive => "zero_active",
            AlertKind::StaleSlot => "stale_slot",
            AlertKind::Lag => "lag",
            AlertKind::Cap => "cap",
        }
    }
}

/// (kind, channel, slot): one alert at a time per key.
pub type AlertKey = (AlertKind, Option<ChannelId>, Option<u8>);

/// An active alert.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alert {
    pub kind: AlertKind,
    pub channel: Option<ChannelId>,
    pub slot: Option<u8>,
    /// Milliseconds since the UNIX epoch when it was raised.
    pub since_ms: u64,
    /// What the watchdog saw, for the operator.
    pub detail: String,
}

impl Alert {
    pub fn key(&self) -> AlertKey {
        (self.kind, self.channel, self.slot)
    }

    /// Gauge, counter and one log line: raised (`on`) or cleared.
    pub fn announce(&self, on: bool) {
        let (kind, channel, slot) = (self.kind.label(), self.channel, self.slot);
        metrics::watchdog_alert(kind, channel, slot, on);
        let (ch, n, detail) = (channel.map(ChannelId::as_str), slot, self.detail.as_str());
        match (on, self.kind) {
            (true, AlertKind::ZeroActive | AlertKind::Cap) => {
                metrics::watchdog_raised(kind, channel, slot);
                tracing::error!(alert = kind, channel = ch, slot = n, %detail, "WATCHDOG ALERT raised");
            }
            (true, _) => {
                metrics::watchdog_raised(kind, channel, slot);
                tracing::warn!(alert = kind, channel = ch, slot = n, %detail, "watchdog alert raised");
            }
            (false, _) => tracing::info!(alert = kind, channel = ch, slot = n, "watchdog alert cleared"),
        }
    }
}

/// The pod's active alerts, written by its watchdog, read by `/cluster`.
#[derive(Clone, Default)]
pub struct AlertBoard {
    alerts: Arc<RwLock<Vec<Alert>>>,
}

impl AlertBoard {
    pub fn set(&self, alerts: Vec<Alert>) {
        *self.alerts.write().unwrap_or_else(|p| p.into_inner()) = alerts;
    }

    pub fn get(&self) -> Vec<Alert> {
        self.alerts.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
