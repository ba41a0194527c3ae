//! One intake round of the dispatcher, run in a spawned task: pull up to
//! `pull_batch` requests from the shared consumer, store them (a valid one
//! once per MsgId, an unreadable one as `rejected_invalid`), acknowledge each
//! only once it is stored, then publish the result events the store returned.
//!
//! Poison never wedges the intake (DESIGN §2.2):
//! - a request delivered more than `max_deliver` times is parked — kept as it
//!   came off the bus — and acknowledged, not tried again;
//! - a batch holding a redelivered request (an earlier round failed on it), or
//!   one whose values the store refused, is stored one request at a time, so
//!   the request that fails does not take the others along;
//! - a request whose values the store refuses on its own is parked at once.
//!
//! What a store outage leaves unstored stays unacknowledged: the bus
//! redelivers it and the MsgId makes a second insert a duplicate, never a
//! second send.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::domain::ChannelId;
use crate::metrics;
use crate::outbound::{OutboundConfig, OutboundPorts, OutboundSignal};
use crate::ports::outbound::{Inserted, OutboundError};
use crate::ports::outbound_bus::{IngressAck, IngressError, OutboundRequest, Pulled, ResultEvent, ResultStatus};

/// `stage` values: waiting on the bus (a drain may abort it: nothing was taken)...
pub const PULLING: u8 = 0;
/// ...or storing and acknowledging what was pulled (a drain lets it finish).
pub const STORING: u8 = 1;

#[derive(Debug, Default)]
pub struct IntakeReport {
    pub pulled: usize,
    pub inserted: usize,
    pub duplicates: usize,
    pub invalid: usize,
    /// Parked this round (past `max_deliver`, or refused by the store).
    pub parked: usize,
    pub ack_failures: usize,
    pub end: IntakeEnd,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub enum IntakeEnd {
    #[default]
    Done,
    /// The bus is unreachable: back off; unacknowledged requests come back.
    Unavailable(String),
    /// The store is unreachable: pull again only once it answers (a depth
    /// probe), so an outage does not spend the requests' deliveries.
    StoreUnavailable(String),
    Fatal(String),
}

impl IntakeEnd {
    /// The graver of two ends: fatal, then store trouble, then done.
    fn worst(self, other: IntakeEnd) -> IntakeEnd {
        let rank = |e: &IntakeEnd| match e {
            IntakeEnd::Done => 0,
            IntakeEnd::Unavailable(_) | IntakeEnd::StoreUnavailable(_) => 1,
            IntakeEnd::Fatal(_) => 2,
        };
        if rank(&other) > rank(&self) { other } else { self }
    }
}

/// What a round settled: the acknowledgements it owes, the events to publish, how it ended.
#[derive(Default)]
struct Round {
    report: IntakeReport,
    acks: Vec<Box<dyn IngressAck>>,
    events: Vec<ResultEvent>,
    /// Refused by the store on their own: parked at once, each with its reason.
    refused: Vec<(Pulled, String)>,
    /// Channels with new rows: hinted to the other pods once each.
    ready: Vec<ChannelId>,
}

impl Round {
    fn end(&mut self, end: IntakeEnd) {
        self.report.end = std::mem::take(&mut self.report.end).worst(end);
    }

