//! One poll cycle, run in a task spawned by the slot and owning its ICOM
//! connection: check the lease leaves room for a whole request, GET (start or
//! the stored pull-next), commit the batch with the next pull-next under our
//! fence, hand the inserted rows to the publisher. Only when this returns may
//! the next GET — the acknowledgement — be sent. Aborting the task (lease lost,
//! drain) drops the connection and acknowledges nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::domain::SlotId;
use crate::ledger::HeldLease;
use crate::metrics;
use crate::ports::{IcomStream, InboundMessage, InboxError, PollOutcome};
use crate::tree::context::TreeContext;

/// `stage` values: a GET on a stored pull-next is in flight (a drain aborts it:
/// nothing is acknowledged, the next holder GETs the same pull-next)...
pub const REQUESTING: u8 = 0;
/// ...a `start` is in flight (a drain lets it finish: the new stream's
/// pull-next is not stored yet, an abort would leave the stream open and unknown)...
pub const STARTING: u8 = 1;
/// ...or a received batch is being persisted (let it finish before handing over).
pub const PERSISTING: u8 = 2;

/// The stage a cycle starts in.
pub fn stage_of(input: &CycleInput) -> u8 {
    match (&input.unpersisted, &input.cursor) {
        (Some(_), _) => PERSISTING,
        (None, Some(_)) => REQUESTING,
        (None, None) => STARTING,
    }
}

pub struct CycleInput {
    pub ctx: TreeContext,
    pub slot: SlotId,
    pub fence: i64,
    /// The pull-next to use; `None` starts a new stream.
    pub cursor: Option<String>,
    /// False when `cursor` is known but its store failed (retried on the next empty answer).
    pub cursor_stored: bool,
    pub lease: HeldLease,
    /// A batch received earlier whose commit failed: committed first, before any GET.
    pub unpersisted: Option<Received>,
    pub stage: Arc<AtomicU8>,
}

/// A batch in hand with the pull-next that will acknowledge it.
#[derive(Debug, PartialEq, Eq)]
pub struct Received {
    pub batch: Vec<InboundMessage>,
    pub pull_next: String,
}

/// How a cycle ended, i.e. what the slot does next.
#[derive(Debug, PartialEq, Eq)]
pub enum CycleEnd {
    /// A batch is committed (and handed to the publisher) with its pull-next.
    Delivered { cursor: String, received: usize, persisted: usize, duplicates: usize, malformed: usize },
    /// Nothing to deliver. `stored` is false when storing a new pull-next failed
    /// transiently: the slot keeps the stream (never opens a second one) and stores it later.
    Empty { cursor: String, stored: bool },
    /// The stored pull-next is unknown to the server (404/410): start a new stream.
    StreamGone,
    /// Retry after a backoff (at least `at_least`); `reconnect` drops the connection first.
    Backoff { why: String, at_least: Option<Duration>, reconnect: bool },
    /// The batch is in hand but the inbox refused it for now: keep it, retry
    /// the commit after a backoff (no second GET, no second stream).
    CommitFailed { received: Received, why: String },
    /// The lease or the fence is gone: stop using the slot now.
    LeaseLost(String),
    /// A bug or a schema problem: the slot fails.
    Fatal(String),
}

pub struct CycleReport {
    pub end: CycleEnd,
    pub stream: Box<dyn IcomStream>,
    pub took: Duration,
}

pub async fn run(mut input: CycleInput, mut stream: Box<dyn IcomStream>) -> CycleReport {
    let started = Instant::now();
    input.stage.store(stage_of(&input), Ordering::SeqCst);
    let timing = &input.ctx.config.timing;
    let patience = timing.heartbeat;
    if let Err(cause) = input.lease.ready_for(input.ctx.config.request_budget(), patience).await {
        let end = CycleEnd::LeaseLost(format!("lease not valid for a whole request: {cause}"));
        return CycleReport { end, stream, took: started.elapsed() };
    }
    let (end, label) = match input.unpersisted.take() {
        Some(received) => (persist(&input, received).await, "retry_commit"),
        None => {
            let outcome = match &input.cursor {
                None => stream.start().await,
                Some(cursor) => stream.next(cursor).await,
            };
            settle(&input, outcome).await
        }
    };
    let took = started.elapsed();
    metrics::poll(input.slot.channel, label, took);
    CycleReport { end, stream, took }
}

