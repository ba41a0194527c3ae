//! The confirmation port (Postgres): inbound pacs.002 / admi.002 rows of the
//! inbox that have not been correlated yet are read in batches, their verdicts
//! applied to the outbound messages they reference, and the rows marked
//! correlated. Durable: a crash between the inbox commit and the verdict
//! leaves the row uncorrelated, and the next pass (any pod) applies it.
//! Applying a verdict twice is harmless (the second finds it final).

use crate::ports::outbound_bus::ResultEvent;

/// What one correlation pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Correlated {
    /// Inbox rows read: marked correlated, or left for a later pass (`retried`).
    pub rows: usize,
    /// Verdicts that changed an outbound message: the result events to publish.
    pub applied: Vec<ResultEvent>,
    /// Verdicts about a message already final (confirmed, rejected by the SPI).
    pub already_final: usize,
    /// References that match no outbound message of ours.
    pub unknown: usize,
    /// Reports whose reference may still come to match (a ResourceId whose
    /// 201 is not recorded yet): left uncorrelated for a later pass.
    pub retried: usize,
    /// Reports retried for the whole patience without a match: marked
    /// correlated and unmatched (kept in the inbox), counted, logged.
    pub unmatched: usize,
    /// Rows whose XML could not be read (kept in the inbox, marked correlated).
    pub unreadable: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfirmError {
    /// Database unreachable or slow: the rows stay uncorrelated; retry later.
    #[error("confirmations unavailable: {0}")]
    Unavailable(String),
    /// A bug or a schema problem: escalate.
    #[error("confirmations fatal: {0}")]
    Fatal(String),
}

#[async_trait::async_trait]
pub trait Confirmations: Send + Sync + 'static {
    /// Correlates at most `max` uncorrelated status reports (oldest first;
    /// rows another pod is correlating are skipped).
    async fn correlate(&self, max: u32) -> Result<Correlated, ConfirmError>;
}
