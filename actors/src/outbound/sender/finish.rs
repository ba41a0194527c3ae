//! The background stage of a sender's turn: what follows a POST (or a turn
//! that sent nothing) and must not delay the next POST — record the outcomes
//! (retrying while Postgres is down, within `record_patience`), count the call
//! on the shared breaker, then publish the result events.
//!
//! A sender's finishes record and count side by side (at most [`BEHIND`] run
//! behind the POSTs: their batches are disjoint claims) but complete in turn
//! order: each waits for the previous one before publishing its events, so
//! the events stay in order and a finish's handle answers for every earlier
//! one. The publish is chained the same way but not waited for (the outbox is
//! swept anyway). A failure (outcomes not recorded, a fatal store or breaker
//! error) is written in the line's book and ends the sender's next turn.
//!
//! Crash safety: rows whose outcome is not recorded stay claimed, and the
//! janitor recovers the claim as an attempt that may have reached the SPI —
//! never resent blindly, never reported `timeout`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::config::TreeTiming;
use crate::domain::ChannelId;
use crate::metrics;
use crate::outbound::sender::TurnEnd;
use crate::outbound::{OutboundConfig, OutboundPorts};
use crate::ports::breaker::{BreakerError, BreakerState, Call, CallOutcome};
use crate::ports::outbound::{ClaimToken, OutboundError, Recorded, SendResult};
use crate::ports::outbound_bus::ResultEvent;

/// Finishes that may run behind a sender's POSTs: the one of the POST just
/// answered and the one before it, recording side by side. A third waits
/// (records slower than POSTs slow the sender down instead of piling up
/// claimed rows).
const BEHIND: usize = 2;

/// A sender's finish stage: what it needs, its bound, and what it reports back.
#[derive(Clone)]
pub struct FinishLine {
    ports: OutboundPorts,
    config: Arc<OutboundConfig>,
    timing: TreeTiming,
    channel: ChannelId,
    permits: Arc<Semaphore>,
    book: Arc<Mutex<Book>>,
}

/// What finishes report to the sender's turns.
#[derive(Default)]
struct Book {
    /// Outcomes not recorded (`Backoff`), a fatal store or breaker error: ends the next turn.
    failure: Option<TurnEnd>,
    /// The breaker's state as the last count (or a refused admission) saw it.
    breaker: Option<BreakerState>,
    /// The last admission failed (breaker unavailable): not known to let traffic through.
    admit_failed: bool,
    /// The last publish started (each waits for the one before: events stay in order).
    publishing: Option<JoinHandle<()>>,
}

/// The work left after a turn's POST (or after a turn that sent nothing).
#[derive(Default)]
pub struct Finish {
    /// Outcomes to record, per claim (the turn's batch, a prepared batch given back).
    records: Vec<(ClaimToken, Vec<(String, SendResult)>)>,
    /// Calls to report to the breaker.
    calls: Vec<(Call, CallOutcome)>,
    /// Events already decided (rows a take expired).
    events: Vec<ResultEvent>,
}

impl Finish {
    pub fn with_events(events: Vec<ResultEvent>) -> Finish {
        Finish { events, ..Finish::default() }
    }

    pub fn record(&mut self, claim: ClaimToken, outcomes: Vec<(String, SendResult)>) {
        if !outcomes.is_empty() {
            self.records.push((claim, outcomes));
        }
    }

    /// Reports a call that went out.
    pub fn count(&mut self, call: Call, outcome: CallOutcome) {
        self.calls.push((call, outcome));
    }

    /// A call that sent nothing: a probe admission is freed, a plain one needs no report.
    pub fn forget(&mut self, call: Call) {
        if call.is_probe() {
            self.calls.push((call, CallOutcome::Ignored));
        }
    }

    /// Adds `other`'s work after this one's.
    pub fn absorb(&mut self, other: Finish) {
        self.records.extend(other.records);
        self.calls.extend(other.calls);
        self.events.extend(other.events);
    }
}

impl FinishLine {
    pub fn new(ports: OutboundPorts, config: Arc<OutboundConfig>, timing: TreeTiming, channel: ChannelId) -> Self {
        let (permits, book) = (Arc::new(Semaphore::new(BEHIND)), Arc::default());
        FinishLine { ports, config, timing, channel, permits, book }
    }

    /// Starts `finish` in the background after `previous`, once fewer than
    /// [`BEHIND`] finishes run; answers its handle.
    pub async fn start(&self, previous: Option<JoinHandle<()>>, finish: Finish) -> JoinHandle<()> {
        let permit = self.permits.clone().acquire_owned().await.expect("the finish permits are never closed");
        self.spawn(previous, finish, Some(permit))
    }

    /// Starts `finish` after `previous` without waiting for a permit (a sender
    /// giving a prepared batch back between turns).
    pub fn start_now(&self, previous: Option<JoinHandle<()>>, finish: Finish) -> JoinHandle<()> {
        self.spawn(previous, finish, None)
    }

    fn spawn(
        &self,
        previous: Option<JoinHandle<()>>,
        finish: Finish,
        permit: Option<OwnedSemaphorePermit>,
    ) -> JoinHandle<()> {
        let line = self.clone();
        tokio::spawn(async move {
            // Its own task: a panic in it still lets this one wait for the earlier finishes, so
            // this handle answers for all of them.
            let runner = line.clone();
            let ran = tokio::spawn(async move { runner.run(finish).await }).await;
            drop(permit);
            if let Some(previous) = previous
                && let Err(e) = previous.await
            {
                line.fail(TurnEnd::Fatal(format!("the finish stage failed: {e}")));
            }
            match ran {
                Ok(events) => line.publish(events),
                Err(e) => line.fail(TurnEnd::Fatal(format!("the finish stage failed: {e}"))),
            }
        })
    }

