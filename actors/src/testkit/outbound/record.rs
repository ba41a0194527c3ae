//! The fake store's outcome rules, as the Postgres statements apply them:
//! a 201 moves any queued/sending/in-doubt row to `sent`; every other outcome
//! applies only while the row is `sending` under the caller's claim (else it
//! is stale); failures count an attempt that may have reached the SPI and back
//! off `random × min(max, base × 2ⁿ)`, `in_doubt` past the deadline, `dead`
//! after the poison count; a 4xx after such an attempt is `in_doubt`, not
//! `rejected`; 429s and not-sent rows wait without counting an attempt
//! (`timeout` past the deadline only when nothing may have reached the SPI).

use std::time::{Duration, SystemTime};

use super::FakeOutboundPolicy;
use super::table::{StoredRow, Table};
use crate::ports::outbound::{
    ClaimToken, ConfirmOutcome, ConfirmRef, OutboundStatus, Recorded, SendResult, Settled, Settlement, SpiVerdict,
};
use crate::ports::outbound_bus::ResultEvent;

pub fn apply(
    t: &mut Table,
    policy: &FakeOutboundPolicy,
    now: SystemTime,
    claim: &ClaimToken,
    outcomes: &[(String, SendResult)],
) -> Recorded {
    let mut recorded = Recorded::default();
    for (msg_id, result) in outcomes {
        let Some(idx) = t.by_msg_id.get(msg_id).copied() else {
            recorded.stale.push(msg_id.clone());
            continue;
        };
        let row = &t.rows[idx];
        let ours = row.status == OutboundStatus::Sending && row.claim.as_deref() == Some(claim.0.as_str());
        let applies = match result {
            SendResult::Sent { .. } => {
                matches!(row.status, OutboundStatus::Queued | OutboundStatus::Sending | OutboundStatus::InDoubt)
            }
            _ => ours,
        };
        if !applies {
            t.audit.stale_outcomes += 1;
            recorded.stale.push(msg_id.clone());
            continue;
        }
        let (note, change) = outcome_change(policy, now, result);
        if let Some(event) = t.change(idx, now, Some(note), change) {
            recorded.events.push(event);
        }
    }
    recorded
}

type Change = Box<dyn FnOnce(&mut StoredRow)>;

/// The note and the row change one outcome makes.
fn outcome_change(policy: &FakeOutboundPolicy, now: SystemTime, result: &SendResult) -> (String, Change) {
    match result.clone() {
        SendResult::Sent { resource_id } => (
            resource_id.clone(),
            Box::new(move |r: &mut StoredRow| {
                (r.status, r.sent_at, r.last_error) = (OutboundStatus::Sent, Some(now), None);
                r.attempts += 1;
                r.resource_ids.push(resource_id);
                unclaim(r);
            }),
        ),
        SendResult::Rejected { status, reason } => {
            let note = format!("HTTP {status}: {reason}");
            let last = note.clone();
            (
                note,
                Box::new(move |r: &mut StoredRow| {
                    let status =
                        if r.maybe_stored_at.is_some() { OutboundStatus::InDoubt } else { OutboundStatus::Rejected };
                    (r.status, r.last_error) = (status, Some(last));
                    r.attempts += 1;
                    unclaim(r);
                }),
            )
        }
        SendResult::Failed { reason } => {
            let policy = policy.clone();
            let last = reason.clone();
            (
                reason,
                Box::new(move |r: &mut StoredRow| {
                    let delay = backoff(&policy, r.attempts - r.attempts_base);
                    after_doubtful_attempt(r, &policy, now);
                    (r.not_before, r.last_error) = (now + delay, Some(last));
                    unclaim(r);
                }),
            )
        }
        SendResult::RateLimited { retry_after } => {
            let wait = retry_after.unwrap_or(policy.retry_after_default);
            waiting(now, wait, format!("HTTP 429: retry after {} ms", wait.as_millis()))
        }
        SendResult::NotSent { retry_after, reason } => waiting(now, retry_after, format!("not sent: {reason}")),
    }
}

fn waiting(now: SystemTime, wait: Duration, note: String) -> (String, Change) {
    let last = note.clone();
    (
        note,
        Box::new(move |r: &mut StoredRow| {
            r.status = if r.deadline <= now { r.past_deadline() } else { OutboundStatus::Queued };
            (r.not_before, r.last_error) = (now + wait, Some(last));
            unclaim(r);
        }),
    )
}

fn unclaim(r: &mut StoredRow) {
    (r.claim, r.claimed_at) = (None, None);
}

