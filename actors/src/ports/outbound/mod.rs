//! The outbound port (Postgres): store-and-forward of outbound messages.
//!
//! A message is accepted once per MsgId (invariant 3), taken in batches of one
//! channel by priority then deadline with a claim token, and moved through
//! `queued → sending → sent → confirmed` (or a final failure; `in_doubt` when
//! it is no longer sent yet may have reached the SPI). Every change is
//! written to a history; the changes the bank's core cares about come back as
//! [`ResultEvent`]s that the caller hands to the results publisher.

use std::time::SystemTime;

use bytes::Bytes;

use crate::domain::ChannelId;
use crate::ports::outbound_bus::{Arrival, OutboundRequest, ResultEvent, ResultStatus};

mod parked;
mod send;
mod values;

pub use parked::{Parked, ParkedPage, ParkedState, Unparked};
pub use send::{Recorded, SendResult, StatusClass};
pub use values::{Deadline, DeadlineBudgets, DeadlineClass, OutboundStatus, Priority};

/// A valid outbound request, ready to be stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewOutbound {
    /// The message's MsgId (`Document/*/GrpHdr/MsgId`, else `AppHdr/BizMsgIdr`): unique forever.
    pub msg_id: String,
    /// `pacs.008`, `pacs.002`, ...: decides the rate-bucket cost.
    pub msg_type: String,
    pub channel: ChannelId,
    pub priority: Priority,
    pub deadline: SystemTime,
    /// EndToEndIds of its transactions, to correlate the SPI's pacs.002.
    pub end_to_end_ids: Vec<String>,
    /// Where it came from (`{stream}:{sequence}`), when known.
    pub ingress_ref: Option<String>,
    pub raw: Bytes,
}

/// A request that could not be read: kept as `rejected_invalid`, never sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidOutbound {
    /// `{stream}:{sequence}`: a redelivery stores nothing new.
    pub ingress_ref: Option<String>,
    pub channel: Option<ChannelId>,
    /// What could be read of its MsgId, for the operator; does not reserve the MsgId.
    pub claimed_msg_id: Option<String>,
    pub reason: String,
    pub raw: Bytes,
}

/// One stored message as status pages show it (without its body).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboundRow {
    pub id: i64,
    /// `None` only for `rejected_invalid`.
    pub msg_id: Option<String>,
    pub msg_type: Option<String>,
    pub channel: Option<ChannelId>,
    pub priority: Priority,
    pub deadline: SystemTime,
    pub status: OutboundStatus,
    /// Send attempts since acceptance (429s and waits do not count).
    pub attempts: u32,
    pub not_before: SystemTime,
    pub resource_ids: Vec<String>,
    pub last_error: Option<String>,
    pub ingress_ref: Option<String>,
    pub created_at: SystemTime,
    pub updated_at: SystemTime,
    pub sent_at: Option<SystemTime>,
    pub confirmed_at: Option<SystemTime>,
    /// Set when it stayed `sent` without a confirmation for `unconfirmed_after`.
    pub unconfirmed_since: Option<SystemTime>,
}

/// One message of a taken batch, with its body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadyMessage {
    pub id: i64,
    pub msg_id: String,
    pub msg_type: String,
    pub priority: Priority,
    pub deadline: SystemTime,
    pub attempts: u32,
    pub raw: Bytes,
}

/// Proves a sender took a batch; outcomes of a claim that was recovered meanwhile are ignored.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClaimToken(pub String);

/// ICOM's batch: 1..=10 messages per POST.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchSize(u8);

impl BatchSize {
    pub const MAX: BatchSize = BatchSize(10);

    pub fn new(n: usize) -> Result<BatchSize, String> {
        match u8::try_from(n) {
            Ok(n @ 1..=10) => Ok(BatchSize(n)),
            _ => Err(format!("a batch is 1..=10 messages, got {n}")),
        }
    }

    pub fn get(self) -> usize {
        usize::from(self.0)
    }
}

/// Messages claimed for one POST, all of one channel, in sending order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub claim: ClaimToken,
    pub channel: ChannelId,
    pub messages: Vec<ReadyMessage>,
    /// Rows of this channel found past their deadline on the way (now `timeout`).
    pub expired: Vec<ResultEvent>,
}

/// The answer to an insert.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Inserted {
    /// Stored now; `event` is `accepted` (or `rejected_invalid`).
    New { event: ResultEvent },
    /// The MsgId (or ingress ref) is already stored: nothing new, the existing state.
    Duplicate { row: OutboundRow, same_body: bool },
}

