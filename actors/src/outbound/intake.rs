//! One intake round of the dispatcher, run in a spawned task: pull up to
//! `pull_batch` requests from the shared consumer, store them in one batch (a
//! valid one once per MsgId, an unreadable one as `rejected_invalid`),
//! acknowledge them only once that batch is stored, then publish the result
//! events the store returned. A store failure leaves them all unacknowledged:
//! the bus redelivers them and the MsgId makes a second insert a duplicate,
//! never a second send.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::metrics;
use crate::outbound::{OutboundConfig, OutboundPorts, OutboundSignal};
use crate::ports::outbound::{Inserted, OutboundError};
use crate::ports::outbound_bus::{IngressAck, IngressError, OutboundRequest, Pulled};

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
    pub ack_failures: usize,
    pub end: IntakeEnd,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub enum IntakeEnd {
    #[default]
    Done,
    /// Bus or store unreachable: back off; unacknowledged requests come back.
    Unavailable(String),
    Fatal(String),
}

pub async fn run(
    config: Arc<OutboundConfig>,
    ports: OutboundPorts,
    signal: OutboundSignal,
    stage: Arc<AtomicU8>,
) -> IntakeReport {
    stage.store(PULLING, Ordering::SeqCst);
    let mut report = IntakeReport::default();
    let started = tokio::time::Instant::now();
    let pulled = match ports.ingress.pull(config.pull_batch, config.pull_wait).await {
        Ok(pulled) => pulled,
        Err(IngressError::Unavailable(e)) => return IntakeReport { end: IntakeEnd::Unavailable(e), ..report },
        Err(IngressError::Fatal(e)) => return IntakeReport { end: IntakeEnd::Fatal(e), ..report },
    };
    stage.store(STORING, Ordering::SeqCst);
    metrics::intake_step("pull", started.elapsed());
    let storing = tokio::time::Instant::now();
    report.pulled = pulled.len();
    metrics::intake("pulled", pulled.len());
    let (requests, acks): (Vec<OutboundRequest>, Vec<_>) =
        pulled.into_iter().map(|Pulled { request, ack }| (request, ack)).unzip();
    let mut events = Vec::new();
    match store(&ports, &requests).await {
        Ok(stored) => {
            for (request, inserted) in requests.iter().zip(stored) {
                match (request, inserted) {
                    (OutboundRequest::Valid(m), Inserted::New { event }) => {
                        report.inserted += 1;
                        signal.work(m.channel);
                        events.push(event);
                    }
                    (OutboundRequest::Invalid(_), Inserted::New { event }) => {
                        report.invalid += 1;
                        events.push(event);
                    }
                    (_, Inserted::Duplicate { .. }) => report.duplicates += 1,
                }
            }
            report.ack_failures = acknowledge(acks).await;
        }
        Err(end) => report.end = end,
    }
    metrics::intake_step("store", storing.elapsed());
    metrics::intake("inserted", report.inserted);
    metrics::intake("duplicate", report.duplicates);
    metrics::intake("invalid", report.invalid);
    metrics::intake("ack_failed", report.ack_failures);
    if !events.is_empty()
        && let Err(e) = ports.results.publish(&events).await
    {
        tracing::warn!(error = %e, "result events left for the janitor's sweep");
    }
    report
}

/// One statement for the whole batch; an error leaves every request unacknowledged.
async fn store(ports: &OutboundPorts, requests: &[OutboundRequest]) -> Result<Vec<Inserted>, IntakeEnd> {
    if requests.is_empty() {
        return Ok(Vec::new());
    }
    match ports.store.insert_batch(requests).await {
        Ok(stored) if stored.len() == requests.len() => Ok(stored),
        Ok(stored) => Err(IntakeEnd::Fatal(format!("{} answers to {} requests", stored.len(), requests.len()))),
        Err(OutboundError::Unavailable(e)) => Err(IntakeEnd::Unavailable(format!("storing requests: {e}"))),
        Err(OutboundError::Fatal(e)) => Err(IntakeEnd::Fatal(format!("storing requests: {e}"))),
    }
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