/// After an attempt that may have reached the SPI (a failure, a vanished
/// sender): counted, remembered, and `in_doubt` past the deadline, `dead` at
/// the poison count, `queued` otherwise.
fn after_doubtful_attempt(r: &mut StoredRow, policy: &FakeOutboundPolicy, now: SystemTime) {
    r.status = if r.deadline <= now {
        OutboundStatus::InDoubt
    } else if r.attempts + 1 - r.attempts_base >= policy.poison_attempts {
        OutboundStatus::Dead
    } else {
        OutboundStatus::Queued
    };
    r.attempts += 1;
    r.maybe_stored_at = r.maybe_stored_at.or(Some(now));
}

/// Full jitter: uniform in `[0, min(max, base × 2ⁿ)]`.
fn backoff(policy: &FakeOutboundPolicy, n: u32) -> Duration {
    let ceiling = policy.backoff_base.saturating_mul(1u32 << n.min(20)).min(policy.backoff_max);
    ceiling.mul_f64(rand::random_range(0.0..=1.0))
}

/// Claims older than the processing timeout → back to the queue, counting an attempt.
pub fn recover(t: &mut Table, policy: &FakeOutboundPolicy, now: SystemTime, max: u32) -> Vec<ResultEvent> {
    let stale = t.pick(
        |r| r.status == OutboundStatus::Sending && r.claimed_at.is_some_and(|c| c + policy.processing_timeout < now),
        |r| r.claimed_at,
        max as usize,
    );
    stale
        .into_iter()
        .filter_map(|i| {
            let note = format!("claim {} expired: its sender vanished", t.rows[i].claim.clone().unwrap_or_default());
            let last = note.clone();
            t.change(i, now, Some(note), |r| {
                after_doubtful_attempt(r, policy, now);
                (r.not_before, r.last_error) = (now, Some(last));
                unclaim(r);
            })
        })
        .collect()
}

pub fn confirm(t: &mut Table, now: SystemTime, reference: &ConfirmRef, verdict: &SpiVerdict) -> ConfirmOutcome {
    let found = match reference {
        ConfirmRef::MsgId(m) => t.by_msg_id.get(m).copied(),
        ConfirmRef::EndToEndId(e) => t.rows.iter().position(|r| r.end_to_end_ids.contains(e)),
        ConfirmRef::Related(x) => {
            t.by_msg_id.get(x).copied().or_else(|| t.rows.iter().position(|r| r.resource_ids.contains(x)))
        }
    };
    let Some(idx) = found else { return ConfirmOutcome::Unknown };
    let status = t.rows[idx].status;
    if matches!(status, OutboundStatus::Confirmed | OutboundStatus::RejectedBySpi | OutboundStatus::RejectedInvalid) {
        return ConfirmOutcome::AlreadyFinal(status);
    }
    let (to, note) = match verdict {
        SpiVerdict::Confirmed => (OutboundStatus::Confirmed, None),
        SpiVerdict::Rejected { reason } => (OutboundStatus::RejectedBySpi, Some(reason.clone())),
    };
    let event = t.change(idx, now, note.clone(), |r| {
        (r.status, r.confirmed_at, r.last_error) = (to, Some(now), note);
        r.sent_at = r.sent_at.or(r.maybe_stored_at);
        unclaim(r);
    });
    match event {
        Some(event) => ConfirmOutcome::Applied(vec![event]),
        None => ConfirmOutcome::AlreadyFinal(status),
    }
}

/// The Reconciler's verdict on an `in_doubt` row; any other row is left alone.
pub fn settle(t: &mut Table, now: SystemTime, msg_id: &str, settlement: &Settlement) -> Settled {
    let Some(idx) = t.by_msg_id.get(msg_id).copied() else { return Settled::NotFound };
    let status = t.rows[idx].status;
    if status != OutboundStatus::InDoubt {
        return Settled::NotInDoubt(status);
    }
    let (to, note) = match settlement {
        Settlement::Stored(SpiVerdict::Confirmed) => (OutboundStatus::Confirmed, "reconciled: accepted".to_owned()),
        Settlement::Stored(SpiVerdict::Rejected { reason }) => {
            (OutboundStatus::RejectedBySpi, format!("reconciled: {reason}"))
        }
        Settlement::NotStored { evidence } => {
            (OutboundStatus::Timeout, format!("reconciled: never stored ({evidence})"))
        }
    };
    let event = t.change(idx, now, Some(note.clone()), |r| {
        (r.status, r.last_error) = (to, Some(note));
        if to != OutboundStatus::Timeout {
            r.confirmed_at = Some(now);
            r.sent_at = r.sent_at.or(r.maybe_stored_at);
        }
    });
    event.map_or(Settled::NotInDoubt(status), Settled::Done)
}
