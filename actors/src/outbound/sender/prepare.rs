//! The first stage of a sender's turn, run while the previous POST is in
//! flight (or at the turn's start when nothing was prepared): breaker
//! admission ∥ take ≤ batch_size ready rows (priority, deadline) → cut to the
//! body budget → draw the batch's cost from the bucket (a short refill is
//! waited for with the rows in hand). A prepared batch is admitted, claimed
//! and paid for, but not armed: its gate write comes last, right before its
//! own POST. A prepared batch that will not be sent goes back to the queue
//! ([`Prepared::give_back`]: `NotSent`, not an attempt).

use std::time::Duration;

use tokio::time::Instant;

use super::finish::Finish;
use super::verdict;
use crate::metrics;
use crate::outbound::sender::{TurnEnd, TurnInput};
use crate::ports::breaker::{Admission, BreakerError, Call};
use crate::ports::outbound::{Batch, ClaimToken, OutboundError, ReadyMessage, SendResult};
use crate::ports::outbound_bus::ResultEvent;
use crate::ports::ratelimit::{BucketError, Draw};

/// A batch ready to be armed and posted.
pub struct Prepared {
    pub call: Call,
    pub claim: ClaimToken,
    pub due: Vec<ReadyMessage>,
    /// Outcomes already decided (rows cut for the body limit go back).
    pub back: Vec<(String, SendResult)>,
    /// Result events of rows the take expired.
    pub expired: Vec<ResultEvent>,
}

impl Prepared {
    /// Everything back to the queue (after `retry_after`), the admission freed.
    pub fn give_back(self, retry_after: Duration, reason: &str) -> Finish {
        let Prepared { call, claim, due, mut back, expired } = self;
        back.extend(verdict::not_sent(&due, retry_after, reason));
        let mut finish = Finish::with_events(expired);
        finish.record(claim, back);
        finish.forget(call);
        finish
    }
}

/// What preparing gave.
pub enum Prep {
    Ready(Prepared),
    /// Nothing to post: the turn ends so; the finish puts back what was taken.
    Ended(TurnEnd, Finish),
}

pub async fn prepare(input: &TurnInput) -> Prep {
    let (call, taken) = match admit_and_take(input).await {
        Ok(admitted) => admitted,
        Err(ended) => return ended,
    };
    let batch = match taken {
        Ok(batch) => batch,
        Err(e) => {
            let mut finish = Finish::default();
            finish.forget(call);
            return Prep::Ended(store_failure("taking ready rows", e), finish);
        }
    };
    if batch.messages.is_empty() {
        let mut finish = Finish::with_events(batch.expired);
        finish.forget(call);
        return Prep::Ended(TurnEnd::Empty, finish);
    }
    let (due, overflow) = verdict::cut(batch.messages, input.config.max_batch_bytes);
    let back = verdict::not_sent(&overflow, Duration::ZERO, "cut to fit the body limit");
    let prepared = Prepared { call, claim: batch.claim, due, back, expired: batch.expired };
    match draw(input, &prepared.due).await {
        Ok(()) => Prep::Ready(prepared),
        Err(end) => {
            let why = format!("rate bucket: {}", end.label());
            let finish = prepared.give_back(end.wait(), &why);
            Prep::Ended(end, finish)
        }
    }
}

/// Breaker admission and the take: side by side while the breaker was last
/// seen letting traffic through (one round trip less per turn), else the
/// admission first, so an open or unreachable breaker does not churn rows out
/// and back.
async fn admit_and_take(input: &TurnInput) -> Result<(Call, Result<Batch, OutboundError>), Prep> {
    let (ports, channel) = (&input.ports, input.channel);
    let admit = async {
        let step = Instant::now();
        let admitted = ports.breaker.admit(channel).await;
        metrics::turn_step(channel, "admit", step.elapsed());
        admitted
    };
    let take = async {
        let step = Instant::now();
        let taken = ports.store.take_ready(channel, input.size).await;
        metrics::turn_step(channel, "take", step.elapsed());
        taken
    };
    if input.line.flowing() {
        let (admitted, taken) = tokio::join!(admit, take);
        return match admission(input, admitted) {
            Ok(call) => Ok((call, taken)),
            Err(end) => Err(Prep::Ended(end, untaken(taken))),
        };
    }
    let call = admission(input, admit.await).map_err(|end| Prep::Ended(end, Finish::default()))?;
    Ok((call, take.await))
}

/// The call admitted, or how the turn ends; what it said is noted on the line
/// (a refusal or a failure stops the next takes from running beside the admission).
fn admission(input: &TurnInput, admitted: Result<Admission, BreakerError>) -> Result<Call, TurnEnd> {
    let (refused_in, failed) = match &admitted {
        Ok(Admission::Admit(_)) => (None, false),
        Ok(Admission::Refused { state, .. }) => (Some(*state), false),
        Err(_) => (None, true),
    };
    input.line.admission_seen(refused_in, failed);
    match admitted {
        Ok(Admission::Admit(call)) => Ok(call),
        Ok(Admission::Refused { state, retry_after }) => Err(TurnEnd::BreakerRefused { state, retry_after }),
        Err(BreakerError::Unavailable(e)) => Err(TurnEnd::Backoff(format!("breaker unavailable: {e}"))),
        Err(BreakerError::Fatal(e)) => Err(TurnEnd::Fatal(format!("breaker: {e}"))),
    }
}

/// Rows taken beside an admission that did not come: straight back, not an attempt.
fn untaken(taken: Result<Batch, OutboundError>) -> Finish {
    let Ok(batch) = taken else { return Finish::default() };
    let mut finish = Finish::with_events(batch.expired);
    finish
        .record(batch.claim, verdict::not_sent(&batch.messages, Duration::ZERO, "the breaker did not admit the call"));
    finish
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

pub fn store_failure(what: &str, e: OutboundError) -> TurnEnd {
    match e {
        OutboundError::Unavailable(m) => TurnEnd::Backoff(format!("{what}: {m}")),
        OutboundError::Fatal(m) | OutboundError::Refused(m) => TurnEnd::Fatal(format!("{what}: {m}")),
    }
}
