//! The inbound publisher on NATS JetStream: committed inbox rows go to
//! `{prefix}.in.{ispb}.{msg type}` with `Nats-Msg-Id = {ispb}:{channel}:{resource id}`
//! and are marked published once JetStream has acknowledged them.
//!
//! Slots hand rows over through a bounded queue (`nats.publish_queue`): a full
//! queue makes them wait (back-pressure). One task drains it in rounds of up
//! to `nats.publish_batch` rows; a round's mark runs beside the next rounds.
//! While the bus is down the task leaves rows in Postgres for the republish
//! sweep instead of stalling the slots. Malformed rows are dead letters (view
//! `inbox_dead_letter`) and are never published.

mod bus;
mod series;
mod sql;
mod sweep;

pub use sql::MARK_PUBLISHED;

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::db::Db;
use cabine_actors::ports::{CommittedRow, InboundPublisher, PublishError};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::{CancellationToken, DropGuard};

pub use bus::subject_type;
use bus::{InboundBus, Outgoing};
use series::{self as m, Path};

use crate::bus::Subjects;
use crate::config::Settings;

/// A committed row waiting in the queue, with when it was handed over.
struct Queued {
    row: CommittedRow,
    at: Instant,
}

/// [`InboundPublisher`] on JetStream for one ISPB.
pub struct JetStreamPublisher {
    /// `None` once closed: rows handed over after that are left to the sweep.
    queue: RwLock<Option<mpsc::Sender<Queued>>>,
    bus: Arc<InboundBus>,
    page: usize,
    drain: Mutex<Option<JoinHandle<()>>>,
    _lag_probe: DropGuard,
}

impl JetStreamPublisher {
    /// Starts the drain task and the lag probe; both end when the publisher is
    /// dropped or closed. Needs a Tokio runtime.
    pub fn start(client: async_nats::Client, pool: Db, settings: &Settings) -> Self {
        m::describe();
        let nats = &settings.nats;
        let subjects = Subjects::new(nats, &settings.cluster.ispb);
        let bus = Arc::new(InboundBus::new(
            client,
            pool,
            subjects,
            settings.cluster.ispb.to_string(),
            nats.request_timeout,
            settings.postgres.query_timeout,
        ));
        let (queue, rx) = mpsc::channel(nats.publish_queue);
        let drain = tokio::spawn(drain(bus.clone(), rx, nats.publish_batch));
        let stop = CancellationToken::new();
        tokio::spawn(probe_lag(bus.clone(), nats.lag_probe_interval, stop.clone()));
        JetStreamPublisher {
            queue: RwLock::new(Some(queue)),
            bus,
            page: nats.publish_batch,
            drain: Mutex::new(Some(drain)),
            _lag_probe: stop.drop_guard(),
        }
    }

    /// Age of the oldest committed row not yet on the bus (also sets the gauge).
    pub async fn oldest_unpublished(&self) -> Result<Duration, PublishError> {
        self.bus.refresh_lag().await
    }

    /// The `Nats-Msg-Id` a row of `channel` with `resource_id` is published with.
    pub fn msg_id(&self, channel: &str, resource_id: &str) -> String {
        self.bus.msg_id(channel, resource_id)
    }

    /// Stops taking rows and publishes what is queued, for at most `within`.
    /// Returns false when time ran out (the rest is left to the sweep). Shared
    /// handles stay usable: rows handed over after the close are counted as deferred.
    pub async fn close(&self, within: Duration) -> bool {
        drop(self.queue.write().unwrap_or_else(|p| p.into_inner()).take());
        let Some(mut drain) = self.drain.lock().unwrap_or_else(|p| p.into_inner()).take() else { return true };
        match tokio::time::timeout(within, &mut drain).await {
            Ok(_) => true,
            Err(_) => {
                drain.abort();
                false
            }
        }
    }

    fn sender(&self) -> Option<mpsc::Sender<Queued>> {
        self.queue.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

fn record_depth(queue: &mpsc::Sender<Queued>) {
    let depth = queue.max_capacity() - queue.capacity();
    metrics::gauge!(m::QUEUE_DEPTH).set(depth as f64);
}

#[async_trait::async_trait]
impl InboundPublisher for JetStreamPublisher {
    async fn committed(&self, rows: Vec<CommittedRow>) {
        let at = Instant::now();
        let rows = rows.into_iter().filter(|r| r.message.malformed.is_none());
        let Some(queue) = self.sender() else {
            metrics::counter!(m::DEFERRED).increment(rows.count() as u64);
            return;
        };
        for row in rows {
            if queue.send(Queued { row, at }).await.is_err() {
                metrics::counter!(m::DEFERRED).increment(1);
            }
        }
        record_depth(&queue);
    }

    async fn sweep(&self, older_than: Duration) -> Result<usize, PublishError> {
        self.bus.sweep(older_than, self.page).await
    }

    async fn oldest_unpublished(&self) -> Result<Duration, PublishError> {
        self.bus.refresh_lag().await
    }
}

/// Rounds whose mark may still be running while the next round publishes. A
/// mark can wait on row locks: the confirmer holds the status reports it
/// correlates for its whole pass, and those rows were just published. Each
/// waiting mark holds a pooled connection (at most `postgres.query_timeout`).
const MARKS_IN_FLIGHT: usize = 4;

/// Publishes queued rows in rounds until every sender is gone; each round's
/// mark runs beside the next rounds (at most [`MARKS_IN_FLIGHT`]), and the
/// drain ends after the last mark. A mark cut short (the drain aborted by
/// `close`) leaves its rows to the sweep.
async fn drain(bus: Arc<InboundBus>, mut rx: mpsc::Receiver<Queued>, batch: usize) {
    let mut buf = Vec::with_capacity(batch);
    let mut marks = JoinSet::new();
    while rx.recv_many(&mut buf, batch).await > 0 {
        metrics::gauge!(m::QUEUE_DEPTH).set(rx.len() as f64);
        let rows: Vec<Outgoing> = buf.drain(..).map(outgoing).collect();
        if bus.is_down() {
            metrics::counter!(m::DEFERRED).increment(rows.len() as u64);
            continue;
        }
        let (_, acknowledged) = bus.send_round(rows, Path::Live).await;
        while marks.len() >= MARKS_IN_FLIGHT {
            marks.join_next().await;
        }
        let bus = bus.clone();
        marks.spawn(async move { bus.mark_published(&acknowledged).await });
    }
    while marks.join_next().await.is_some() {}
}

fn outgoing(q: Queued) -> Outgoing {
    let Queued { row, at } = q;
    Outgoing {
        id: row.id,
        channel: row.slot.channel.as_str().to_owned(),
        resource_id: row.message.resource_id,
        msg_def: row.message.meta.msg_def,
        raw: row.message.raw,
        committed_at: at,
    }
}

/// Refreshes the oldest-unpublished gauge every `every` until `stop`.
async fn probe_lag(bus: Arc<InboundBus>, every: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {
                if let Err(e) = bus.refresh_lag().await {
                    tracing::debug!(error = %e, "oldest-unpublished gauge not refreshed");
                }
            }
        }
    }
}
