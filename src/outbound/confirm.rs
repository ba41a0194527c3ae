//! The Postgres [`Confirmations`]: inbound status reports (pacs.002,
//! admi.002) not correlated yet (`inbox.correlated_at IS NULL`, migration V4)
//! are read oldest first with `FOR UPDATE SKIP LOCKED` (pods never work on the
//! same row), each one's verdicts applied to the outbound message it
//! references, and the rows marked correlated — all in one transaction, so a
//! crash anywhere leaves them for the next pass. Applying a verdict twice is
//! harmless: the second finds the message final.
//!
//! A report can overtake what it refers to: an admi.002 naming the ResourceId
//! of a POST whose 201 its sender has not recorded yet matches nothing. Such a
//! report is not dropped: it stays uncorrelated, paused for a later pass, and
//! is given up (marked unmatched, kept) only after the processing timeout.

use std::time::Duration;

use cabine_actors::ports::outbound::{ConfirmOutcome, OutboundError};
use cabine_actors::ports::{ConfirmError, Confirmations, Correlated};
use deadpool_postgres::GenericClient;

use crate::db::Db;

use super::correlate;
use super::rows::pg_error;
use super::store::{OutboundPolicy, PgOutboundStore};
use crate::config::Ispb;
use crate::db::bounded;

/// Status reports waiting for the confirmer (served by the `inbox_uncorrelated` index),
/// except those paused after matching nothing.
const UNCORRELATED: &str = "SELECT id, raw FROM inbox
    WHERE ispb = $1 AND correlated_at IS NULL AND status = 'received'
      AND (msg_def LIKE 'pacs.002%' OR msg_def LIKE 'admi.002%')
      AND (correlate_after IS NULL OR correlate_after <= now())
    ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED";

const MARK_CORRELATED: &str = "UPDATE inbox SET correlated_at = now() WHERE id = ANY($1)";

/// Reports whose reference matched nothing yet: paused (250 ms doubling, at
/// most 10 s) for a later pass, or — received more than the patience (`$2` ms)
/// ago — given up: correlated and marked unmatched, kept in the inbox.
const RETRY_LATER: &str = "UPDATE inbox SET correlate_tries = correlate_tries + 1,
        correlate_after = now() + LEAST(250 * power(2, LEAST(correlate_tries, 10)), 10000) * interval '1 millisecond',
        correlated_at = CASE WHEN received_at <= now() - $2::bigint * interval '1 millisecond' THEN now() END,
        unmatched_at = CASE WHEN received_at <= now() - $2::bigint * interval '1 millisecond' THEN now() END
    WHERE id = ANY($1)
    RETURNING id, unmatched_at IS NOT NULL";

pub struct PgConfirmations {
    pool: Db,
    ispb: String,
    store: PgOutboundStore,
    /// Bound of one whole pass; past it the pass is cancelled on the server and rolled back.
    timeout: Duration,
    /// How long a report that matches nothing is retried: the processing
    /// timeout, past which a 201 its sender never recorded is lost anyway.
    patience: Duration,
}

/// What one report's verdicts did: a reference that may match later keeps it for a retry.
enum Fate {
    Done,
    RetryLater,
}

impl PgConfirmations {
    pub fn new(pool: Db, ispb: &Ispb, policy: OutboundPolicy, timeout: Duration) -> Self {
        let patience = policy.processing_timeout;
        let store = PgOutboundStore::new(pool.clone(), ispb, policy);
        PgConfirmations { pool, ispb: ispb.to_string(), store, timeout, patience }
    }

    async fn pass(&self, max: u32) -> Result<Correlated, OutboundError> {
        bounded::with_conn(&self.pool, self.timeout, |mut client| async move {
            let tx = client.transaction().await.map_err(|e| pg_error(&e))?;
            let rows = tx.query(UNCORRELATED, &[&self.ispb, &i64::from(max)]).await.map_err(|e| pg_error(&e))?;
            let mut done = Correlated { rows: rows.len(), ..Correlated::default() };
            let (mut finished, mut later) = (Vec::with_capacity(rows.len()), Vec::new());
            for row in &rows {
                match self.apply(&tx, row.get::<_, &[u8]>(1), &mut done).await? {
                    Fate::Done => finished.push(row.get::<_, i64>(0)),
                    Fate::RetryLater => later.push(row.get::<_, i64>(0)),
                }
            }
            tx.execute(MARK_CORRELATED, &[&finished]).await.map_err(|e| pg_error(&e))?;
            self.retry_later(&tx, &later, &mut done).await?;
            tx.commit().await.map_err(|e| pg_error(&e))?;
            Ok(done)
        })
        .await
    }

    /// Applies every verdict `raw` carries; an unreadable report is counted, not retried.
    async fn apply<C: GenericClient>(&self, tx: &C, raw: &[u8], done: &mut Correlated) -> Result<Fate, OutboundError> {
        let verdicts = match correlate::verdicts(raw) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "status report unreadable: kept in the inbox, not correlated");
                done.unreadable += 1;
                return Ok(Fate::Done);
            }
        };
        let mut fate = Fate::Done;
        for (reference, verdict) in verdicts {
            match self.store.verdict_on(tx, &reference, &verdict).await? {
                ConfirmOutcome::Applied(events) => done.applied.extend(events),
                ConfirmOutcome::AlreadyFinal(_) => done.already_final += 1,
                ConfirmOutcome::Unknown => {
                    done.unknown += 1;
                    if reference.may_match_later() {
                        fate = Fate::RetryLater;
                    }
                }
            }
        }
        Ok(fate)
    }

    /// Pauses the reports in `ids` for a later pass, or gives up those past the patience.
    async fn retry_later<C: GenericClient>(
        &self,
        tx: &C,
        ids: &[i64],
        done: &mut Correlated,
    ) -> Result<(), OutboundError> {
        if ids.is_empty() {
            return Ok(());
        }
        let patience = i64::try_from(self.patience.as_millis()).unwrap_or(i64::MAX);
        let rows = tx.query(RETRY_LATER, &[&ids, &patience]).await.map_err(|e| pg_error(&e))?;
        for row in rows {
            if row.get::<_, bool>(1) {
                let id: i64 = row.get(0);
                tracing::warn!(
                    inbox_id = id,
                    "status report matched no outbound message within {:?}: left unmatched",
                    self.patience
                );
                done.unmatched += 1;
            } else {
                done.retried += 1;
            }
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Confirmations for PgConfirmations {
    async fn correlate(&self, max: u32) -> Result<Correlated, ConfirmError> {
        let done = match self.pass(max).await {
            Err(OutboundError::Unavailable(e)) => return Err(ConfirmError::Unavailable(e)),
            Err(OutboundError::Fatal(e) | OutboundError::Refused(e)) => return Err(ConfirmError::Fatal(e)),
            Ok(done) => done,
        };
        metrics::counter!("cabine_outbound_reports_correlated_total").increment((done.rows - done.retried) as u64);
        metrics::counter!("cabine_outbound_reports_unreadable_total").increment(done.unreadable as u64);
        metrics::counter!("cabine_outbound_reports_retried_total").increment(done.retried as u64);
        metrics::counter!("cabine_outbound_reports_unmatched_total").increment(done.unmatched as u64);
        Ok(done)
    }
}