/// How an inbound status report points at the outbound message it is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ConfirmRef {
    /// pacs.002 `OrgnlGrpInfAndSts/OrgnlMsgId`.
    MsgId(String),
    /// pacs.002 `TxInfAndSts/OrgnlEndToEndId`.
    EndToEndId(String),
    /// admi.002 `RltdRef/Ref`: the refused message's MsgId, or the ResourceId
    /// its POST was given (what the 201 returned; some SPI implementations
    /// name that). A ResourceId is known only once the 201 is recorded.
    Related(String),
}

impl ConfirmRef {
    /// Whether a reference that matches nothing now may match later: a
    /// ResourceId appears only when its sender records the 201, so a report
    /// can overtake it. MsgIds and EndToEndIds are stored before any send.
    pub fn may_match_later(&self) -> bool {
        matches!(self, ConfirmRef::Related(_))
    }
}

/// The SPI's verdict on a sent message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpiVerdict {
    Confirmed,
    Rejected { reason: String },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfirmOutcome {
    /// The result events, in order: `sent` first when the verdict arrived
    /// before the send was recorded (the verdict proves it was stored), then
    /// the verdict's own.
    Applied(Vec<ResultEvent>),
    /// Already confirmed / rejected by the SPI / invalid: unchanged.
    AlreadyFinal(OutboundStatus),
    /// No outbound message carries that reference.
    Unknown,
}

/// What the Reconciler learnt about an `in_doubt` message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settlement {
    /// The SPI holds it: its verdict, as a pacs.002 / admi.002 would have brought it.
    Stored(SpiVerdict),
    /// The SPI never stored it (its records show no such MsgId): `timeout`,
    /// so the core may pay again under a new MsgId.
    NotStored { evidence: String },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settled {
    /// Settled; the result event to publish.
    Done(ResultEvent),
    NotFound,
    /// Not `in_doubt` (any more): unchanged.
    NotInDoubt(OutboundStatus),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reprocessed {
    /// Back to `queued` with the same MsgId and a fresh deadline (the same budget from now).
    Queued(ResultEvent),
    NotFound,
    /// Only `dead` and `rejected` can be reprocessed.
    NotAllowed(OutboundStatus),
}

/// One line of a message's history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryEntry {
    pub at: SystemTime,
    pub from: Option<OutboundStatus>,
    pub to: OutboundStatus,
    pub attempt: u32,
    /// The result event this change published, if any.
    pub event: Option<ResultStatus>,
    pub detail: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboundDetail {
    pub row: OutboundRow,
    pub history: Vec<HistoryEntry>,
}

/// A page of rows of one status, oldest first; `next_after` continues it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    pub rows: Vec<OutboundRow>,
    pub next_after: Option<i64>,
}

/// Queued and in-flight rows of one (channel, priority).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DepthLine {
    pub channel: ChannelId,
    pub priority: Priority,
    pub queued: u64,
    pub sending: u64,
    pub oldest_queued: Option<SystemTime>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueDepth {
    pub lines: Vec<DepthLine>,
    /// Requests parked and not reprocessed yet (all channels).
    pub parked: u64,
}

