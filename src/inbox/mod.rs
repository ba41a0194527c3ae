//! The Postgres inbox of one ISPB: fenced slot claims and the commit of a
//! received batch together with its stream's next cursor (DESIGN §2.2–2.4).
//!
//! Every write of a holder is one statement conditioned on the slot row's
//! fence, so a holder that has been superseded can neither move the stream
//! nor commit a message. Statements are prepared once per pooled connection
//! and bounded by `postgres.query_timeout`.

mod batch;
mod fault;
mod sql;

use std::future::Future;
use std::time::{Duration, Instant};

use cabine_actors::domain::{ChannelId, Ispb, SlotId};
use cabine_actors::ports::{Claim, CommitSummary, CommittedRow, InboundMessage, InboxError, InboxStore, SlotCursor};
use deadpool_postgres::Object;

use crate::db::Db;

pub use batch::MAX_BATCH;
pub use fault::is_transient;

use batch::BatchColumns;

/// [`InboxStore`] on Postgres for one participant.
#[derive(Clone)]
pub struct PgInbox {
    pool: Db,
    ispb: String,
    query_timeout: Duration,
}

impl PgInbox {
    pub fn new(pool: Db, ispb: &Ispb, query_timeout: Duration) -> Self {
        describe_metrics();
        PgInbox { pool, ispb: ispb.to_string(), query_timeout }
    }

    /// Runs `op` on a pooled connection within the query timeout (cancelled on the server past it).
    async fn with_conn<T, F, Fut>(&self, op: F) -> Result<T, InboxError>
    where
        F: FnOnce(crate::db::bounded::Conn) -> Fut,
        Fut: Future<Output = Result<T, InboxError>>,
    {
        crate::db::bounded::with_conn(&self.pool, self.query_timeout, op).await
    }

    /// The refusal of a write whose fence is no longer the slot's.
    async fn fence_lost(&self, conn: &Object, slot: SlotId, ours: i64) -> InboxError {
        let (ispb, channel, n) = (self.ispb.as_str(), slot.channel.as_str(), i16::from(slot.n));
        let current = async {
            let stmt = conn.prepare_cached(sql::CURRENT_FENCE).await?;
            conn.query_one(&stmt, &[&ispb, &channel, &n]).await.map(|r| r.get::<_, i64>(0))
        };
        metrics::counter!("cabine_inbox_fence_lost_total", "channel" => slot.channel.as_str()).increment(1);
        match current.await {
            Ok(current) => InboxError::FenceLost { ours, current },
            Err(e) => fault::from_postgres(e),
        }
    }
}

#[async_trait::async_trait]
impl InboxStore for PgInbox {
    async fn claim(&self, slot: SlotId, holder: &str, busy_for: Duration) -> Result<Claim, InboxError> {
        let (ispb, channel, n) = (self.ispb.as_str(), slot.channel.as_str(), i16::from(slot.n));
        let busy_ms = millis(busy_for);
        let claim = self
            .with_conn(|conn| async move {
                let stmt = conn.prepare_cached(sql::CLAIM).await.map_err(fault::from_postgres)?;
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [&ispb, &channel, &n, &holder, &busy_ms];
                let row = conn.query_one(&stmt, &params).await.map_err(fault::from_postgres)?;
                let wait = Duration::from_millis(u64::try_from(row.get::<_, i64>("wait_ms")).unwrap_or(0));
                Ok(Claim { fence: row.get("fence"), pull_next: row.get("pull_next"), wait })
            })
            .await?;
        metrics::counter!("cabine_inbox_claims_total", "channel" => slot.channel.as_str()).increment(1);
        Ok(claim)
    }

