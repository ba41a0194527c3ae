//! One turn of a holding sender, run in a spawned task that owns the
//! connection and the send slot's gate: wait out a previous holder's busy
//! window (before taking any row) → breaker admission → take ≤ batch_size
//! ready rows (priority, deadline) → cut to the body budget → draw the
//! batch's cost from the bucket (a short refill is waited for with the rows in
//! hand) while the gate is armed alongside (one small fenced write) → drop
//! rows past their deadline → check the lease leaves room for a whole send →
//! pass the gate (armed within the margin, else armed again) → POST → record
//! every outcome (retrying while Postgres is down) → count the call on the
//! breaker → publish the result events in the background. Rows that are not
//! sent go back to the queue (`NotSent`, not an attempt). Losing the lease
//! during the POST does not abort it: it started inside the lease and the
//! gate, and its outcome is recorded.
//!
//! The result events are an outbox in the store (the janitor's sweep
//! republishes any left unpublished), so the turn does not wait for their
//! PubAck: it ends once the outcomes are recorded and counted, and the publish
//! overlaps the next turn. At most one publish per sender is in flight: a turn
//! with events to publish first waits for the previous one, which also keeps
//! a sender's events in order.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::verdict;
use crate::backoff::Backoff;
use crate::gate::{self, Blocked, Gate, Ready};
use crate::ledger::HeldLease;
use crate::metrics;
use crate::outbound::sender::{TurnEnd, TurnInput, TurnReport};
use crate::ports::breaker::{Admission, BreakerError, Call, CallOutcome};
use crate::ports::outbound::{Batch, ClaimToken, OutboundError, ReadyMessage, Recorded, SendResult};
use crate::ports::outbound_bus::ResultEvent;
use crate::ports::ratelimit::{BucketError, Draw};
use crate::ports::{GateError, IcomSender, SendRefused};

pub async fn run(input: TurnInput, conn: Box<dyn IcomSender>) -> TurnReport {
    let started = Instant::now();
    let mut input = input;
    let publishing = input.publishing.take();
    let gate = input.gate.clone();
    let mut turn = Turn { input, conn: Some(conn), gate, breaker: None, counted: false, publishing };
    let end = turn.play().await;
    TurnReport {
        end,
        conn: turn.conn,
        gate: turn.gate,
        took: started.elapsed(),
        breaker: turn.breaker,
        publishing: turn.publishing,
    }
}

struct Turn {
    input: TurnInput,
    conn: Option<Box<dyn IcomSender>>,
    /// The send slot's gate; the sender gets it back in the report.
    gate: Gate,
    breaker: Option<crate::ports::breaker::BreakerState>,
    /// The admitted call was reported to the breaker.
    counted: bool,
    /// The sender's result events being published (this turn's or the previous one's).
    publishing: Option<JoinHandle<()>>,
}

impl Turn {
    async fn play(&mut self) -> TurnEnd {
        let (ports, channel) = (self.input.ports.clone(), self.input.channel);
        if let Ready::Wait(left) = self.gate.ready(Instant::now()) {
            // A previous holder's POST may still be in flight: take no row before its window ends.
            tokio::time::sleep(left).await;
        }
        let step = Instant::now();
        let admitted = ports.breaker.admit(channel).await;
        metrics::turn_step(channel, "admit", step.elapsed());
        let call = match admitted {
            Ok(Admission::Admit(call)) => call,
            Ok(Admission::Refused { state, retry_after }) => {
                self.breaker = Some(state);
                return TurnEnd::BreakerRefused { state, retry_after };
            }
            Err(BreakerError::Unavailable(e)) => return TurnEnd::Backoff(format!("breaker unavailable: {e}")),
            Err(BreakerError::Fatal(e)) => return TurnEnd::Fatal(format!("breaker: {e}")),
        };
        let step = Instant::now();
        let taken = ports.store.take_ready(channel, self.input.size).await;
        metrics::turn_step(channel, "take", step.elapsed());
        let mut batch = match taken {
            Ok(batch) => batch,
            Err(e) => {
                self.forget(&call).await;
                return store_failure("taking ready rows", e);
            }
        };
        self.publish(std::mem::take(&mut batch.expired)).await;
        if batch.messages.is_empty() {
            self.forget(&call).await;
            return TurnEnd::Empty;
        }
        let end = self.send_batch(batch, &call).await;
        self.forget(&call).await;
        end
    }

