//! The circuit-breaker port (Redis): one breaker per (ispb, channel) shared by
//! every pod. CLOSED → DEGRADED (elevated failure or slow-call rate; traffic
//! still flows) → OPEN (failure rate or consecutive failures) → lazily
//! HALF_OPEN after the break time, admitting a few probes whose admissions
//! expire; a probe's success closes it, a failure re-opens it. Only 5xx,
//! timeouts and transport errors count; 4xx and 429 never trip it.
//! Fail closed: when the store is unreachable, callers treat it as refused.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::domain::ChannelId;
use crate::ports::outbound::SendResult;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    Closed,
    /// Elevated failure or slow-call rate: traffic flows, operators see it.
    Degraded,
    Open,
    HalfOpen,
}

impl BreakerState {
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Degraded => "degraded",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

/// An admitted call: hand it back to [`CircuitBreaker::record`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// The breaker's generation at admission (bumped when it opens or closes):
    /// the outcome of a call from an older generation is ignored.
    pub generation: u64,
    /// `Some(id)` when the call is a HALF_OPEN probe.
    pub probe: Option<String>,
}

impl Call {
    pub fn is_probe(&self) -> bool {
        self.probe.is_some()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    Admit(Call),
    /// OPEN, or HALF_OPEN with every probe taken; ask again after `retry_after`.
    Refused {
        state: BreakerState,
        retry_after: Duration,
    },
}

/// How a finished call counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallOutcome {
    Success,
    /// 5xx, timeout, transport error.
    Failure,
    /// Succeeded, but slower than the slow-call threshold.
    Slow,
    /// 4xx, 429, or never sent: does not count (frees a probe admission).
    Ignored,
}

impl CallOutcome {
    /// How a send's result counts, `elapsed` against the slow-call threshold `slow`.
    pub fn of_send(result: &SendResult, elapsed: Duration, slow: Duration) -> CallOutcome {
        match result {
            SendResult::Sent { .. } if elapsed >= slow => CallOutcome::Slow,
            SendResult::Sent { .. } => CallOutcome::Success,
            SendResult::Failed { .. } => CallOutcome::Failure,
            SendResult::Rejected { .. } | SendResult::RateLimited { .. } | SendResult::NotSent { .. } => {
                CallOutcome::Ignored
            }
        }
    }
}

/// A breaker as status pages show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BreakerView {
    pub state: BreakerState,
    pub generation: u64,
    /// Calls, failures and slow calls in the sliding window.
    pub calls: u64,
    pub failures: u64,
    pub slow: u64,
    pub consecutive_failures: u64,
    pub probes_in_flight: u64,
    /// While OPEN: time left before it half-opens.
    pub retry_after: Option<Duration>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BreakerError {
    /// Store unreachable or slow: treat as refused (fail closed), retry later.
    #[error("circuit breaker unavailable: {0}")]
    Unavailable(String),
    /// A bug or a broken server (script error): escalate.
    #[error("circuit breaker fatal: {0}")]
    Fatal(String),
}

/// The shared breaker of each channel; one round trip per call.
#[async_trait::async_trait]
pub trait CircuitBreaker: Send + Sync + 'static {
    async fn admit(&self, channel: ChannelId) -> Result<Admission, BreakerError>;
    /// Counts a finished call; returns the state after it.
    async fn record(&self, channel: ChannelId, call: &Call, outcome: CallOutcome)
    -> Result<BreakerState, BreakerError>;
    async fn state(&self, channel: ChannelId) -> Result<BreakerView, BreakerError>;
    /// Operator reset: CLOSED, window cleared, a new generation.
    async fn reset(&self, channel: ChannelId) -> Result<(), BreakerError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_server_trouble_counts() {
        let slow = Duration::from_secs(2);
        let fast = Duration::from_millis(10);
        let sent = SendResult::Sent { resource_id: "R".into() };
        assert_eq!(CallOutcome::of_send(&sent, fast, slow), CallOutcome::Success);
        assert_eq!(CallOutcome::of_send(&sent, slow, slow), CallOutcome::Slow);
        let failed = SendResult::Failed { reason: "503".into() };
        assert_eq!(CallOutcome::of_send(&failed, fast, slow), CallOutcome::Failure);
        let rejected = SendResult::Rejected { status: 400, reason: "schema".into() };
        assert_eq!(CallOutcome::of_send(&rejected, fast, slow), CallOutcome::Ignored);
        let limited = SendResult::RateLimited { retry_after: None };
        assert_eq!(CallOutcome::of_send(&limited, fast, slow), CallOutcome::Ignored);
    }
}
