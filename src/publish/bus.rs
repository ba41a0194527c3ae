//! One publication round: every row of a set is sent to JetStream (first
//! await), then every PubAck is awaited (second await), then the acknowledged
//! rows are marked published in one UPDATE (the live path runs it beside the
//! next round). A row whose round fails stays unpublished in Postgres for the
//! sweep; its `Nats-Msg-Id` makes a second publication of the same row a no-op
//! inside the stream's duplicate window.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::db::Db;
use async_nats::connection::State;
use async_nats::jetstream::context::{PublishAckFuture, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, context::PublishError};
use bytes::Bytes;
use futures::future::join_all;

use super::series::{self as m, Path};
use super::sql;
use crate::bus::Subjects;

/// After a round the bus failed, live rows go straight to the sweep for this long,
/// so a dead JetStream costs the slots one PubAck timeout, not one per batch.
const BUS_DOWN_COOLDOWN: Duration = Duration::from_secs(1);

/// One inbox row on its way to the bus.
#[derive(Clone, Debug)]
pub struct Outgoing {
    pub id: i64,
    pub channel: String,
    pub resource_id: String,
    pub msg_def: Option<String>,
    pub raw: Bytes,
    /// When it was committed (local clock), for the lag histogram.
    pub committed_at: Instant,
}

/// What a round achieved.
#[derive(Debug, Default)]
pub struct Round {
    pub published: usize,
    pub failed: usize,
    /// The bus itself failed (timeout, no stream, connection): not one row's fault.
    pub bus_failed: bool,
    /// Rows whose publication failed, by reason, and the first such error: one
    /// warning per round (a missing stream fails every row alike).
    failures: std::collections::BTreeMap<&'static str, usize>,
    first_error: Option<String>,
}

impl Round {
    /// One warning for the round's bus failures, however many rows they hit.
    fn warn_once(&self) {
        let Some(error) = &self.first_error else { return };
        let rows: usize = self.failures.values().sum();
        let hint = if self.failures.contains_key("no_stream") {
            "no JetStream stream takes the inbound subjects: run `cabine migrate` or set postgres.migrate_on_start"
        } else {
            "the sweep will retry"
        };
        tracing::warn!(rows, reasons = ?self.failures, %error, "publication failed: {hint}");
    }
}

/// JetStream plus the inbox rows it publishes, for one ISPB.
pub struct InboundBus {
    pub js: jetstream::Context,
    pub client: async_nats::Client,
    pub pool: Db,
    pub subjects: Subjects,
    pub ispb: String,
    pub query_timeout: Duration,
    down_until: Mutex<Option<Instant>>,
}

impl InboundBus {
    pub fn new(
        client: async_nats::Client,
        pool: Db,
        subjects: Subjects,
        ispb: String,
        ack_timeout: Duration,
        query_timeout: Duration,
    ) -> Self {
        let js = jetstream::context::ContextBuilder::new().timeout(ack_timeout).build(client.clone());
        InboundBus { js, client, pool, subjects, ispb, query_timeout, down_until: Mutex::new(None) }
    }

    pub fn is_connected(&self) -> bool {
        self.client.connection_state() == State::Connected
    }

    /// Disconnected, or a round failed less than [`BUS_DOWN_COOLDOWN`] ago.
    pub fn is_down(&self) -> bool {
        let cooling = self.down_until.lock().map(|d| d.is_some_and(|t| Instant::now() < t)).unwrap_or(false);
        cooling || !self.is_connected()
    }

    /// `Nats-Msg-Id` of a row: `{ispb}:{channel}:{resource id}` (control characters
    /// replaced, as a header value cannot carry them).
    pub fn msg_id(&self, channel: &str, resource_id: &str) -> String {
        let id = format!("{}:{channel}:{resource_id}", self.ispb);
        id.chars().map(|c| if c.is_control() { '?' } else { c }).collect()
    }

    /// A round and its mark, one after the other (the sweep's pace).
    pub async fn publish(&self, rows: Vec<Outgoing>, path: Path) -> Round {
        let (round, acknowledged) = self.send_round(rows, path).await;
        self.mark_published(&acknowledged).await;
        round
    }

