//! One poll cycle, run in a task spawned by the slot and owning its ICOM
//! connection and its gate: check the lease leaves room for a whole request,
//! pass the gate (DESIGN §2.5: wait out a previous holder's window, arm when
//! no unspent fenced write is within the margin), GET (start or the stored
//! pull-next), commit the batch with the next pull-next under our fence — the
//! commit also arms the next GET — and hand the inserted rows to the
//! publisher. Only when this returns may the next GET — the acknowledgement —
//! be sent. Aborting the task (lease lost, drain) drops the connection and
//! acknowledges nothing.
//!
//! Architecture invariant: a batch is acknowledged (next GET, or DELETE) only
//! after its commit returned Ok — there is no path from `settle` to a request.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::domain::SlotId;
use crate::gate::{self, Blocked, Gate, Ready};
use crate::ledger::HeldLease;
use crate::metrics;
use crate::ports::{IcomStream, InboundMessage, InboxError, LostCause, PollOutcome};
use crate::tree::context::TreeContext;

/// Where a cycle is, as a drain must know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Stage {
    /// Passing the gate or a GET on a stored pull-next in flight: a drain aborts
    /// it (nothing is acknowledged, the next holder GETs the same pull-next).
    Requesting = 0,
    /// A `start` in flight: a drain lets it finish (the new stream's pull-next
    /// is not stored yet; an abort would leave the stream open and unknown).
    Starting = 1,
    /// A received batch is being persisted: let it finish before handing over.
    Persisting = 2,
}

/// The running cycle's stage, shared with the slot.
#[derive(Clone, Debug, Default)]
pub struct StageCell(Arc<AtomicU8>);

impl StageCell {
    pub fn set(&self, stage: Stage) {
        self.0.store(stage as u8, Ordering::SeqCst);
    }

    pub fn get(&self) -> Stage {
        match self.0.load(Ordering::SeqCst) {
            1 => Stage::Starting,
            2 => Stage::Persisting,
            _ => Stage::Requesting,
        }
    }
}

/// The stage a cycle starts in.
pub fn stage_of(input: &CycleInput) -> Stage {
    match (&input.unpersisted, &input.cursor) {
        (Some(_), _) => Stage::Persisting,
        (None, Some(_)) => Stage::Requesting,
        (None, None) => Stage::Starting,
    }
}

pub struct CycleInput {
    pub ctx: TreeContext,
    pub slot: SlotId,
    /// The slot's gate, fence included; it comes back in the report.
    pub gate: Gate,
    /// The pull-next to use; `None` starts a new stream.
    pub cursor: Option<String>,
    /// False when `cursor` is known but its store failed (retried on the next empty answer).
    pub cursor_stored: bool,
    pub lease: HeldLease,
    /// A batch received earlier whose commit failed: committed first, before any GET.
    pub unpersisted: Option<Received>,
    pub stage: StageCell,
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

impl CycleEnd {
    /// Label for status and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            CycleEnd::Delivered { .. } => "messages",
            CycleEnd::Empty { .. } => "empty",
            CycleEnd::StreamGone => "unknown_stream",
            CycleEnd::Backoff { .. } => "error",
            CycleEnd::CommitFailed { .. } => "commit_failed",
            CycleEnd::LeaseLost(_) => "lease_lost",
            CycleEnd::Fatal(_) => "fatal",
        }
    }
}

pub struct CycleReport {
    pub end: CycleEnd,
    pub stream: Box<dyn IcomStream>,
    pub gate: Gate,
    pub took: Duration,
}

pub async fn run(mut input: CycleInput, mut stream: Box<dyn IcomStream>) -> CycleReport {
    let started = Instant::now();
    input.stage.set(stage_of(&input));
    let (end, label, get) = match ready_lease(&mut input).await {
        Err(end) => (end, "lease_lost", None),
        Ok(()) => match input.unpersisted.take() {
            Some(received) => (persist(&mut input, received).await, "retry_commit", None),
            None => request(&mut input, stream.as_mut()).await,
        },
    };
    let took = started.elapsed();
    metrics::poll(input.slot.channel, label, took);
    if let (Some(get), CycleEnd::Delivered { .. }) = (get, &end) {
        metrics::delivered_cycle(input.slot.channel, get, took);
    }
    CycleReport { end, stream, gate: input.gate, took }
}

/// The lease must leave room for a whole request (waiting at most a heartbeat for a renewal).
async fn ready_lease(input: &mut CycleInput) -> Result<(), CycleEnd> {
    let (budget, patience) = (input.ctx.config.request_budget(), input.ctx.config.timing.heartbeat);
    input
        .lease
        .ready_for(budget, patience)
        .await
        .map_err(|cause| CycleEnd::LeaseLost(format!("lease not valid for a whole request: {cause}")))
}

