//! One intake round of the dispatcher, run in a spawned task: pull up to
//! `pull_batch` requests from the shared consumer, store each (a valid one
//! once per MsgId, an unreadable one as `rejected_invalid`), acknowledge it
//! only once stored, then publish the result events the store returned. A
//! store failure leaves the rest unacknowledged: the bus redelivers them and
//! the MsgId makes a second insert a duplicate, never a second send.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::metrics;
use crate::outbound::{OutboundConfig, OutboundPorts, OutboundSignal};
use crate::ports::outbound::{Inserted, OutboundError};
use crate::ports::outbound_bus::{IngressError, OutboundRequest, Pulled};

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
    let mut events = Vec::new();
    for Pulled { request, ack } in pulled {
        let stored = match &request {
            OutboundRequest::Valid(m) => ports.store.insert(m).await,
            OutboundRequest::Invalid(m) => ports.store.insert_invalid(m).await,
        };
        match stored {
            Ok(Inserted::New { event, .. }) => {
                events.push(event);
                match &request {
                    OutboundRequest::Valid(m) => {
                        report.inserted += 1;
                        signal.work(m.channel);
                    }
                    OutboundRequest::Invalid(_) => report.invalid += 1,
                }
            }
            Ok(Inserted::Duplicate { .. }) => report.duplicates += 1,
            Err(OutboundError::Unavailable(e)) => {
                report.end = IntakeEnd::Unavailable(format!("storing a request: {e}"));
                break;
            }
            Err(OutboundError::Fatal(e)) => {
                report.end = IntakeEnd::Fatal(format!("storing a request: {e}"));
                break;
            }
        }
        if let Err(e) = ack.ack().await {
            tracing::warn!(error = %e, "stored request not acknowledged: the bus redelivers it (a duplicate then)");
            report.ack_failures += 1;
        }
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