    /// Sends a round and awaits its PubAcks; answers the ids to mark published.
    pub async fn send_round(&self, rows: Vec<Outgoing>, path: Path) -> (Round, Vec<i64>) {
        let mut round = Round::default();
        let mut pending: Vec<(&Outgoing, PublishAckFuture)> = Vec::with_capacity(rows.len());
        for row in &rows {
            let subject = self.subjects.inbound(subject_type(row.msg_def.as_deref()));
            let message = PublishMessage::build()
                .message_id(self.msg_id(&row.channel, &row.resource_id))
                .payload(row.raw.clone());
            match self.js.send_publish(subject, message).await {
                Ok(ack) => pending.push((row, ack)),
                Err(e) => self.failed(&mut round, row, &e),
            }
        }
        let acks = join_all(pending.into_iter().map(|(row, ack)| async move { (row, ack.await) })).await;
        let mut acknowledged = Vec::with_capacity(acks.len());
        for (row, ack) in acks {
            match ack {
                Ok(ack) => {
                    if ack.duplicate {
                        metrics::counter!(m::BUS_DUPLICATES).increment(1);
                    }
                    metrics::histogram!(m::LAG, "path" => path.as_str())
                        .record(row.committed_at.elapsed().as_secs_f64());
                    acknowledged.push(row.id);
                }
                Err(e) => self.failed(&mut round, row, &e),
            }
        }
        round.warn_once();
        round.published = acknowledged.len();
        metrics::counter!(m::PUBLISHED, "path" => path.as_str()).increment(round.published as u64);
        if round.bus_failed
            && let Ok(mut d) = self.down_until.lock()
        {
            *d = Some(Instant::now() + BUS_DOWN_COOLDOWN);
        }
        (round, acknowledged)
    }

    fn failed(&self, round: &mut Round, row: &Outgoing, e: &PublishError) {
        round.failed += 1;
        let reason = match e.kind() {
            PublishErrorKind::TimedOut => "timeout",
            PublishErrorKind::StreamNotFound => "no_stream",
            PublishErrorKind::BrokenPipe => "broken_pipe",
            PublishErrorKind::MaxPayloadExceeded => "too_large",
            _ => "other",
        };
        round.bus_failed |= reason != "too_large";
        metrics::counter!(m::FAILURES, "reason" => reason).increment(1);
        if reason == "too_large" {
            tracing::error!(id = row.id, resource_id = %row.resource_id, error = %e, "inbox row cannot be published");
            return;
        }
        *round.failures.entry(reason).or_default() += 1;
        round.first_error.get_or_insert_with(|| e.to_string());
    }

    /// One UPDATE for the whole round. If it fails the rows stay unpublished and the
    /// sweep republishes them: JetStream drops the copies as duplicates.
    pub async fn mark_published(&self, ids: &[i64]) {
        if ids.is_empty() {
            return;
        }
        let mark = async {
            let conn = self.pool.get().await.map_err(|e| e.to_string())?;
            let stmt = conn.prepare_cached(sql::MARK_PUBLISHED).await.map_err(|e| e.to_string())?;
            conn.execute(&stmt, &[&ids]).await.map_err(|e| e.to_string())
        };
        let outcome = tokio::time::timeout(self.query_timeout, mark).await.unwrap_or_else(|_| Err("timeout".into()));
        if let Err(error) = outcome {
            metrics::counter!(m::FAILURES, "reason" => "mark").increment(ids.len() as u64);
            tracing::warn!(rows = ids.len(), %error, "published rows not marked; the sweep will republish them");
        }
    }
}

/// The subject's type tokens: `pacs.008` from `pacs.008.spi.1.16` (the rule of
/// [`MessageMeta::msg_type`]), or `unknown` when there is none or it would not
/// make valid subject tokens.
pub fn subject_type(msg_def: Option<&str>) -> &str {
    let valid = |tok: &str| !tok.is_empty() && tok.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    msg_def
        .and_then(|d| d.match_indices('.').nth(1).map(|(i, _)| &d[..i]))
        .filter(|t| t.split('.').all(valid))
        .unwrap_or("unknown")
}

#[cfg(test)]
mod tests {
    use cabine_actors::ports::MessageMeta;

    use super::*;

    #[test]
    fn subject_type_follows_msg_type_and_refuses_bad_tokens() {
        for def in ["pacs.008.spi.1.16", "pacs.002.spi.1.15", "admi.002.spi.1.3", "admi", "camt.060"] {
            let meta = MessageMeta { msg_def: Some(def.into()), ..Default::default() };
            assert_eq!(subject_type(Some(def)), meta.msg_type(), "{def}");
        }
        for bad in ["pa cs.008.x", "pacs.*.x", "pacs.>.x", ".008.x", "pacs..x", "pács.008.x"] {
            assert_eq!(subject_type(Some(bad)), "unknown", "{bad}");
        }
        assert_eq!(subject_type(None), "unknown");
    }
}
