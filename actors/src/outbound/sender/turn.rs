//! One turn of a holding sender, run in a spawned task that owns the
//! connection and the send slot's gate. Only the POST is serialized per send
//! slot (its gate write goes out during the previous POST); the rest is pipelined:
//!
//! ```text
//! turn k:   [prepare k]? → deadline check → gate → lease check → POST k → finish k (background)
//!                                                               └ prepare k+1, arm k+1 ┘
//! ```
//!
//! A turn with nothing prepared first waits for the previous finish (the
//! breaker counted, rows given back) and a previous holder's busy window,
//! then prepares ([`prepare`]: admit ∥ take → cut → draw). While its POST is
//! in flight it prepares the next batch and arms the gate for it (one fenced
//! write after this POST left: the next POST leaves within the margin of it,
//! else the gate arms again right before); the moment the POST is answered its
//! outcomes go to the finish stage ([`finish`]: record → breaker → publish) in
//! the background, and the prepared batch comes back in the report for the
//! next turn. The breaker admits before each POST and the
//! bucket is drawn before the POST it pays for. A prepared batch is given back
//! (`NotSent`) unless the POST got a clean answer: after a 429, a call that
//! fails the breaker, a broken connection, or a failed previous finish.
//! Losing the lease during the POST does not abort it: it started inside the
//! lease and the gate, and its outcome is recorded.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::finish::Finish;
use super::prepare::{self, Prep, Prepared};
use super::verdict;
use crate::gate::{self, Blocked, Gate, Ready};
use crate::ledger::HeldLease;
use crate::metrics;
use crate::outbound::sender::{TurnEnd, TurnInput, TurnReport};
use crate::ports::breaker::{BreakerState, Call, CallOutcome};
use crate::ports::outbound::{ClaimToken, ReadyMessage, SendResult};
use crate::ports::{GateError, IcomSender, SendRefused, SendReply};

pub async fn run(mut input: TurnInput, conn: Box<dyn IcomSender>) -> TurnReport {
    let started = Instant::now();
    let (gate, prepared, last) = (input.gate.clone(), input.prepared.take(), input.finishing.take());
    let mut turn = Turn { input, conn: Some(conn), gate, breaker: None, last, next: None };
    let end = turn.play(prepared).await;
    TurnReport {
        end,
        conn: turn.conn,
        gate: turn.gate,
        took: started.elapsed(),
        breaker: turn.breaker.or(turn.input.line.breaker()),
        finishing: turn.last,
        prepared: turn.next,
    }
}

struct Turn {
    input: TurnInput,
    conn: Option<Box<dyn IcomSender>>,
    /// The send slot's gate; the sender gets it back in the report.
    gate: Gate,
    breaker: Option<BreakerState>,
    /// The last finish started (the next one starts after it).
    last: Option<JoinHandle<()>>,
    /// The batch prepared during the POST, for the next turn.
    next: Option<Prepared>,
}

/// A batch that passed the gate, and what its finish needs.
struct Posting {
    call: Call,
    claim: ClaimToken,
    due: Vec<ReadyMessage>,
    back: Vec<(String, SendResult)>,
    finish: Finish,
}

/// How a POST went.
struct Posted {
    end: TurnEnd,
    /// Answered 201 (or a permanent refusal) on a connection still usable: the prepared batch may go next.
    clean: bool,
    broke: bool,
}

impl Turn {
    async fn play(&mut self, prepared: Option<Prepared>) -> TurnEnd {
        let prepared = match prepared {
            Some(prepared) => prepared,
            None => match self.prepare_now().await {
                Ok(prepared) => prepared,
                Err(end) => return end,
            },
        };
        self.send(prepared).await
    }

