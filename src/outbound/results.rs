//! Result events to the bank's core on `{prefix}.out.result.{ispb}`: each
//! published with `Nats-Msg-Id = {msg_id}:{status}:{attempt}` (both awaits:
//! send, then the PubAck) and only then marked published in the history — the
//! outbox. Events left unpublished (NATS down, crash) are republished by
//! [`ResultSink::sweep`]; JetStream's duplicate window drops a republished
//! event it already has, and consumers dedupe on the same id beyond it.

use std::time::{Duration, SystemTime};

use crate::db::Db;
use async_nats::HeaderMap;
use async_nats::jetstream::{self, context::PublishAckFuture};
use bytes::Bytes;
use cabine_actors::ports::outbound_bus::{ResultEvent, ResultSink, ResultStatus, ResultsError};
use serde::Serialize;

use cabine_actors::ports::outbound::OutboundError;

use super::rows::pg_error;
use crate::db::bounded;

pub const STATUS_HEADER: &str = "Cabine-Status";
pub const MSG_ID_HEADER: &str = "Cabine-Msg-Id";

/// Marks acknowledged events published, committed without waiting for the WAL
/// flush (`synchronous_commit` off for this transaction only): a mark a
/// Postgres crash loses is an event the sweep republishes under the same
/// `Nats-Msg-Id`, the path a crash between the PubAck and the mark already takes.
/// The statements that change a message's state stay synchronous.
pub const MARK_PUBLISHED: &str = "\
UPDATE outbound_history SET published_at = now()
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
WHERE id = ANY($1)";

/// The JSON body of a result event.
#[derive(Debug, Serialize)]
pub struct ResultBody<'a> {
    pub msg_id: Option<&'a str>,
    pub ingress_ref: Option<&'a str>,
    pub channel: Option<&'a str>,
    pub status: &'a str,
    pub attempt: u32,
    /// RFC 3339, UTC.
    pub at: String,
    pub resource_ids: &'a [String],
    pub detail: Option<&'a str>,
}

impl<'a> ResultBody<'a> {
    pub fn of(e: &'a ResultEvent) -> Self {
        let at =
            time::OffsetDateTime::from(e.at).format(&time::format_description::well_known::Rfc3339).unwrap_or_default();
        ResultBody {
            msg_id: e.msg_id.as_deref(),
            ingress_ref: e.ingress_ref.as_deref(),
            channel: e.channel.map(|c| c.as_str()),
            status: e.status.as_str(),
            attempt: e.attempt,
            at,
            resource_ids: &e.resource_ids,
            detail: e.detail.as_deref(),
        }
    }
}

pub struct JetStreamResults {
    js: jetstream::Context,
    subject: String,
    pool: Db,
    /// Bound on each outbox statement (`postgres.query_timeout`): a sender's
    /// next turn waits for its previous publish, so a stuck mark would hold it.
    query_timeout: Duration,
}

impl JetStreamResults {
    /// `subject` is [`crate::bus::Subjects::results`].
    pub fn new(js: jetstream::Context, subject: String, pool: Db, query_timeout: Duration) -> Self {
        JetStreamResults { js, subject, pool, query_timeout }
    }

    /// One outbox statement within the query timeout (cancelled on the server past it).
    async fn bounded<T, F, Fut>(&self, op: F) -> Result<T, ResultsError>
    where
        F: FnOnce(bounded::Conn) -> Fut,
        Fut: std::future::Future<Output = Result<T, OutboundError>>,
    {
        bounded::with_conn(&self.pool, self.query_timeout, op)
            .await
            .map_err(|e| ResultsError::Unavailable(e.to_string()))
    }