/// Gate, then the GET (or start), then what its answer calls for; with how
/// long the GET took, when one went out.
async fn request(input: &mut CycleInput, stream: &mut dyn IcomStream) -> (CycleEnd, &'static str, Option<Duration>) {
    if let Err(end) = through_gate(input).await {
        return (end, "gate", None);
    }
    input.gate.spend();
    let sent = Instant::now();
    let outcome = match &input.cursor {
        None => stream.start().await,
        Some(cursor) => stream.next(cursor).await,
    };
    let get = sent.elapsed();
    if outcome.answered() {
        input.gate.answered();
    }
    let (end, label) = settle(input, outcome).await;
    (end, label, Some(get))
}

/// Waits out a previous holder's window and arms when needed, then checks the
/// lease still leaves room for a whole request (a wait may have used some of
/// it); a renewal waited for may outlast the armed window: then around again.
async fn through_gate(input: &mut CycleInput) -> Result<(), CycleEnd> {
    let (inbox, slot) = (input.ctx.ports.inbox.clone(), input.slot);
    let (budget, patience) = (input.ctx.config.request_budget(), input.ctx.config.timing.heartbeat);
    for _ in 0..3 {
        match gate::pass(&mut input.gate, |fence, busy_for| inbox.arm(slot, fence, busy_for)).await {
            Ok(()) => {}
            Err(Blocked::Store(e)) => return Err(inbox_failure(e)),
            Err(Blocked::Slow(margin)) => {
                let why = format!("gate writes take longer than the margin ({margin:?})");
                return Err(CycleEnd::Backoff { why, at_least: None, reconnect: false });
            }
        }
        match input.lease.ready_for(budget, patience).await {
            Ok(()) if input.gate.ready(Instant::now()) == Ready::Go => return Ok(()),
            Ok(()) => continue,
            Err(LostCause::Expired) => {
                let why = "lease not renewed in time for a whole request".to_owned();
                return Err(CycleEnd::Backoff { why, at_least: None, reconnect: false });
            }
            Err(cause) => return Err(CycleEnd::LeaseLost(format!("lease lost at the gate: {cause}"))),
        }
    }
    let why = "the lease and the gate never agreed on a window".to_owned();
    Err(CycleEnd::Backoff { why, at_least: None, reconnect: false })
}

async fn settle(input: &mut CycleInput, outcome: PollOutcome) -> (CycleEnd, &'static str) {
    let backoff = |why: String, at_least, reconnect| CycleEnd::Backoff { why, at_least, reconnect };
    let label = outcome.label();
    let end = match outcome {
        PollOutcome::Messages { batch, pull_next } => persist(input, Received { batch, pull_next }).await,
        PollOutcome::Empty { pull_next } => store_empty(input, pull_next).await,
        PollOutcome::UnknownStream if input.cursor.is_some() => CycleEnd::StreamGone,
        PollOutcome::UnknownStream => backoff("start answered 404".into(), None, false),
        PollOutcome::TooManyStreams => backoff("429: too many streams".into(), None, false),
        PollOutcome::RateLimited { retry_after } => backoff("429: rate limited".into(), retry_after, false),
        PollOutcome::Rejected { status, problem } => {
            let why = format!("rejected {status}: {}", problem.as_deref().unwrap_or("no problem body"));
            backoff(why, None, false)
        }
        PollOutcome::ServerError { status } => backoff(format!("server error {status}"), None, false),
        PollOutcome::Timeout => backoff("request timed out".into(), None, true),
        PollOutcome::Transport(e) => backoff(format!("transport: {e}"), None, true),
    };
    (end, label)
}

async fn persist(input: &mut CycleInput, received: Received) -> CycleEnd {
    input.stage.set(Stage::Persisting);
    let ports = &input.ctx.ports;
    let Received { batch, pull_next } = received;
    let (sent, busy_for) = (Instant::now(), input.gate.busy_for());
    match ports.inbox.commit(input.slot, input.gate.fence, &batch, &pull_next, busy_for).await {
        Ok(summary) => {
            input.gate.written(sent);
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

async fn store_empty(input: &mut CycleInput, pull_next: String) -> CycleEnd {
    if input.cursor_stored && input.cursor.as_deref() == Some(pull_next.as_str()) {
        return CycleEnd::Empty { cursor: pull_next, stored: true };
    }
    input.stage.set(Stage::Persisting);
    let (sent, busy_for) = (Instant::now(), input.gate.busy_for());
    match input.ctx.ports.inbox.store_cursor(input.slot, input.gate.fence, Some(&pull_next), busy_for).await {
        Ok(()) => {
            input.gate.written(sent);
            CycleEnd::Empty { cursor: pull_next, stored: true }
        }
        Err(InboxError::Unavailable(m)) => {
            tracing::warn!(slot = %input.slot, error = %m, "pull-next not stored yet; keeping the stream");
            CycleEnd::Empty { cursor: pull_next, stored: false }
        }
        Err(e) => inbox_failure(e),
    }
}

pub fn inbox_failure(e: InboxError) -> CycleEnd {
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
