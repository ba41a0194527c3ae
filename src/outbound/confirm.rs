//! The Postgres [`Confirmations`]: inbound status reports (pacs.002,
//! admi.002) not correlated yet (`inbox.correlated_at IS NULL`, migration V4)
//! are read oldest first with `FOR UPDATE SKIP LOCKED` (pods never work on the
//! same row), each one's verdicts applied to the outbound message it
//! references, and the rows marked correlated — all in one transaction, so a
//! crash anywhere leaves them for the next pass. Applying a verdict twice is
//! harmless: the second finds the message final.

use std::time::Duration;

use cabine_actors::ports::outbound::{ConfirmOutcome, OutboundError};
use cabine_actors::ports::{ConfirmError, Confirmations, Correlated};
use deadpool_postgres::{GenericClient, Pool};

use super::correlate;
use super::rows::{pg_error, pool_error};
use super::store::{OutboundPolicy, PgOutboundStore};
use crate::config::Ispb;

/// Status reports waiting for the confirmer (served by the `inbox_uncorrelated` index).
const UNCORRELATED: &str = "SELECT id, raw FROM inbox
    WHERE ispb = $1 AND correlated_at IS NULL AND status = 'received'
      AND (msg_def LIKE 'pacs.002%' OR msg_def LIKE 'admi.002%')
    ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED";

const MARK_CORRELATED: &str = "UPDATE inbox SET correlated_at = now() WHERE id = ANY($1)";

pub struct PgConfirmations {
    pool: Pool,
    ispb: String,
    store: PgOutboundStore,
    /// Bound of one whole pass; past it the transaction is abandoned (rolled back).
    timeout: Duration,
}

impl PgConfirmations {
    pub fn new(pool: Pool, ispb: &Ispb, policy: OutboundPolicy, timeout: Duration) -> Self {
        let store = PgOutboundStore::new(pool.clone(), ispb, policy);
        PgConfirmations { pool, ispb: ispb.to_string(), store, timeout }
    }

    async fn pass(&self, max: u32) -> Result<Correlated, OutboundError> {
        let mut client = self.pool.get().await.map_err(pool_error)?;
        let tx = client.transaction().await.map_err(|e| pg_error(&e))?;
        let rows = tx.query(UNCORRELATED, &[&self.ispb, &i64::from(max)]).await.map_err(|e| pg_error(&e))?;
        let mut done = Correlated { rows: rows.len(), ..Correlated::default() };
        let mut ids = Vec::with_capacity(rows.len());
        for row in &rows {
            ids.push(row.get::<_, i64>(0));
            self.apply(&tx, row.get::<_, &[u8]>(1), &mut done).await?;
        }
        tx.execute(MARK_CORRELATED, &[&ids]).await.map_err(|e| pg_error(&e))?;
        tx.commit().await.map_err(|e| pg_error(&e))?;
        Ok(done)
    }

    /// Applies every verdict `raw` carries; an unreadable report is counted, not retried.
    async fn apply<C: GenericClient>(&self, tx: &C, raw: &[u8], done: &mut Correlated) -> Result<(), OutboundError> {
        let verdicts = match correlate::verdicts(raw) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "status report unreadable: kept in the inbox, not correlated");
                done.unreadable += 1;
                return Ok(());
            }
        };
        for (reference, verdict) in verdicts {
            match self.store.verdict_on(tx, &reference, &verdict).await? {
                ConfirmOutcome::Applied(events) => done.applied.extend(events),
                ConfirmOutcome::AlreadyFinal(_) => done.already_final += 1,
                ConfirmOutcome::Unknown => done.unknown += 1,
            }
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Confirmations for PgConfirmations {
    async fn correlate(&self, max: u32) -> Result<Correlated, ConfirmError> {
        let pass = tokio::time::timeout(self.timeout, self.pass(max)).await;
        let done = match pass {
            Err(_) => return Err(ConfirmError::Unavailable(format!("no pass within {:?}", self.timeout))),
            Ok(Err(OutboundError::Unavailable(e))) => return Err(ConfirmError::Unavailable(e)),
            Ok(Err(OutboundError::Fatal(e))) => return Err(ConfirmError::Fatal(e)),
            Ok(Ok(done)) => done,
        };
        metrics::counter!("cabine_outbound_reports_correlated_total").increment(done.rows as u64);
        metrics::counter!("cabine_outbound_reports_unreadable_total").increment(done.unreadable as u64);
        Ok(done)
    }
}