    /// Sends every event, then awaits every PubAck; returns the ids acknowledged
    /// and the first error, if any.
    async fn send_all(&self, events: &[ResultEvent]) -> (Vec<i64>, Option<String>) {
        let mut pending: Vec<(i64, PublishAckFuture)> = Vec::with_capacity(events.len());
        let mut failure = None;
        for event in events {
            match self.js.publish_with_headers(self.subject.clone(), headers(event), body(event)).await {
                Ok(ack) => pending.push((event.id, ack)),
                Err(e) => {
                    failure = Some(format!("publish: {e}"));
                    break;
                }
            }
        }
        let mut acked = Vec::with_capacity(pending.len());
        for (id, ack) in pending {
            match ack.await {
                Ok(_) => acked.push(id),
                Err(e) => failure = failure.or(Some(format!("puback: {e}"))),
            }
        }
        (acked, failure)
    }

    async fn mark_published(&self, ids: &[i64]) -> Result<(), ResultsError> {
        if ids.is_empty() {
            return Ok(());
        }
        self.bounded(|client| async move { client.execute(MARK_PUBLISHED, &[&ids]).await.map_err(|e| pg_error(&e)) })
            .await?;
        Ok(())
    }

    async fn unpublished(&self, older_than: Duration, max: u32) -> Result<Vec<ResultEvent>, ResultsError> {
        let (older_than, max) = (older_than.as_millis() as i64, i64::from(max));
        let rows = self
            .bounded(|client| async move {
                client
                    .query(
                        "SELECT h.id, h.event, h.at, o.msg_id, o.ingress_ref, o.channel, h.attempt, o.resource_ids,
                                h.detail
                         FROM outbound_history h JOIN outbound o ON o.id = h.outbound_id
                         WHERE h.event IS NOT NULL AND h.published_at IS NULL
                           AND h.at < now() - $1::bigint * interval '1 millisecond'
                         ORDER BY h.id LIMIT $2",
                        &[&older_than, &max],
                    )
                    .await
                    .map_err(|e| pg_error(&e))
            })
            .await?;
        rows.iter().map(|r| event_of(r).map_err(ResultsError::Unavailable)).collect()
    }
}

fn event_of(r: &tokio_postgres::Row) -> Result<ResultEvent, String> {
    let e = |e: tokio_postgres::Error| e.to_string();
    Ok(ResultEvent {
        id: r.try_get(0).map_err(e)?,
        status: r.try_get::<_, String>(1).map_err(e)?.parse::<ResultStatus>()?,
        at: r.try_get::<_, SystemTime>(2).map_err(e)?,
        msg_id: r.try_get(3).map_err(e)?,
        ingress_ref: r.try_get(4).map_err(e)?,
        channel: r.try_get::<_, Option<String>>(5).map_err(e)?.and_then(|c| c.parse().ok()),
        attempt: u32::try_from(r.try_get::<_, i32>(6).map_err(e)?).unwrap_or(0),
        resource_ids: r.try_get(7).map_err(e)?,
        detail: r.try_get(8).map_err(e)?,
    })
}

fn headers(event: &ResultEvent) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(async_nats::header::NATS_MESSAGE_ID, event.dedup_id().as_str());
    h.insert(STATUS_HEADER, event.status.as_str());
    if let Some(m) = &event.msg_id {
        h.insert(MSG_ID_HEADER, m.as_str());
    }
    h
}

fn body(event: &ResultEvent) -> Bytes {
    Bytes::from(serde_json::to_vec(&ResultBody::of(event)).unwrap_or_default())
}

#[async_trait::async_trait]
impl ResultSink for JetStreamResults {
    async fn publish(&self, events: &[ResultEvent]) -> Result<usize, ResultsError> {
        let (acked, failure) = self.send_all(events).await;
        self.mark_published(&acked).await?;
        metrics::counter!("cabine_outbound_results_published_total").increment(acked.len() as u64);
        match failure {
            Some(e) => {
                metrics::counter!("cabine_outbound_results_failed_total")
                    .increment((events.len() - acked.len()) as u64);
                Err(ResultsError::Unavailable(e))
            }
            None => Ok(acked.len()),
        }
    }

    async fn sweep(&self, older_than: Duration, max: u32) -> Result<usize, ResultsError> {
        let events = self.unpublished(older_than, max).await?;
        if events.is_empty() {
            return Ok(0);
        }
        metrics::counter!("cabine_outbound_results_republished_total").increment(events.len() as u64);
        self.publish(&events).await
    }
}
