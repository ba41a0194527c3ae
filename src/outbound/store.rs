//! The Postgres [`OutboundStore`]: one table of outbound messages and one of
//! their history (also the outbox of result events). Every change is one
//! statement (`transition.rs`), so a row and its history never disagree.
//! Ready rows are claimed with `FOR UPDATE SKIP LOCKED` and a claim token; the
//! take query and the expiry both test the deadline under the row lock, so a
//! row past its deadline is never claimed and a claimed row never expires.
//!
//! In doubt: an attempt whose outcome leaves open whether the SPI stored the
//! message (5xx, timeout, transport error, a claim recovered after its sender
//! vanished) sets `maybe_stored_at`; from then on the deadline, or a definite
//! refusal of a resend, makes the row `in_doubt` instead of `timeout` /
//! `rejected` — those tell the bank's core it was never stored. `in_doubt` rows
//! are never claimed; a verdict or the Reconciler ([`Settlement`]) settles them.
//!
//! Bounded: every call runs on a pooled connection within
//! `postgres.query_timeout` (pool wait included) and is cancelled on the
//! server past it, answering `Unavailable` — a lock wait or a blackholed
//! connection never holds a sender (and its cluster-wide send slot) forever.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use cabine_actors::ports::outbound::{
    Batch, BatchSize, ClaimToken, ConfirmOutcome, ConfirmRef, Inserted, InvalidOutbound, NewOutbound, OutboundDetail,
    OutboundError, OutboundStatus, OutboundStore, Page, Parked, ParkedPage, QueueDepth, Recorded, Reprocessed,
    SendResult, Settled, Settlement, SpiVerdict, Unparked,
};
use cabine_actors::ports::outbound_bus::{Arrival, OutboundRequest, ResultEvent, ResultStatus};
use deadpool_postgres::GenericClient;

use crate::db::Db;
use tokio_postgres::types::ToSql;

use super::rows::pg_error;
use super::transition::{Change, transition_sql};
use crate::config::{ChannelId, Ispb, Settings};
use crate::db::bounded::{self, Conn};

mod insert;
mod park;
mod queries;
mod record;
mod settle;

/// Retry and recovery policy, from `[timing]` and `[outbound]`.
#[derive(Clone, Debug)]
pub struct OutboundPolicy {
    pub poison_attempts: u32,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    pub processing_timeout: Duration,
    pub unconfirmed_after: Duration,
    pub retry_after_default: Duration,
    /// Bound on each call (`postgres.query_timeout`): one statement, or the
    /// few of one short transaction, pool wait included.
    pub query_timeout: Duration,
}

impl OutboundPolicy {
    pub fn from_settings(s: &Settings) -> Self {
        OutboundPolicy {
            poison_attempts: s.timing.poison_attempts,
            backoff_base: s.timing.backoff_base,
            backoff_max: s.timing.backoff_max,
            processing_timeout: s.timing.processing_timeout,
            unconfirmed_after: s.outbound.unconfirmed_after,
            retry_after_default: s.outbound.retry_after_default,
            query_timeout: s.postgres.query_timeout,
        }
    }
}

