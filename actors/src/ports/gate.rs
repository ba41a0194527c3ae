//! The durable request gate of the send slots (DESIGN §2.5): one Postgres row
//! per send slot of a channel, its permit. A new holder claims the row (next
//! fence) and learns how long the previous holder's last request may still be
//! in flight; every POST is preceded by a fenced write of `busy_until = now() +
//! busy_for` (Postgres's clock). The stream slots' rows are the inbox's cursor
//! rows ([`crate::ports::InboxStore`]), written by the statements that precede
//! a GET anyway.

use std::time::Duration;

use crate::domain::ChannelId;

/// A claimed gate row: our fence, and how long to wait before the first request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateClaim {
    /// Strictly greater than any fence handed out before for this row.
    pub fence: i64,
    /// What is left of the previous holder's busy window, by Postgres's clock.
    pub wait: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    /// Database unreachable or slow: send nothing, retry with backoff (fail closed).
    #[error("gate unavailable: {0}")]
    Unavailable(String),
    /// Someone claimed the row after us: stop using the slot, send nothing.
    #[error("gate fence lost: ours {ours}, current {current}")]
    FenceLost { ours: i64, current: i64 },
    /// A bug or a schema problem: escalate.
    #[error("gate fatal: {0}")]
    Fatal(String),
}

/// The send slots' rows.
#[async_trait::async_trait]
pub trait SendGates: Send + Sync + 'static {
    /// Takes the next fence of send slot `slot` of `channel` for `holder` and
    /// opens a window, `busy_until = max(busy_until, now() + busy_for)`; the wait
    /// is what was left of the previous one (the window arms the first POST only when it is 0).
    async fn claim(
        &self,
        channel: ChannelId,
        slot: u8,
        holder: &str,
        busy_for: Duration,
    ) -> Result<GateClaim, GateError>;
    /// While the fence is ours: `busy_until = max(busy_until, now() + busy_for)`.
    async fn arm(&self, channel: ChannelId, slot: u8, fence: i64, busy_for: Duration) -> Result<(), GateError>;
    /// While the fence is ours: clears `busy_until` (nothing of ours in flight).
    async fn release(&self, channel: ChannelId, slot: u8, fence: i64) -> Result<(), GateError>;
}