    async fn commit(
        &self,
        slot: SlotId,
        fence: i64,
        batch: &[InboundMessage],
        pull_next: &str,
        busy_for: Duration,
    ) -> Result<CommitSummary, InboxError> {
        if batch.len() > MAX_BATCH {
            return Err(InboxError::Fatal(format!("a batch of {} messages exceeds {MAX_BATCH}", batch.len())));
        }
        let started = Instant::now();
        let cols = BatchColumns::from_messages(batch);
        let (ispb, channel, n) = (self.ispb.as_str(), slot.channel.as_str(), i16::from(slot.n));
        let busy_ms = millis(busy_for);
        let new_rows = self
            .with_conn(|conn| async move {
                let stmt = conn.prepare_cached(sql::COMMIT).await.map_err(fault::from_postgres)?;
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 15] = [
                    &ispb,
                    &channel,
                    &n,
                    &fence,
                    &pull_next,
                    &cols.resource_id,
                    &cols.msg_id,
                    &cols.msg_def,
                    &cols.biz_msg_id,
                    &cols.end_to_end_id,
                    &cols.from_ispb,
                    &cols.to_ispb,
                    &cols.raw,
                    &cols.reason,
                    &busy_ms,
                ];
                let row = conn.query_one(&stmt, &params).await.map_err(fault::from_postgres)?;
                if !row.get::<_, bool>("fenced") {
                    return Err(self.fence_lost(&conn, slot, fence).await);
                }
                let ids: Vec<i64> = row.get("ids");
                let keys: Vec<String> = row.get("resource_ids");
                Ok(ids.into_iter().zip(keys).collect::<Vec<_>>())
            })
            .await?;
        let summary = summarize(slot, batch, new_rows);
        record_commit(slot, &summary, started.elapsed());
        Ok(summary)
    }

    async fn store_cursor(
        &self,
        slot: SlotId,
        fence: i64,
        pull_next: Option<&str>,
        busy_for: Duration,
    ) -> Result<(), InboxError> {
        let (ispb, channel, n) = (self.ispb.as_str(), slot.channel.as_str(), i16::from(slot.n));
        let busy_ms = millis(busy_for);
        self.with_conn(|conn| async move {
            let stmt = conn.prepare_cached(sql::STORE_CURSOR).await.map_err(fault::from_postgres)?;
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
                [&ispb, &channel, &n, &fence, &pull_next, &busy_ms];
            let moved = conn.execute(&stmt, &params).await.map_err(fault::from_postgres)?;
            if moved == 1 { Ok(()) } else { Err(self.fence_lost(&conn, slot, fence).await) }
        })
        .await
    }

    async fn arm(&self, slot: SlotId, fence: i64, busy_for: Duration) -> Result<(), InboxError> {
        let busy_ms = millis(busy_for);
        self.fenced_write(sql::ARM, slot, fence, Some(&busy_ms)).await?;
        metrics::counter!("cabine_gate_arms_total", "pool" => "stream").increment(1);
        Ok(())
    }

    async fn release(&self, slot: SlotId, fence: i64) -> Result<(), InboxError> {
        self.fenced_write(sql::RELEASE, slot, fence, None).await
    }

    async fn cursors(&self) -> Result<Vec<SlotCursor>, InboxError> {
        let ispb = self.ispb.as_str();
        self.with_conn(|conn| async move {
            let stmt = conn.prepare_cached(sql::CURSORS).await.map_err(fault::from_postgres)?;
            let rows = conn.query(&stmt, &[&ispb]).await.map_err(fault::from_postgres)?;
            Ok(rows.iter().filter_map(cursor_of).collect())
        })
        .await
    }
}

