//! What the watchdog raises: typed alerts with a stable key (kind, channel,
//! slot), shared with `/cluster` through an [`AlertBoard`], and their metrics
//! and log lines on every transition.

use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

pub use crate::ports::reconcile::Level;

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
    /// The last reconciled window found money our records do not account for
    /// (raised by the Reconciler, not by the watchdog's rules).
    Reconcile,
}

impl AlertKind {
    pub const ALL: [AlertKind; 5] =
        [AlertKind::ZeroActive, AlertKind::StaleSlot, AlertKind::Lag, AlertKind::Cap, AlertKind::Reconcile];

    /// The documented level of each kind (docs/outbound.md, "Alert levels").
    pub fn level(self) -> Level {
        match self {
            AlertKind::ZeroActive | AlertKind::Cap => Level::Emergency,
            AlertKind::Reconcile => Level::Critical,
            AlertKind::StaleSlot | AlertKind::Lag => Level::Warning,
        }
    }

    /// The metric label and JSON name (`zero_active`, `stale_slot`, `lag`, `cap`).
    pub fn label(self) -> &'static str {
        match self {
            AlertKind::ZeroActive => "zero_active",
            AlertKind::StaleSlot => "stale_slot",
            AlertKind::Lag => "lag",
            AlertKind::Cap => "cap",
            AlertKind::Reconcile => "reconcile",
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
            (true, AlertKind::ZeroActive | AlertKind::Cap | AlertKind::Reconcile) => {
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

/// The pod's active alerts, written by its watchdog (and the Reconciler's own), read by `/cluster`.
#[derive(Clone, Default)]
pub struct AlertBoard {
    alerts: Arc<RwLock<Vec<Alert>>>,
    reconcile: Arc<RwLock<Option<Alert>>>,
}

impl AlertBoard {
    pub fn set(&self, alerts: Vec<Alert>) {
        *self.alerts.write().unwrap_or_else(|p| p.into_inner()) = alerts;
    }

    /// The Reconciler's alert: raised (`Some`) or cleared, announced on each change.
    pub fn set_reconcile(&self, alert: Option<Alert>) {
        let mut slot = self.reconcile.write().unwrap_or_else(|p| p.into_inner());
        match (&*slot, &alert) {
            (None, Some(raised)) => raised.announce(true),
            (Some(was), None) => was.announce(false),
            _ => {}
        }
        *slot = alert;
    }

    pub fn get(&self) -> Vec<Alert> {
        let mut all = self.alerts.read().unwrap_or_else(|p| p.into_inner()).clone();
        all.extend(self.reconcile.read().unwrap_or_else(|p| p.into_inner()).clone());
        all
    }
}