    /// Nothing prepared: the previous finish and the previous holder's window first, then prepare.
    async fn prepare_now(&mut self) -> Result<Prepared, TurnEnd> {
        if let Some(last) = self.last.take() {
            let _ = last.await;
        }
        if let Some(failure) = self.input.line.take_failure() {
            return Err(failure);
        }
        if let Ready::Wait(left) = self.gate.ready(Instant::now()) {
            // A previous holder's POST (or our own unanswered one) may still be in flight: take no row before.
            tokio::time::sleep(left).await;
        }
        match prepare::prepare(&self.input).await {
            Prep::Ready(prepared) => Ok(prepared),
            Prep::Ended(end, finish) => {
                if let TurnEnd::BreakerRefused { state, .. } = end {
                    self.breaker = Some(state);
                }
                self.finish(finish).await;
                Err(end)
            }
        }
    }

    async fn send(&mut self, prepared: Prepared) -> TurnEnd {
        let Prepared { call, claim, due, mut back, expired } = prepared;
        let mut finish = Finish::with_events(expired);
        let now = self.input.clock.now();
        let (due, late): (Vec<ReadyMessage>, Vec<ReadyMessage>) = due.into_iter().partition(|m| m.deadline > now);
        back.extend(verdict::not_sent(&late, Duration::ZERO, "deadline passed before sending"));
        let refused = if due.is_empty() {
            Some((TurnEnd::Empty, ""))
        } else if let Err(blocked) = self.through_gate().await {
            Some((gate_failure(blocked), "send gate closed"))
        } else if let Err(cause) = lease_room(&self.input).await {
            Some((TurnEnd::LeaseLost(format!("send lease: {cause}")), "send lease lost"))
        } else {
            None
        };
        if let Some((end, why)) = refused {
            back.extend(verdict::not_sent(&due, Duration::ZERO, why));
            finish.record(claim, back);
            finish.forget(call);
            self.finish(finish).await;
            return end;
        }
        self.post(Posting { call, claim, due, back, finish }).await
    }

    /// POSTs while the next batch is prepared; the POST's finish starts the
    /// moment it is answered.
    async fn post(&mut self, posting: Posting) -> TurnEnd {
        let raws: Vec<bytes::Bytes> = posting.due.iter().map(|m| m.raw.clone()).collect();
        let previous = self.last.take();
        let (fence, busy_for) = (self.gate.fence, self.gate.busy_for());
        let (input, gate) = (&self.input, &mut self.gate);
        let conn = self.conn.as_mut().expect("a turn owns its connection");
        gate.spend();
        let post = async {
            let sent_at = Instant::now();
            let sent = conn.send(&raws).await;
            if sent.as_ref().map_or(true, |reply| reply.answered()) {
                // Answered, or refused before the wire: nothing of ours is in flight.
                gate.answered();
            }
            let (posted, finish) = conclude(input, sent, sent_at.elapsed(), posting);
            (posted, input.line.start(previous, finish).await)
        };
        let next = async {
            if !input.pipeline {
                return (None, None);
            }
            let next = prepare::prepare(input).await;
            // Arm the next POST now, after this one left: it goes out within the margin of this
            // write unless this POST outlasts the margin (then it is armed again right before).
            let armed = match next {
                Prep::Ready(_) => arm_early(input, fence, busy_for).await,
                Prep::Ended(..) => None,
            };
            (Some(next), armed)
        };
        let ((posted, last), (next, armed)) = tokio::join!(post, next);
        if let Some(sent) = armed {
            self.gate.written(sent);
        }
        self.last = Some(last);
        if posted.broke {
            self.conn = None;
        }
        let failure = self.input.line.take_failure();
        match next {
            Some(Prep::Ready(next)) if posted.clean && failure.is_none() => self.next = Some(next),
            Some(Prep::Ready(next)) => {
                self.finish(next.give_back(posted.end.wait(), "the POST before it was not answered cleanly")).await
            }
            // The next turn prepares afresh and meets the same end (empty, refused, bucket) itself.
            Some(Prep::Ended(_, leftovers)) => self.finish(leftovers).await,
            None => {}
        }
        failure.unwrap_or(posted.end)
    }