pub struct PgOutboundStore {
    pool: Db,
    ispb: String,
    policy: OutboundPolicy,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl PgOutboundStore {
    pub fn new(pool: Db, ispb: &Ispb, policy: OutboundPolicy) -> Self {
        PgOutboundStore { pool, ispb: ispb.to_string(), policy }
    }

    /// Runs `op` on a pooled connection within the query timeout (cancelled on
    /// the server past it): the only way this store reaches Postgres.
    async fn bounded<T, F, Fut>(&self, op: F) -> Result<T, OutboundError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = Result<T, OutboundError>>,
    {
        bounded::with_conn(&self.pool, self.policy.query_timeout, op).await
    }

    /// Runs a statement shaped by [`transition_sql`] (or the insert) on a pooled connection.
    async fn changes(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Change>, OutboundError> {
        self.bounded(|conn| async move { run_changes(&*conn, sql, params).await }).await
    }

    async fn store_one(&self, request: OutboundRequest) -> Result<Inserted, OutboundError> {
        let mut stored = self.store_requests(std::slice::from_ref(&request)).await?;
        stored.pop().ok_or_else(|| OutboundError::Fatal("an insert without its answer".into()))
    }

    fn poison(&self) -> i32 {
        i32::try_from(self.policy.poison_attempts).unwrap_or(i32::MAX)
    }
}

#[async_trait::async_trait]
impl OutboundStore for PgOutboundStore {
    async fn insert(&self, m: &NewOutbound) -> Result<Inserted, OutboundError> {
        self.store_one(OutboundRequest::Valid(m.clone())).await
    }

    async fn insert_invalid(&self, m: &InvalidOutbound) -> Result<Inserted, OutboundError> {
        self.store_one(OutboundRequest::Invalid(m.clone())).await
    }

    async fn insert_batch(&self, requests: &[OutboundRequest]) -> Result<Vec<Inserted>, OutboundError> {
        self.store_requests(requests).await
    }

    async fn park(&self, arrivals: &[Arrival], reason: &str) -> Result<usize, OutboundError> {
        self.park_arrivals(arrivals, reason).await
    }

    async fn parked(&self, after: Option<i64>, limit: u32) -> Result<ParkedPage, OutboundError> {
        self.parked_page(after, limit).await
    }

    async fn parked_request(&self, ingress_ref: &str) -> Result<Option<Parked>, OutboundError> {
        self.parked_one(ingress_ref).await
    }

    async fn unpark(&self, ingress_ref: &str, request: &OutboundRequest) -> Result<Unparked, OutboundError> {
        self.unpark_request(ingress_ref, request).await
    }

    /// The expiry and the claim run side by side (two connections, one round
    /// trip): their rows are disjoint (deadline passed or not, tested under the
    /// row lock, `SKIP LOCKED`). A failed expiry does not cost the claimed
    /// batch: the janitor expires overdue rows too.
    async fn take_ready(&self, channel: ChannelId, max: BatchSize) -> Result<Batch, OutboundError> {
        let claim = ClaimToken(format!("{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>()));
        let (expired, messages) = tokio::join!(self.expire(Some(channel), 100), self.claim_ready(channel, max, &claim));
        let messages = messages?;
        let expired = expired.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "overdue rows not expired by this take: left to the janitor");
            Vec::new()
        });
        Ok(Batch { claim, channel, messages, expired })
    }

    async fn record(&self, claim: &ClaimToken, outcomes: &[(String, SendResult)]) -> Result<Recorded, OutboundError> {
        self.record_outcomes(claim, outcomes).await
    }

    async fn expire_overdue(&self, max: u32) -> Result<Vec<ResultEvent>, OutboundError> {
        self.expire(None, max).await
    }

    /// Its sender may have posted the batch before vanishing: an attempt that may have reached the SPI.
    async fn recover_stale_claims(&self, max: u32) -> Result<Vec<ResultEvent>, OutboundError> {
        let sql = transition_sql(
            "SELECT id, status AS from_status, 'claim ' || claim || ' expired: its sender vanished' AS note
             FROM outbound WHERE status = 'sending' AND ispb = $1
               AND claimed_at < now() - $2::bigint * interval '1 millisecond'
             ORDER BY claimed_at LIMIT $3 FOR UPDATE SKIP LOCKED",
            &format!(
                "attempts = attempts + 1, {}, claim = NULL, claimed_at = NULL, not_before = now(), last_error = prev.note",
                after_doubtful_attempt("$4")
            ),
        );
        let (timeout, limit, poison) = (millis(self.policy.processing_timeout), i64::from(max), self.poison());
        let changes = self.changes(&sql, &[&self.ispb, &timeout, &limit, &poison]).await?;
        metrics::counter!("cabine_outbound_claims_recovered_total").increment(changes.len() as u64);
        Ok(events_counted(changes))
    }

    async fn confirm(&self, reference: &ConfirmRef, verdict: &SpiVerdict) -> Result<ConfirmOutcome, OutboundError> {
        self.apply_verdict(reference, verdict).await
    }

    async fn settle_in_doubt(&self, msg_id: &str, settlement: &Settlement) -> Result<Settled, OutboundError> {
        self.settle(msg_id, settlement).await
    }

    async fn stored_body(&self, msg_id: &str) -> Result<Option<Bytes>, OutboundError> {
        self.body(msg_id).await
    }

    async fn flag_unconfirmed(&self, max: u32) -> Result<Vec<String>, OutboundError> {
        let sql = transition_sql(
            "SELECT id, status AS from_status, 'no confirmation ' || ($2::bigint)::text || ' ms after sending' AS note
             FROM outbound WHERE status = 'sent' AND unconfirmed_since IS NULL AND ispb = $1
               AND sent_at < now() - $2::bigint * interval '1 millisecond'
             ORDER BY sent_at LIMIT $3 FOR UPDATE SKIP LOCKED",
            "unconfirmed_since = now()",
        );
        let (after, limit) = (millis(self.policy.unconfirmed_after), i64::from(max));
        let changes = self.changes(&sql, &[&self.ispb, &after, &limit]).await?;
        metrics::counter!("cabine_outbound_unconfirmed_total").increment(changes.len() as u64);
        Ok(changes.into_iter().filter_map(|c| c.msg_id).collect())
    }

    async fn reprocess(&self, msg_id: &str) -> Result<Reprocessed, OutboundError> {
        let sql = transition_sql(
            "SELECT id, status AS from_status, 'reprocessed by an operator' AS note
             FROM outbound WHERE msg_id = $1 AND ispb = $2 AND status IN ('dead', 'rejected') FOR UPDATE",
            "status = 'queued', attempts_base = attempts, not_before = now(), last_error = NULL,
             deadline = now() + GREATEST(deadline - created_at, interval '0')",
        );
        if let Some(event) = self.changes(&sql, &[&msg_id, &self.ispb]).await?.into_iter().find_map(|c| c.event) {
            return Ok(Reprocessed::Queued(event));
        }
        Ok(match self.row_where("msg_id", msg_id).await? {
            None => Reprocessed::NotFound,
            Some(row) => Reprocessed::NotAllowed(row.status),
        })
    }

    async fn get(&self, msg_id: &str) -> Result<Option<OutboundDetail>, OutboundError> {
        self.detail(msg_id).await
    }

    async fn list(&self, status: OutboundStatus, after: Option<i64>, limit: u32) -> Result<Page, OutboundError> {
        self.page(status, after, limit).await
    }

    async fn depth(&self) -> Result<QueueDepth, OutboundError> {
        let (depth, parked) = tokio::join!(self.queue_depth(), self.parked_count());
        Ok(QueueDepth { parked: parked?, ..depth? })
    }
}

/// Runs a statement shaped by [`transition_sql`] and reads its changes.
async fn run_changes<C: GenericClient>(
    client: &C,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Change>, OutboundError> {
    let stmt = client.prepare_cached(sql).await.map_err(|e| pg_error(&e))?;
    let rows = client.query(&stmt, params).await.map_err(|e| pg_error(&e))?;
    rows.iter().map(|r| Change::from_row(r).map_err(OutboundError::Fatal)).collect()
}

/// The status of a row that will not be sent (again) past its deadline:
/// `timeout` only when no attempt can have reached the SPI.
const PAST_DEADLINE: &str = "CASE WHEN maybe_stored_at IS NULL THEN 'timeout' ELSE 'in_doubt' END";

/// The status after an attempt that may have reached the SPI (a failed POST, a
/// vanished sender's claim), `attempts` being the old value: `in_doubt` past
/// the deadline (never sent again, yet the SPI may hold it), `dead` once
/// `poison` attempts were made since the last reprocess, `queued` otherwise;
/// and the row remembers that it may be stored.
fn after_doubtful_attempt(poison: &str) -> String {
    format!(
        "status = CASE WHEN deadline <= now() THEN 'in_doubt' \
         WHEN attempts + 1 - attempts_base >= {poison}::int THEN 'dead' ELSE 'queued' END, \
         maybe_stored_at = COALESCE(maybe_stored_at, now())"
    )
}

/// The events of `changes`, counting the rows that ended `timeout` or `in_doubt`.
fn events_counted(changes: Vec<Change>) -> Vec<ResultEvent> {
    let events: Vec<ResultEvent> = changes.into_iter().filter_map(|c| c.event).collect();
    let ended = |s: ResultStatus| events.iter().filter(|e| e.status == s).count() as u64;
    metrics::counter!("cabine_outbound_timeouts_total").increment(ended(ResultStatus::Timeout));
    metrics::counter!("cabine_outbound_in_doubt_total").increment(ended(ResultStatus::InDoubt));
    events
}
