//! The Postgres [`IncidentLog`]: incidents go through a bounded queue to a
//! background writer (an actor never waits on Postgres for them), which folds
//! a repeat of the same (kind, channel, slot) within [`FOLD`] and writes one
//! `incident_event` row per incident. A full queue or a failed write drops
//! the incident and counts it (`cabine_incident_events_total{outcome}`).

use std::collections::HashMap;
use std::time::Duration;

use cabine_actors::domain::ChannelId;
use cabine_actors::ports::incident::{Incident, IncidentKind, IncidentLog};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::report::ReportError;
use crate::db::Db;
use crate::db::bounded;

/// Repeats of one incident within this are one row (every slot of a pod meets the same quarantine).
pub const FOLD: Duration = Duration::from_secs(30);
const QUEUE: usize = 1024;

pub struct PgIncidentLog {
    queue: mpsc::Sender<Incident>,
}

/// Where the writer writes.
#[derive(Clone)]
pub struct IncidentSink {
    pub db: Db,
    pub ispb: String,
    pub pod: String,
    pub timeout: Duration,
}

impl PgIncidentLog {
    /// Starts the writer (it ends when the log is dropped).
    pub fn start(sink: IncidentSink) -> Self {
        let (queue, incidents) = mpsc::channel(QUEUE);
        tokio::spawn(write(sink, incidents));
        PgIncidentLog { queue }
    }
}

fn counted(outcome: &'static str) {
    metrics::counter!("cabine_incident_events_total", "outcome" => outcome).increment(1);
}

impl IncidentLog for PgIncidentLog {
    fn record(&self, incident: Incident) {
        if self.queue.try_send(incident).is_err() {
            counted("dropped");
        }
    }
}

type Key = (IncidentKind, Option<ChannelId>, Option<u8>);

async fn write(sink: IncidentSink, mut incidents: mpsc::Receiver<Incident>) {
    let mut last: HashMap<Key, Instant> = HashMap::new();
    while let Some(i) = incidents.recv().await {
        let now = Instant::now();
        let key = (i.kind, i.channel, i.slot);
        if last.get(&key).is_some_and(|at| now.duration_since(*at) < FOLD) {
            counted("folded");
            continue;
        }
        last.insert(key, now);
        let (kind, channel, slot) = (i.kind.label(), i.channel.map(|c| c.as_str()), i.slot.map(i16::from));
        let (ispb, pod) = (&sink.ispb, &sink.pod);
        let written: Result<u64, ReportError> = bounded::with_conn(&sink.db, sink.timeout, |conn| async move {
            conn.execute(
                "INSERT INTO incident_event (ispb, pod, kind, channel, slot, detail) VALUES ($1, $2, $3, $4, $5, $6)",
                &[ispb, pod, &kind, &channel, &slot, &i.detail],
            )
            .await
            .map_err(|e| ReportError(e.to_string()))
        })
        .await;
        match written {
            Ok(_) => counted("written"),
            Err(e) => {
                counted("failed");
                tracing::warn!(kind, error = %e, "incident not recorded");
            }
        }
    }
}