async fn settle(input: &CycleInput, outcome: PollOutcome) -> (CycleEnd, &'static str) {
    let backoff = |why: String, at_least, reconnect| CycleEnd::Backoff { why, at_least, reconnect };
    match outcome {
        PollOutcome::Messages { batch, pull_next } => (persist(input, Received { batch, pull_next }).await, "messages"),
        PollOutcome::Empty { pull_next } => (store_empty(input, pull_next).await, "empty"),
        PollOutcome::UnknownStream if input.cursor.is_some() => (CycleEnd::StreamGone, "unknown_stream"),
        PollOutcome::UnknownStream => (backoff("start answered 404".into(), None, false), "unknown_stream"),
        PollOutcome::TooManyStreams => (backoff("429: too many streams".into(), None, false), "too_many_streams"),
        PollOutcome::RateLimited { retry_after } => {
            (backoff("429: rate limited".into(), retry_after, false), "rate_limited")
        }
        PollOutcome::Rejected { status, problem } => {
            let why = format!("rejected {status}: {}", problem.as_deref().unwrap_or("no problem body"));
            (backoff(why, None, false), "rejected")
        }
        PollOutcome::ServerError { status } => (backoff(format!("server error {status}"), None, false), "server_error"),
        PollOutcome::Timeout => (backoff("request timed out".into(), None, true), "timeout"),
        PollOutcome::Transport(e) => (backoff(format!("transport: {e}"), None, true), "transport"),
    }
}

async fn persist(input: &CycleInput, received: Received) -> CycleEnd {
    input.stage.store(PERSISTING, Ordering::SeqCst);
    let ports = &input.ctx.ports;
    let Received { batch, pull_next } = received;
    match ports.inbox.commit(input.slot, input.fence, &batch, &pull_next).await {
        Ok(summary) => {
            let (persisted, duplicates, malformed) = (summary.inserted.len(), summary.duplicates, summary.malformed);
            metrics::batch(input.slot.channel, batch.len(), persisted, duplicates, malformed);
            if malformed > 0 {
                tracing::warn!(slot = %input.slot, malformed, "malformed messages persisted for the dead-letter view");
            }
            if summary.inserted.iter().any(|r| crate::outbound::is_status_report(r.message.meta.msg_type())) {
                // In memory, no I/O: the confirmer applies the verdicts off the inbound path.
                input.ctx.signal.status_reports_committed();
            }
            if !summary.inserted.is_empty() {
                ports.publisher.committed(summary.inserted).await;
            }
            CycleEnd::Delivered { cursor: pull_next, received: batch.len(), persisted, duplicates, malformed }
        }
        Err(InboxError::Unavailable(m)) => {
            CycleEnd::CommitFailed { received: Received { batch, pull_next }, why: format!("inbox unavailable: {m}") }
        }
        Err(e) => inbox_failure(e),
    }
}

async fn store_empty(input: &CycleInput, pull_next: String) -> CycleEnd {
    if input.cursor_stored && input.cursor.as_deref() == Some(pull_next.as_str()) {
        return CycleEnd::Empty { cursor: pull_next, stored: true };
    }
    input.stage.store(PERSISTING, Ordering::SeqCst);
    match input.ctx.ports.inbox.store_cursor(input.slot, input.fence, Some(&pull_next)).await {
        Ok(()) => CycleEnd::Empty { cursor: pull_next, stored: true },
        Err(InboxError::Unavailable(m)) => {
            tracing::warn!(slot = %input.slot, error = %m, "pull-next not stored yet; keeping the stream");
            CycleEnd::Empty { cursor: pull_next, stored: false }
        }
        Err(e) => inbox_failure(e),
    }
}

fn inbox_failure(e: InboxError) -> CycleEnd {
    match e {
        InboxError::FenceLost { ours, current } => {
            CycleEnd::LeaseLost(format!("fence lost: ours {ours}, current {current}"))
        }
        InboxError::Unavailable(m) => {
            CycleEnd::Backoff { why: format!("inbox unavailable: {m}"), at_least: None, reconnect: false }
        }
        InboxError::Fatal(m) => CycleEnd::Fatal(format!("inbox fatal: {m}")),
    }
}