    async fn send_batch(&mut self, batch: Batch, call: &Call) -> TurnEnd {
        let Batch { claim, messages, .. } = batch;
        let (due, overflow) = verdict::cut(messages, self.input.config.max_batch_bytes);
        let mut back = verdict::not_sent(&overflow, Duration::ZERO, "cut to fit the body limit");
        let (drawn, armed) = tokio::join!(draw(&self.input, &due), arm_ahead(&self.input, &mut self.gate));
        if let Err(end) = drawn {
            back.extend(verdict::not_sent(&due, end.wait(), &format!("rate bucket: {}", end.label())));
            return self.give_back(&claim, back, end).await;
        }
        if let Err(e) = armed {
            back.extend(verdict::not_sent(&due, Duration::ZERO, "send gate not armed"));
            return self.give_back(&claim, back, gate_failure(Blocked::Store(e))).await;
        }
        let now = self.input.clock.now();
        let (due, late): (Vec<ReadyMessage>, Vec<ReadyMessage>) = due.into_iter().partition(|m| m.deadline > now);
        back.extend(verdict::not_sent(&late, Duration::ZERO, "deadline passed before sending"));
        if due.is_empty() {
            return self.give_back(&claim, back, TurnEnd::Empty).await;
        }
        if let Err(blocked) = self.through_gate().await {
            back.extend(verdict::not_sent(&due, Duration::ZERO, "send gate closed"));
            return self.give_back(&claim, back, gate_failure(blocked)).await;
        }
        // After the gate (which may have waited or armed): the POST must fit in the lease too.
        let mut lease: HeldLease = self.input.lease.clone();
        if let Err(cause) = lease.ready_for(self.input.lease_budget, Duration::ZERO).await {
            back.extend(verdict::not_sent(&due, Duration::ZERO, "send lease lost"));
            return self.give_back(&claim, back, TurnEnd::LeaseLost(format!("send lease: {cause}"))).await;
        }
        let raws: Vec<bytes::Bytes> = due.iter().map(|m| m.raw.clone()).collect();
        let conn = self.conn.as_mut().expect("a turn owns its connection");
        let sent_at = Instant::now();
        self.gate.spend();
        let sent = conn.send(&raws).await;
        if sent.as_ref().map_or(true, |reply| reply.answered()) {
            // Answered, or refused before the wire: nothing of ours is in flight.
            self.gate.answered();
        }
        let reply = match sent {
            Ok(reply) => reply,
            Err(SendRefused::TooLarge(why)) if due.len() > 1 => {
                back.extend(verdict::not_sent(&due, Duration::ZERO, "batch over the body limit: splitting"));
                tracing::warn!(%why, "batch refused before the wire: the next turn sends one message");
                return self.give_back(&claim, back, TurnEnd::TooLarge).await;
            }
            Err(SendRefused::TooLarge(why)) => {
                back.push((due[0].msg_id.clone(), SendResult::Rejected { status: 413, reason: why }));
                return self.give_back(&claim, back, TurnEnd::Sent { reply: "too_large", messages: 0 }).await;
            }
            Err(SendRefused::Unusable(why)) => {
                back.extend(verdict::not_sent(&due, Duration::ZERO, "batch unusable"));
                return self.give_back(&claim, back, TurnEnd::Fatal(format!("batch unusable: {why}"))).await;
            }
        };
        let elapsed = sent_at.elapsed();
        metrics::send_batch(self.input.channel, reply.label(), due.len(), elapsed);
        if reply.breaks_connection() {
            self.conn = None;
        }
        let mut outcomes = verdict::outcomes(&reply, &due);
        outcomes.extend(back);
        let recorded = match self.record(&claim, &outcomes).await {
            Ok(recorded) => recorded,
            Err(end) => return end,
        };
        let counted = verdict::call_outcome(&reply, elapsed, self.input.config.slow_call);
        if let Some(end) = self.count(call, counted).await {
            return end;
        }
        self.publish(recorded.events).await;
        match reply {
            crate::ports::SendReply::RateLimited { retry_after } => {
                TurnEnd::RateLimited { retry_after: retry_after.unwrap_or(self.input.config.retry_after_default) }
            }
            other => TurnEnd::Sent { reply: other.label(), messages: due.len() },
        }
    }