    /// Starts `finish` after the last one, in the background.
    async fn finish(&mut self, finish: Finish) {
        let last = self.input.line.start(self.last.take(), finish).await;
        self.last = Some(last);
    }

    /// Passes the send gate right before the POST (arming it: one small fenced write).
    async fn through_gate(&mut self) -> Result<(), Blocked<GateError>> {
        let (gates, channel, slot) = (self.input.ports.gates.clone(), self.input.channel, self.input.slot);
        let step = Instant::now();
        let passed = gate::pass(&mut self.gate, |fence, busy_for| gates.arm(channel, slot, fence, busy_for)).await;
        metrics::turn_step(channel, "arm", step.elapsed());
        passed
    }
}

/// What a POST's reply means for the turn, and the finish that records it.
fn conclude(
    input: &TurnInput,
    sent: Result<SendReply, SendRefused>,
    elapsed: Duration,
    posting: Posting,
) -> (Posted, Finish) {
    let Posting { call, claim, due, mut back, mut finish } = posting;
    let reply = match sent {
        Ok(reply) => reply,
        Err(refused) => {
            let (end, outcomes) = refused_before_the_wire(refused, &due);
            back.extend(outcomes);
            finish.record(claim, back);
            finish.forget(call);
            return (Posted { end, clean: false, broke: false }, finish);
        }
    };
    metrics::send_batch(input.channel, reply.label(), due.len(), elapsed);
    let mut outcomes = verdict::outcomes(&reply, &due);
    outcomes.extend(back);
    finish.record(claim, outcomes);
    let counted = verdict::call_outcome(&reply, elapsed, input.config.slow_call);
    finish.count(call, counted);
    let broke = reply.breaks_connection();
    let end = match reply {
        SendReply::RateLimited { retry_after } => {
            TurnEnd::RateLimited { retry_after: retry_after.unwrap_or(input.config.retry_after_default) }
        }
        other => TurnEnd::Sent { reply: other.label(), messages: due.len() },
    };
    let clean = matches!(end, TurnEnd::Sent { .. }) && counted != CallOutcome::Failure && !broke;
    (Posted { end, clean, broke }, finish)
}

/// One fenced write of the send slot's `busy_until` during the previous POST;
/// answers when it was sent (a failure is left for the gate pass before the POST).
async fn arm_early(input: &TurnInput, fence: i64, busy_for: Duration) -> Option<Instant> {
    let sent = Instant::now();
    let armed = input.ports.gates.arm(input.channel, input.slot, fence, busy_for).await;
    metrics::turn_step(input.channel, "arm", sent.elapsed());
    armed.ok().map(|()| sent)
}

/// After the gate (which may have waited or armed): the POST must fit in the lease too.
async fn lease_room(input: &TurnInput) -> Result<(), crate::ports::LostCause> {
    let mut lease: HeldLease = input.lease.clone();
    lease.ready_for(input.lease_budget, Duration::ZERO).await
}

/// A batch refused before the wire: split it, or refuse its one message.
fn refused_before_the_wire(refused: SendRefused, due: &[ReadyMessage]) -> (TurnEnd, Vec<(String, SendResult)>) {
    match refused {
        SendRefused::TooLarge(why) if due.len() > 1 => {
            tracing::warn!(%why, "batch refused before the wire: the next turn sends one message");
            (TurnEnd::TooLarge, verdict::not_sent(due, Duration::ZERO, "batch over the body limit: splitting"))
        }
        SendRefused::TooLarge(why) => (
            TurnEnd::Sent { reply: "too_large", messages: 0 },
            vec![(due[0].msg_id.clone(), SendResult::Rejected { status: 413, reason: why })],
        ),
        SendRefused::Unusable(why) => {
            (TurnEnd::Fatal(format!("batch unusable: {why}")), verdict::not_sent(due, Duration::ZERO, "batch unusable"))
        }
    }
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
