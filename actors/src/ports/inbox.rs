//! The inbox port (Postgres): fenced slot claims and the commit of a batch with
//! the stream's next cursor in one transaction (DESIGN §2.2–2.4). The cursor
//! row is also the stream slot's gate (DESIGN §2.5): every write of the holder
//! sets `busy_until = max(busy_until, now() + busy_for)` (Postgres's clock), so
//! the statement that precedes each GET anyway arms it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::domain::SlotId;
use crate::ports::icom::InboundMessage;

/// The result of claiming a slot's cursor row: our fence and where the stream stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// Strictly greater than any fence handed out before for this slot.
    pub fence: i64,
    /// The stored pull-next to resume; `None` means start a new stream.
    pub pull_next: Option<String>,
    /// What is left of the previous holder's busy window (Postgres's clock):
    /// nothing is sent on this slot before it has passed.
    pub wait: Duration,
}

/// What a commit did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommitSummary {
    /// Rows newly inserted, in id order, for the publisher (duplicates are not repeated here).
    pub inserted: Vec<CommittedRow>,
    /// Messages already in the inbox (a redelivered batch).
    pub duplicates: usize,
    /// Of the inserted rows, how many are malformed.
    pub malformed: usize,
}

/// A freshly committed inbox row, with what the publisher needs to publish it
/// without reading it back (the slot gives the channel of its `Nats-Msg-Id`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommittedRow {
    pub id: i64,
    pub slot: SlotId,
    /// The message as stored: a part without a ResourceId carries the key it was stored under.
    pub message: InboundMessage,
}

/// A slot's cursor row as the watchdog reads it (read-only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotCursor {
    pub slot: SlotId,
    pub fence: i64,
    /// The grant that claimed the current fence.
    pub holder: Option<String>,
    /// The stored pull-next (a new one after every answered poll); `None`: no stream open.
    pub pull_next: Option<String>,
    /// Since the row last changed (claim, commit, cursor store).
    pub age: Duration,
    /// What is left of the gate's busy window (DESIGN §2.5): a new holder waits this out.
    pub busy_for: Option<Duration>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InboxError {
    /// Database unreachable, pool timeout, serialization failure: retry with backoff.
    #[error("inbox unavailable: {0}")]
    Unavailable(String),
    /// Someone claimed the slot after us: stop, acknowledge nothing.
    #[error("fence lost: ours {ours}, current {current}")]
    FenceLost { ours: i64, current: i64 },
    /// A bug or a schema problem: escalate.
    #[error("inbox fatal: {0}")]
    Fatal(String),
}

#[async_trait::async_trait]
pub trait InboxStore: Send + Sync + 'static {
    /// Takes the next fence of `slot` (creating its row if absent) for `holder`
    /// and opens a window, `busy_until = max(busy_until, now() + busy_for)`; the
    /// wait is what was left of the previous one (the window arms the first request only when it is 0).
    async fn claim(&self, slot: SlotId, holder: &str, busy_for: Duration) -> Result<Claim, InboxError>;
    /// In ONE transaction: fails with `FenceLost` unless the row's fence is
    /// still `fence`; inserts `batch` (ON CONFLICT DO NOTHING); stores `pull_next`;
    /// arms the next request (`busy_for`). Only after it returns Ok may the batch be acknowledged.
    async fn commit(
        &self,
        slot: SlotId,
        fence: i64,
        batch: &[InboundMessage],
        pull_next: &str,
        busy_for: Duration,
    ) -> Result<CommitSummary, InboxError>;
    /// Stores a cursor without a batch (a new stream's first pull-next, or
    /// `None` after the stream was closed), conditioned on the fence; arms the next request.
    async fn store_cursor(
        &self,
        slot: SlotId,
        fence: i64,
        pull_next: Option<&str>,
        busy_for: Duration,
    ) -> Result<(), InboxError>;
    /// Arms the next request alone (nothing else to write before it), conditioned on the fence.
    async fn arm(&self, slot: SlotId, fence: i64, busy_for: Duration) -> Result<(), InboxError>;
    /// Clears `busy_until` while the fence is ours: the holder leaves with nothing in flight.
    async fn release(&self, slot: SlotId, fence: i64) -> Result<(), InboxError>;
    /// Every slot cursor row of this participant (read-only; for the watchdog).
    async fn cursors(&self) -> Result<Vec<SlotCursor>, InboxError>;
}