    /// Passes the send gate right before the POST (arming again if the draw outlasted the margin).
    async fn through_gate(&mut self) -> Result<(), Blocked<GateError>> {
        let (gates, channel, slot) = (self.input.ports.gates.clone(), self.input.channel, self.input.slot);
        gate::pass(&mut self.gate, |fence, busy_for| gates.arm(channel, slot, fence, busy_for)).await
    }

    /// Records outcomes, retrying while the store is unavailable (within the patience).
    async fn record(&mut self, claim: &ClaimToken, outcomes: &[(String, SendResult)]) -> Result<Recorded, TurnEnd> {
        let step = Instant::now();
        let recorded = self.record_retrying(claim, outcomes).await;
        metrics::turn_step(self.input.channel, "record", step.elapsed());
        recorded
    }

    async fn record_retrying(
        &mut self,
        claim: &ClaimToken,
        outcomes: &[(String, SendResult)],
    ) -> Result<Recorded, TurnEnd> {
        let (store, cfg, t) = (&self.input.ports.store, &self.input.config, &self.input.timing);
        let give_up = Instant::now() + cfg.record_patience;
        let mut backoff = Backoff::new(t.backoff_base, t.backoff_max);
        loop {
            match store.record(claim, outcomes).await {
                Ok(recorded) => return Ok(recorded),
                Err(OutboundError::Unavailable(e)) => {
                    let delay = backoff.next_delay().max(t.backoff_base);
                    if Instant::now() + delay > give_up {
                        metrics::record_abandoned(self.input.channel, outcomes.len());
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

    /// Puts rows back (or records local refusals), then ends the turn with `end`.
    async fn give_back(&mut self, claim: &ClaimToken, outcomes: Vec<(String, SendResult)>, end: TurnEnd) -> TurnEnd {
        if outcomes.is_empty() {
            return end;
        }
        match self.record(claim, &outcomes).await {
            Ok(recorded) => {
                self.publish(recorded.events).await;
                end
            }
            Err(failure) => failure,
        }
    }

    /// Counts the call on the breaker; `Some` ends the turn (fatal).
    async fn count(&mut self, call: &Call, outcome: CallOutcome) -> Option<TurnEnd> {
        let step = Instant::now();
        let counted = self.input.ports.breaker.record(self.input.channel, call, outcome).await;
        metrics::turn_step(self.input.channel, "count", step.elapsed());
        match counted {
            Ok(state) => {
                self.counted = true;
                self.breaker = Some(state);
            }
            Err(BreakerError::Unavailable(e)) => tracing::warn!(error = %e, "breaker did not count the call"),
            Err(BreakerError::Fatal(e)) => return Some(TurnEnd::Fatal(format!("breaker: {e}"))),
        }
        None
    }

    /// A call that sent nothing frees its probe admission (a plain call needs no report).
    async fn forget(&mut self, call: &Call) {
        if call.is_probe() && !self.counted {
            let _ = self.count(call, CallOutcome::Ignored).await;
        }
    }

    /// Starts publishing `events` once the previous publish is done; does not wait for this one.
    async fn publish(&mut self, events: Vec<ResultEvent>) {
        if events.is_empty() {
            return;
        }
        if let Some(previous) = self.publishing.take() {
            let step = Instant::now();
            let _ = previous.await;
            metrics::turn_step(self.input.channel, "publish_wait", step.elapsed());
        }
        let (results, channel) = (self.input.ports.results.clone(), self.input.channel);
        self.publishing = Some(tokio::spawn(async move {
            let step = Instant::now();
            if let Err(e) = results.publish(&events).await {
                tracing::warn!(error = %e, "result events left for the janitor's sweep");
            }
            metrics::turn_step(channel, "publish", step.elapsed());
        }));
    }
}

/// Draws the batch's cost, waiting for a short refill; `Err` ends the turn.
async fn draw(input: &TurnInput, due: &[ReadyMessage]) -> Result<(), TurnEnd> {
    let step = Instant::now();
    let drawn = draw_waiting(input, due).await;
    metrics::turn_step(input.channel, "draw", step.elapsed());
    drawn
}

async fn draw_waiting(input: &TurnInput, due: &[ReadyMessage]) -> Result<(), TurnEnd> {
    let (ports, cfg) = (&input.ports, &input.config);
    let cost = cfg.costs.of_batch(due.iter().map(|m| m.msg_type.as_str()));
    let mut waited = Duration::ZERO;
    loop {
        match ports.bucket.try_take(input.channel, cost).await {
            Ok(Draw::Taken { .. }) => return Ok(()),
            Ok(Draw::Wait { retry_after }) if waited + retry_after <= cfg.bucket_wait_max => {
                tokio::time::sleep(retry_after).await;
                waited += retry_after;
            }
            Ok(Draw::Wait { retry_after }) => return Err(TurnEnd::BucketWait { retry_after }),
            Err(BucketError::Unavailable(e)) => {
                return Err(TurnEnd::Backoff(format!("rate bucket unavailable: {e}")));
            }
            Err(BucketError::TooCostly { cost, capacity }) if due.len() > 1 => {
                tracing::warn!(cost, capacity, "batch costs more than the bucket holds: splitting");
                return Err(TurnEnd::TooLarge);
            }
            Err(e) => return Err(TurnEnd::Fatal(format!("rate bucket: {e}"))),
        }
    }
}

/// Arms the send gate alongside the draw (one small fenced write), when it needs arming.
async fn arm_ahead(input: &TurnInput, gate: &mut Gate) -> Result<(), GateError> {
    if gate.ready(Instant::now()) != Ready::Arm {
        return Ok(());
    }
    let step = Instant::now();
    let armed = input.ports.gates.arm(input.channel, input.slot, gate.fence, gate.busy_for()).await;
    metrics::turn_step(input.channel, "arm", step.elapsed());
    armed.map(|()| gate.written(step))
}

fn gate_failure(blocked: Blocked<GateError>) -> TurnEnd {
    match blocked {
        Blocked::Store(GateError::FenceLost { ours, current }) => {
            TurnEnd::LeaseLost(format!("send gate fence lost: ours {ours}, current {current}"))
        }
        Blocked::Store(GateError::Unavailable(e)) => TurnEnd::Backoff(format!("send gate unavailable: {e}")),
        Blocked::Store(GateError::Fatal(e)) => TurnEnd::Fatal(format!("send gate: {e}")),
        Blocked::Slow(margin) => TurnEnd::Backoff(format!("send gate writes take longer than the margin ({margin:?})")),
    }
}

fn store_failure(what: &str, e: OutboundError) -> TurnEnd {
    match e {
        OutboundError::Unavailable(m) => TurnEnd::Backoff(format!("{what}: {m}")),
        OutboundError::Fatal(m) | OutboundError::Refused(m) => TurnEnd::Fatal(format!("{what}: {m}")),
    }
}