impl PgInbox {
    /// Runs a statement on the slot's row keyed (ispb, channel, slot, fence[, extra]); no row: fence lost.
    async fn fenced_write(
        &self,
        statement: &'static str,
        slot: SlotId,
        fence: i64,
        extra: Option<&i64>,
    ) -> Result<(), InboxError> {
        let (ispb, channel, n) = (self.ispb.as_str(), slot.channel.as_str(), i16::from(slot.n));
        self.with_conn(|conn| async move {
            let stmt = conn.prepare_cached(statement).await.map_err(fault::from_postgres)?;
            let moved = match extra {
                Some(x) => conn.execute(&stmt, &[&ispb, &channel, &n, &fence, x]).await,
                None => conn.execute(&stmt, &[&ispb, &channel, &n, &fence]).await,
            };
            if moved.map_err(fault::from_postgres)? == 1 {
                Ok(())
            } else {
                Err(self.fence_lost(&conn, slot, fence).await)
            }
        })
        .await
    }
}

/// Whole milliseconds for a statement parameter, rounded up: Postgres's
/// window is never shorter than the holder assumes.
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_micros().div_ceil(1000)).unwrap_or(i64::MAX)
}

/// A `slot_cursor` row; a channel or slot this build does not know is skipped.
fn cursor_of(row: &tokio_postgres::Row) -> Option<SlotCursor> {
    let channel: ChannelId = row.get::<_, String>("channel").parse().ok()?;
    let n = u8::try_from(row.get::<_, i16>("slot")).ok()?;
    Some(SlotCursor {
        slot: SlotId { channel, n },
        fence: row.get("fence"),
        holder: row.get("holder"),
        pull_next: row.get("pull_next"),
        age: Duration::from_millis(u64::try_from(row.get::<_, i64>("age_ms")).unwrap_or(0)),
        busy_for: row
            .get::<_, Option<i64>>("busy_ms")
            .and_then(|ms| u64::try_from(ms).ok())
            .filter(|ms| *ms > 0)
            .map(Duration::from_millis),
    })
}

/// Pairs each new row with its message, in batch order; the rest were duplicates.
fn summarize(slot: SlotId, batch: &[InboundMessage], new_rows: Vec<(i64, String)>) -> CommitSummary {
    let stored: Vec<InboundMessage> = batch.iter().enumerate().map(|(i, m)| batch::as_stored(m, i)).collect();
    let mut inserted: Vec<CommittedRow> = new_rows
        .into_iter()
        .filter_map(|(id, key)| {
            let message = stored.iter().find(|m| m.resource_id == key)?.clone();
            Some(CommittedRow { id, slot, message })
        })
        .collect();
    inserted.sort_by_key(|r| r.id);
    let malformed = inserted.iter().filter(|r| r.message.malformed.is_some()).count();
    CommitSummary { duplicates: batch.len() - inserted.len(), malformed, inserted }
}

fn record_commit(slot: SlotId, summary: &CommitSummary, took: Duration) {
    let channel = slot.channel.as_str();
    metrics::histogram!("cabine_inbox_commit_seconds").record(took.as_secs_f64());
    metrics::counter!("cabine_inbound_persisted_total", "channel" => channel).increment(summary.inserted.len() as u64);
    metrics::counter!("cabine_inbound_duplicates_total", "channel" => channel).increment(summary.duplicates as u64);
    metrics::counter!("cabine_inbound_malformed_total", "channel" => channel).increment(summary.malformed as u64);
}

fn describe_metrics() {
    metrics::describe_counter!("cabine_inbox_claims_total", "Slot claims (each took the next fence).");
    metrics::describe_counter!("cabine_inbox_fence_lost_total", "Writes refused because the slot was claimed since.");
    metrics::describe_counter!(
        "cabine_gate_arms_total",
        "Fenced gate writes made only to arm a request (no statement preceded it within the margin)."
    );
    metrics::describe_histogram!("cabine_inbox_commit_seconds", "One batch + cursor commit, end to end.");
    metrics::describe_counter!("cabine_inbound_persisted_total", "Inbound messages newly committed to the inbox.");
    metrics::describe_counter!("cabine_inbound_duplicates_total", "Redelivered inbound messages already in the inbox.");
    metrics::describe_counter!(
        "cabine_inbound_malformed_total",
        "Inbound messages stored as malformed (dead letters)."
    );
}