impl QueueDepth {
    pub fn queued(&self) -> u64 {
        self.lines.iter().map(|l| l.queued).sum()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OutboundError {
    /// Database unreachable, pool timeout, serialization failure: retry with backoff;
    /// nothing is acknowledged or sent meanwhile.
    #[error("outbound store unavailable: {0}")]
    Unavailable(String),
    /// Postgres refused the values of this call (a data exception, SQLSTATE
    /// class 22, or a value too large for an index, 54000): the same call
    /// fails again, whatever the retries, but the store is fine. The input is
    /// bad: keep it elsewhere (an intake parks the request), answer 400.
    #[error("outbound store refused the values: {0}")]
    Refused(String),
    /// A bug or a schema problem: escalate.
    #[error("outbound store fatal: {0}")]
    Fatal(String),
}

/// The outbound table. Policy (poison attempts, backoff, processing timeout,
/// unconfirmed delay) is the adapter's configuration.
#[async_trait::async_trait]
pub trait OutboundStore: Send + Sync + 'static {
    /// Stores a valid request as `queued` once per MsgId; a duplicate returns the existing row.
    async fn insert(&self, msg: &NewOutbound) -> Result<Inserted, OutboundError>;
    /// Keeps an unreadable request as `rejected_invalid` (once per ingress ref).
    async fn insert_invalid(&self, msg: &InvalidOutbound) -> Result<Inserted, OutboundError>;
    /// Stores a pulled batch at once, each request as `insert` or `insert_invalid`
    /// would; the answers come in the requests' order, all committed. A request
    /// whose values cannot be stored as they are (a NUL byte, an EndToEndId too
    /// large for its index) is stored as `rejected_invalid` (fields cleaned or
    /// cut, raw kept) and never fails the others. On an error some may be
    /// stored: acknowledge none, a redelivery is a duplicate.
    async fn insert_batch(&self, requests: &[OutboundRequest]) -> Result<Vec<Inserted>, OutboundError>;
    /// Keeps requests the intake gives up on as they came off the bus
    /// (`reason` says why), once per ingress ref; returns how many are new.
    async fn park(&self, arrivals: &[Arrival], reason: &str) -> Result<usize, OutboundError>;
    /// Parked requests not reprocessed yet, oldest first: id > `after`, at most `limit` (≤ 500).
    async fn parked(&self, after: Option<i64>, limit: u32) -> Result<ParkedPage, OutboundError>;
    /// One parked request (either state) by its ingress ref.
    async fn parked_request(&self, ingress_ref: &str) -> Result<Option<Parked>, OutboundError>;
    /// Stores `request` (the parked request parsed again) as `insert_batch`
    /// would, and marks the parked row `reprocessed`; only a row still parked.
    async fn unpark(&self, ingress_ref: &str, request: &OutboundRequest) -> Result<Unparked, OutboundError>;
    /// Expires this channel's overdue queued rows and claims up to `max` ready
    /// rows (priority, deadline; `FOR UPDATE SKIP LOCKED`) as `sending`; the two
    /// may run concurrently (disjoint rows), and a failed expiry may be left to
    /// the janitor's rather than fail the claim.
    async fn take_ready(&self, channel: ChannelId, max: BatchSize) -> Result<Batch, OutboundError>;
    /// Records the outcome of each message (by MsgId) of a claimed batch.
    async fn record(&self, claim: &ClaimToken, outcomes: &[(String, SendResult)]) -> Result<Recorded, OutboundError>;
    /// Queued rows past their deadline (any channel) → `timeout`; at most `max`.
    async fn expire_overdue(&self, max: u32) -> Result<Vec<ResultEvent>, OutboundError>;
    /// Claims older than the processing timeout (a vanished sender, which may
    /// have posted them) → back to `queued`, counting an attempt that may have
    /// reached the SPI (`in_doubt` past the deadline, `dead` when due); at most `max`.
    async fn recover_stale_claims(&self, max: u32) -> Result<Vec<ResultEvent>, OutboundError>;
    /// Applies the SPI's verdict to the message `reference` points at (an
    /// `in_doubt` one included).
    async fn confirm(&self, reference: &ConfirmRef, verdict: &SpiVerdict) -> Result<ConfirmOutcome, OutboundError>;
    /// The Reconciler's work list: `in_doubt` rows, oldest first, paged as [`OutboundStore::list`].
    async fn in_doubt(&self, after: Option<i64>, limit: u32) -> Result<Page, OutboundError> {
        self.list(OutboundStatus::InDoubt, after, limit).await
    }
    /// The Reconciler's verdict on one `in_doubt` row: `confirmed` /
    /// `rejected_by_spi` when the SPI holds it, `timeout` when it never did.
    async fn settle_in_doubt(&self, msg_id: &str, settlement: &Settlement) -> Result<Settled, OutboundError>;
    /// The body stored under `msg_id` (a resubmission is compared with it).
    async fn stored_body(&self, msg_id: &str) -> Result<Option<Bytes>, OutboundError>;
    /// Flags `sent` rows without confirmation after the configured delay; returns their MsgIds.
    async fn flag_unconfirmed(&self, max: u32) -> Result<Vec<String>, OutboundError>;
    /// `dead` / `rejected` → `queued` again, same MsgId.
    async fn reprocess(&self, msg_id: &str) -> Result<Reprocessed, OutboundError>;
    async fn get(&self, msg_id: &str) -> Result<Option<OutboundDetail>, OutboundError>;
    /// Rows of `status` with id > `after`, oldest first, at most `limit` (≤ 500).
    async fn list(&self, status: OutboundStatus, after: Option<i64>, limit: u32) -> Result<Page, OutboundError>;
    async fn depth(&self) -> Result<QueueDepth, OutboundError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_size_is_icom_s_batch() {
        assert!(BatchSize::new(0).is_err());
        assert!(BatchSize::new(11).is_err());
        assert_eq!(BatchSize::new(10).unwrap(), BatchSize::MAX);
    }
}
