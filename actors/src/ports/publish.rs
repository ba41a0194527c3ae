//! The inbound publisher port (NATS JetStream): committed rows go to the bus
//! with a `Nats-Msg-Id` derived from (ispb, channel, resource id); rows left
//! unpublished (bus down, crash) are republished by a sweep.

use std::time::Duration;

use crate::ports::inbox::CommittedRow;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// Bus or database unreachable: the rows stay unpublished, the sweep retries.
    #[error("publisher unavailable: {0}")]
    Unavailable(String),
}

#[async_trait::async_trait]
pub trait InboundPublisher: Send + Sync + 'static {
    /// Hands over freshly committed rows. Bounded: waits when the publisher is
    /// behind (back-pressure on the slot). While the bus is down, rows are left
    /// in Postgres for the sweep (counted) rather than stalling the slot; malformed
    /// rows are dead letters and are not published.
    async fn committed(&self, rows: Vec<CommittedRow>);
    /// Republishes rows unpublished for longer than `older_than`; returns how many.
    async fn sweep(&self, older_than: Duration) -> Result<usize, PublishError>;
    /// Age of the oldest committed row not yet on the bus (zero when none).
    async fn oldest_unpublished(&self) -> Result<Duration, PublishError>;
}