    /// The failure a finish reported since the last look, if any.
    pub fn take_failure(&self) -> Option<TurnEnd> {
        self.lock().failure.take()
    }

    /// The breaker's state as the last finish counted it (or an admission was refused in).
    pub fn breaker(&self) -> Option<BreakerState> {
        self.lock().breaker
    }

    /// What the last admission said: refused in `state`, failed (`None`), or admitted (`Some(Closed)`
    /// is not implied: a probe admission leaves the state to the count).
    pub fn admission_seen(&self, refused_in: Option<BreakerState>, failed: bool) {
        let mut book = self.lock();
        book.admit_failed = failed;
        if let Some(state) = refused_in {
            book.breaker = Some(state);
        }
    }

    /// The breaker was last seen letting traffic through (closed or degraded, or not seen yet).
    pub fn flowing(&self) -> bool {
        let book = self.lock();
        !book.admit_failed && matches!(book.breaker, None | Some(BreakerState::Closed | BreakerState::Degraded))
    }

    /// Waits for `last` and the publishes started so far (a sender releasing its slot).
    pub async fn flushed(&self, last: Option<JoinHandle<()>>) {
        if let Some(last) = last {
            let _ = last.await;
        }
        let publishing = self.lock().publishing.take();
        if let Some(publishing) = publishing {
            let _ = publishing.await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn fail(&self, end: TurnEnd) {
        let mut book = self.lock();
        book.failure = worse(book.failure.take(), Some(end));
    }

    /// Records and counts; answers the events to publish once the previous finish ended.
    async fn run(&self, finish: Finish) -> Vec<ResultEvent> {
        let mut events = finish.events;
        for (claim, outcomes) in &finish.records {
            match self.record(claim, outcomes).await {
                Ok(recorded) => events.extend(recorded.events),
                Err(end) => self.fail(end),
            }
        }
        for (call, outcome) in &finish.calls {
            self.count(call, *outcome).await;
        }
        events
    }

    async fn count(&self, call: &Call, outcome: CallOutcome) {
        let step = Instant::now();
        let counted = self.ports.breaker.record(self.channel, call, outcome).await;
        metrics::turn_step(self.channel, "count", step.elapsed());
        match counted {
            Ok(state) => self.lock().breaker = Some(state),
            Err(BreakerError::Unavailable(e)) => tracing::warn!(error = %e, "breaker did not count the call"),
            Err(BreakerError::Fatal(e)) => self.fail(TurnEnd::Fatal(format!("breaker: {e}"))),
        }
    }

    /// Records outcomes, retrying while the store is unavailable (within the patience).
    async fn record(&self, claim: &ClaimToken, outcomes: &[(String, SendResult)]) -> Result<Recorded, TurnEnd> {
        let step = Instant::now();
        let recorded = self.record_retrying(claim, outcomes).await;
        metrics::turn_step(self.channel, "record", step.elapsed());
        recorded
    }

    async fn record_retrying(
        &self,
        claim: &ClaimToken,
        outcomes: &[(String, SendResult)],
    ) -> Result<Recorded, TurnEnd> {
        let (store, t) = (&self.ports.store, &self.timing);
        let give_up = Instant::now() + self.config.record_patience;
        let mut backoff = Backoff::new(t.backoff_base, t.backoff_max);
        loop {
            match store.record(claim, outcomes).await {
                Ok(recorded) => return Ok(recorded),
                Err(OutboundError::Unavailable(e)) => {
                    let delay: Duration = backoff.next_delay().max(t.backoff_base);
                    if Instant::now() + delay > give_up {
                        metrics::record_abandoned(self.channel, outcomes.len());
                        tracing::error!(error = %e, claim = %claim.0, "outcomes not recorded: the claim is recovered later");
                        return Err(TurnEnd::Backoff(format!("outcomes not recorded: {e}")));
                    }
                    tokio::time::sleep(delay).await;
                }
                Err(OutboundError::Fatal(e) | OutboundError::Refused(e)) => {
                    return Err(TurnEnd::Fatal(format!("recording outcomes: {e}")));
                }
            }
        }
    }

    /// Starts publishing `events` after the previous publish; does not wait for it.
    fn publish(&self, events: Vec<ResultEvent>) {
        if events.is_empty() {
            return;
        }
        let (results, channel) = (self.ports.results.clone(), self.channel);
        let mut book = self.lock();
        let previous = book.publishing.take();
        book.publishing = Some(tokio::spawn(async move {
            if let Some(previous) = previous {
                let _ = previous.await;
            }
            let step = Instant::now();
            if let Err(e) = results.publish(&events).await {
                tracing::warn!(error = %e, "result events left for the janitor's sweep");
            }
            metrics::turn_step(channel, "publish", step.elapsed());
        }));
    }
}

/// The failure that decides what the sender does: a fatal one over a backoff.
fn worse(a: Option<TurnEnd>, b: Option<TurnEnd>) -> Option<TurnEnd> {
    match (a, b) {
        (Some(a @ TurnEnd::Fatal(_)), _) | (_, Some(a @ TurnEnd::Fatal(_))) => Some(a),
        (a, b) => a.or(b),
    }
}
