//! The DICT policies port: the pod's mirror of the Central Bank's DICT
//! buckets takes its state from `GET /policies/`. Implemented by the `cabine`
//! crate (`src/dict`), faked in tests.

use async_trait::async_trait;

/// What one synchronisation found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DictLevel {
    /// Tokens of the participant's lookup bucket (`ENTRIES_READ_PARTICIPANT_ANTISCAN`).
    pub participant_tokens: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DictSyncError {
    /// The DICT's rate-limit API or Redis did not answer: the mirror goes on alone; retried next tick.
    #[error("DICT policies unavailable: {0}")]
    Unavailable(String),
}

#[async_trait]
pub trait DictPolicies: Send + Sync {
    /// Reads the Central Bank's buckets and writes them over the mirror.
    async fn sync(&self) -> Result<DictLevel, DictSyncError>;
}