    /// A request the store answered: counted, its event kept, its ack owed.
    fn stored(&mut self, pulled: Pulled, inserted: Inserted, signal: &OutboundSignal) {
        match (&pulled.request, inserted) {
            (_, Inserted::New { event }) if event.status == ResultStatus::RejectedInvalid => {
                self.report.invalid += 1;
                self.events.push(event);
            }
            (OutboundRequest::Valid(m), Inserted::New { event }) => {
                self.report.inserted += 1;
                signal.work(m.channel);
                if !self.ready.contains(&m.channel) {
                    self.ready.push(m.channel);
                }
                self.events.push(event);
            }
            (OutboundRequest::Invalid(_), Inserted::New { event }) => {
                self.report.invalid += 1;
                self.events.push(event);
            }
            (_, Inserted::Duplicate { .. }) => self.report.duplicates += 1,
        }
        self.acks.push(pulled.ack);
    }
}

pub async fn run(
    config: Arc<OutboundConfig>,
    ports: OutboundPorts,
    signal: OutboundSignal,
    stage: Arc<AtomicU8>,
) -> IntakeReport {
    stage.store(PULLING, Ordering::SeqCst);
    let started = tokio::time::Instant::now();
    let pulled = match ports.ingress.pull(config.pull_batch, config.pull_wait).await {
        Ok(pulled) => pulled,
        Err(IngressError::Unavailable(e)) => {
            return IntakeReport { end: IntakeEnd::Unavailable(e), ..Default::default() };
        }
        Err(IngressError::Fatal(e)) => return IntakeReport { end: IntakeEnd::Fatal(e), ..Default::default() },
    };
    stage.store(STORING, Ordering::SeqCst);
    metrics::intake_step("pull", started.elapsed());
    let storing = tokio::time::Instant::now();
    let mut round = Round::default();
    round.report.pulled = pulled.len();
    metrics::intake("pulled", pulled.len());
    let (fresh, exhausted): (Vec<Pulled>, Vec<Pulled>) =
        pulled.into_iter().partition(|p| p.arrival.deliveries <= config.max_deliver);
    store_fresh(&ports, fresh, &signal, &mut round).await;
    round.ready.iter().for_each(|channel| ports.hints.rows_stored(*channel));
    let why = format!("delivered more than outbound.max_deliver ({}) times without being stored", config.max_deliver);
    park(&ports, exhausted, &why, &mut round).await;
    for (pulled, why) in std::mem::take(&mut round.refused) {
        park(&ports, vec![pulled], &format!("refused by the store: {why}"), &mut round).await;
    }
    round.report.ack_failures = acknowledge(std::mem::take(&mut round.acks)).await;
    metrics::intake_step("store", storing.elapsed());
    count(&round.report);
    if !round.events.is_empty()
        && let Err(e) = ports.results.publish(&round.events).await
    {
        tracing::warn!(error = %e, "result events left for the janitor's sweep");
    }
    round.report
}

/// The requests within the delivery bound: one statement for all when each is
/// on its first delivery, else (or when the store refused the batch's values)
/// one request at a time.
async fn store_fresh(ports: &OutboundPorts, fresh: Vec<Pulled>, signal: &OutboundSignal, round: &mut Round) {
    if fresh.is_empty() {
        return;
    }
    if fresh.iter().any(|p| p.arrival.deliveries > 1) {
        return store_one_by_one(ports, fresh, signal, round).await;
    }
    let requests: Vec<OutboundRequest> = fresh.iter().map(|p| p.request.clone()).collect();
    match ports.store.insert_batch(&requests).await {
        Ok(stored) if stored.len() == fresh.len() => {
            fresh.into_iter().zip(stored).for_each(|(p, inserted)| round.stored(p, inserted, signal));
        }
        Ok(stored) => round.end(IntakeEnd::Fatal(format!("{} answers to {} requests", stored.len(), fresh.len()))),
        Err(OutboundError::Refused(why)) => {
            tracing::warn!(why, "the store refused a batch's values: storing it one request at a time");
            store_one_by_one(ports, fresh, signal, round).await;
        }
        Err(e) => round.end(store_end(&e)),
    }
}

/// Each request alone: one that fails leaves the others stored. An outage
/// stops the round (the rest stays unacknowledged); a request the store
/// refuses is parked; a fatal answer leaves that one unacknowledged (it comes
/// back, and past `max_deliver` it is parked) and ends the round fatal.
async fn store_one_by_one(ports: &OutboundPorts, pulled: Vec<Pulled>, signal: &OutboundSignal, round: &mut Round) {
    for p in pulled {
        match ports.store.insert_batch(std::slice::from_ref(&p.request)).await {
            Ok(mut one) if one.len() == 1 => round.stored(p, one.remove(0), signal),
            Ok(one) => round.end(IntakeEnd::Fatal(format!("{} answers to 1 request", one.len()))),
            Err(OutboundError::Refused(why)) => round.refused.push((p, why)),
            Err(e @ OutboundError::Unavailable(_)) => return round.end(store_end(&e)),
            Err(e) => {
                tracing::error!(error = %e, deliveries = p.arrival.deliveries, "a request the store failed on");
                round.end(store_end(&e));
            }
        }
    }
}

/// Parks `pulled` as it came off the bus; acknowledged once parked.
async fn park(ports: &OutboundPorts, pulled: Vec<Pulled>, why: &str, round: &mut Round) {
    if pulled.is_empty() {
        return;
    }
    let arrivals: Vec<_> = pulled.iter().map(|p| p.arrival.clone()).collect();
    match ports.store.park(&arrivals, why).await {
        Ok(_) => {
            for p in pulled {
                tracing::error!(ingress_ref = p.arrival.ingress_ref, deliveries = p.arrival.deliveries, why, "parked");
                round.report.parked += 1;
                round.acks.push(p.ack);
            }
        }
        Err(e) => round.end(store_end(&e)),
    }
}

fn store_end(e: &OutboundError) -> IntakeEnd {
    match e {
        OutboundError::Unavailable(m) => IntakeEnd::StoreUnavailable(format!("storing requests: {m}")),
        OutboundError::Refused(m) | OutboundError::Fatal(m) => IntakeEnd::Fatal(format!("storing requests: {m}")),
    }
}

fn count(report: &IntakeReport) {
    metrics::intake("inserted", report.inserted);
    metrics::intake("duplicate", report.duplicates);
    metrics::intake("invalid", report.invalid);
    metrics::intake("parked", report.parked);
    metrics::intake("ack_failed", report.ack_failures);
}

/// Acknowledges stored requests; returns how many failed (the bus redelivers them: duplicates then).
async fn acknowledge(acks: Vec<Box<dyn IngressAck>>) -> usize {
    let mut failures = 0;
    for ack in acks {
        if let Err(e) = ack.ack().await {
            tracing::warn!(error = %e, "stored request not acknowledged: the bus redelivers it (a duplicate then)");
            failures += 1;
        }
    }
    failures
}
