//! Faults the control API sets at run time, per channel: added latency (fixed +
//! jitter), ratios of 5xx / connection resets / 429 / 403 to sends, the long-poll hold, the
//! stream idle expiry, and closing the connection after each response.

use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};

/// The live fault settings of one channel's listener.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Faults {
    /// Added to every ICOM request before it is handled.
    pub latency_ms: u64,
    /// Uniform extra latency in `0..=jitter_ms`.
    pub jitter_ms: u64,
    /// Share of requests answered with `error_status` (0.0..=1.0).
    pub error_5xx_ratio: f64,
    /// The 5xx status to answer with (500..=599).
    pub error_status: u16,
    /// When true a faulted POST is stored (replies and all) before the 5xx: "maybe stored".
    pub store_before_5xx: bool,
    /// With `store_before_5xx`: what such a POST stored gets no reply on the stream either (the
    /// pacs.002 is lost with the 201) — only a reconciliation settles it.
    #[serde(default)]
    pub lose_replies: bool,
    /// Share of requests whose connection is reset (RST) instead of answered.
    pub reset_ratio: f64,
    /// Share of requests answered 429 with `Retry-After: 1`.
    pub status_429_ratio: f64,
    /// Share of POSTs (sends only) answered 403: a permanent refusal that must never trip a breaker.
    #[serde(default)]
    pub reject_sends_ratio: f64,
    /// Long-poll hold of an empty read before 204.
    pub hold_ms: u64,
    /// A stream without requests for this long is expired and its batch re-queued.
    pub stream_idle_ms: u64,
    /// Send `Connection: close` on every response.
    pub close_after_response: bool,
}

impl Faults {
    /// No faults, with the configured hold and stream idle.
    pub fn none(hold: Duration, stream_idle: Duration) -> Self {
        Faults {
            latency_ms: 0,
            jitter_ms: 0,
            error_5xx_ratio: 0.0,
            error_status: 500,
            store_before_5xx: false,
            lose_replies: false,
            reset_ratio: 0.0,
            status_429_ratio: 0.0,
            reject_sends_ratio: 0.0,
            hold_ms: hold.as_millis() as u64,
            stream_idle_ms: stream_idle.as_millis() as u64,
            close_after_response: false,
        }
    }

    pub fn hold(&self) -> Duration {
        Duration::from_millis(self.hold_ms)
    }

    pub fn stream_idle(&self) -> Duration {
        Duration::from_millis(self.stream_idle_ms)
    }

    /// Applies a partial update, all or nothing.
    pub fn apply(&mut self, patch: &FaultPatch) -> Result<(), String> {
        let mut next = *self;
        macro_rules! set {
            ($($field:ident),*) => { $( if let Some(v) = patch.$field { next.$field = v; } )* };
        }
        set!(
            latency_ms,
            jitter_ms,
            error_5xx_ratio,
            error_status,
            store_before_5xx,
            lose_replies,
            reset_ratio,
            status_429_ratio,
            reject_sends_ratio,
            hold_ms,
            stream_idle_ms,
            close_after_response
        );
        for (name, ratio) in [
            ("error_5xx_ratio", next.error_5xx_ratio),
            ("reset_ratio", next.reset_ratio),
            ("status_429_ratio", next.status_429_ratio),
            ("reject_sends_ratio", next.reject_sends_ratio),
        ] {
            if !(0.0..=1.0).contains(&ratio) {
                return Err(format!("{name} must be within 0.0..=1.0, got {ratio}"));
            }
        }
        if !(500..=599).contains(&next.error_status) {
            return Err(format!("error_status must be a 5xx, got {}", next.error_status));
        }
        if next.stream_idle_ms == 0 {
            return Err("stream_idle_ms must be positive".to_owned());
        }
        *self = next;
        Ok(())
    }

    /// Rolls the dice for one request.
    pub fn roll(&self, send: bool) -> FaultRoll {
        let mut rng = rand::rng();
        let jitter = if self.jitter_ms > 0 { rng.random_range(0..=self.jitter_ms) } else { 0 };
        let delay = Duration::from_millis(self.latency_ms + jitter);
        let action = if self.reset_ratio > 0.0 && rng.random_bool(self.reset_ratio) {
            FaultAction::Reset
        } else if self.error_5xx_ratio > 0.0 && rng.random_bool(self.error_5xx_ratio) {
            FaultAction::ServerError(self.error_status)
        } else if self.status_429_ratio > 0.0 && rng.random_bool(self.status_429_ratio) {
            FaultAction::TooManyRequests
        } else if send && self.reject_sends_ratio > 0.0 && rng.random_bool(self.reject_sends_ratio) {
            FaultAction::Forbidden
        } else {
            FaultAction::None
        };
        FaultRoll { delay, action }
    }
}

/// A partial update of [`Faults`] (`POST /sim/faults`); `channel` absent means both.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultPatch {
    pub channel: Option<String>,
    pub latency_ms: Option<u64>,
    pub jitter_ms: Option<u64>,
    pub error_5xx_ratio: Option<f64>,
    pub error_status: Option<u16>,
    pub store_before_5xx: Option<bool>,
    pub lose_replies: Option<bool>,
    pub reset_ratio: Option<f64>,
    pub status_429_ratio: Option<f64>,
    pub reject_sends_ratio: Option<f64>,
    pub hold_ms: Option<u64>,
    pub stream_idle_ms: Option<u64>,
    pub close_after_response: Option<bool>,
}

/// What the dice said for one request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FaultRoll {
    pub delay: Duration,
    pub action: FaultAction,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FaultAction {
    None,
    Reset,
    ServerError(u16),
    TooManyRequests,
    /// 403 to a send.
    Forbidden,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patch_is_validated_as_a_whole() {
        let mut f = Faults::none(Duration::from_secs(5), Duration::from_secs(60));
        let bad = FaultPatch { latency_ms: Some(10), reset_ratio: Some(1.5), ..Default::default() };
        assert!(f.apply(&bad).is_err());
        assert_eq!(f.latency_ms, 0, "nothing applied");
        let good = FaultPatch { latency_ms: Some(10), status_429_ratio: Some(1.0), ..Default::default() };
        f.apply(&good).unwrap();
        assert_eq!(f.latency_ms, 10);
        assert_eq!(f.roll(true).action, FaultAction::TooManyRequests);
        assert_eq!(f.roll(true).delay, Duration::from_millis(10));
    }

    #[test]
    fn no_faults_roll_nothing() {
        let f = Faults::none(Duration::from_secs(5), Duration::from_secs(60));
        for _ in 0..100 {
            assert_eq!(f.roll(true), FaultRoll { delay: Duration::ZERO, action: FaultAction::None });
        }
    }

    #[test]
    fn refusing_sends_spares_the_streams() {
        let mut f = Faults::none(Duration::from_secs(5), Duration::from_secs(60));
        f.apply(&FaultPatch { reject_sends_ratio: Some(1.0), ..Default::default() }).unwrap();
        assert_eq!(f.roll(true).action, FaultAction::Forbidden);
        assert_eq!(f.roll(false).action, FaultAction::None);
    }
}
