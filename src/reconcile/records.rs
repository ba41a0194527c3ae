//! The Reconciler's Postgres statements: its runs (`reconciliation`) and
//! findings (`reconciliation_discrepancy`, insert-only: a re-run adds nothing
//! it already found), and the reads of our side — statement pages and
//! credits in the inbox, our sends in the outbound table. Each call is one
//! bounded statement.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use cabine_actors::ports::outbound::OutboundStatus;
use cabine_actors::ports::reconcile::{DiscrepancyKind, ReconcileError};
use deadpool_postgres::PoolError;
use serde::Serialize;
use tokio_postgres::Row;

use super::compare::{InboxCredit, OurSend};
use super::statement;
use crate::db::Db;
use crate::db::bounded::{self, Bounded};

impl Bounded for ReconcileError {
    fn pool(e: PoolError) -> Self {
        ReconcileError::Unavailable(format!("postgres pool: {e}"))
    }

    fn timed_out(after: Duration) -> Self {
        ReconcileError::Unavailable(format!("postgres: no answer within {after:?}"))
    }
}

fn pg(e: tokio_postgres::Error) -> ReconcileError {
    ReconcileError::Unavailable(format!("postgres: {e}"))
}

/// One run as stored, for the operator endpoints.
#[derive(Clone, Debug, Serialize)]
pub struct RunRow {
    pub id: i64,
    pub window_from: String,
    pub window_to: String,
    pub origin: String,
    pub status: String,
    pub request_msg_id: Option<String>,
    pub statement_entries: Option<i32>,
    pub settled_sends: i32,
    pub attempts: i32,
    pub error: Option<String>,
    pub started_at: String,
    pub finished_at: Option<String>,
    /// Discrepancies by kind.
    pub discrepancies: HashMap<String, i64>,
}

/// One discrepancy as stored.
#[derive(Clone, Debug, Serialize)]
pub struct DiscrepancyRow {
    pub kind: String,
    pub level: String,
    pub end_to_end_id: String,
    pub msg_id: Option<String>,
    pub evidence: serde_json::Value,
    pub action: Option<String>,
    pub found_at: String,
}

fn stamp(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// A finding ready to store.
pub struct NewDiscrepancy {
    pub kind: DiscrepancyKind,
    pub end_to_end_id: String,
    pub msg_id: Option<String>,
    pub evidence: serde_json::Value,
    pub action: Option<String>,
}

/// The Reconciler's statements, each bounded by `timeout`.
#[derive(Clone)]
pub struct Records {
    pub db: Db,
    pub ispb: String,
    pub timeout: Duration,
}

impl Records {
    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<Row>, ReconcileError> {
        bounded::with_conn(&self.db, self.timeout, |conn| async move { conn.query(sql, params).await.map_err(pg) })
            .await
    }

    /// The run of a window (created, or reopened for another attempt).
    pub async fn open(&self, from: SystemTime, to: SystemTime, origin: &str) -> Result<i64, ReconcileError> {
        let rows = self
            .query(
                "INSERT INTO reconciliation (ispb, window_from, window_to, origin) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (ispb, window_from, window_to)
                 DO UPDATE SET attempts = reconciliation.attempts + 1, started_at = now(), error = NULL,
                               status = CASE WHEN reconciliation.status = 'done' THEN 'done' ELSE 'requested' END
                 RETURNING id",
                &[&self.ispb, &from, &to, &origin],
            )
            .await?;
        rows.first().map(|r| r.get(0)).ok_or_else(|| ReconcileError::Fatal("an upsert without its row".into()))
    }

    pub async fn requested(&self, id: i64, msg_id: &str) -> Result<(), ReconcileError> {
        self.query("UPDATE reconciliation SET request_msg_id = $2 WHERE id = $1", &[&id, &msg_id]).await.map(drop)
    }

    pub async fn failed(&self, id: i64, error: &str) -> Result<(), ReconcileError> {
        self.query(
            "UPDATE reconciliation SET status = CASE WHEN status = 'done' THEN 'done' ELSE 'failed' END,
                    error = $2, finished_at = now() WHERE id = $1",
            &[&id, &error],
        )
        .await
        .map(drop)
    }

    pub async fn done(&self, id: i64, entries: usize, settled: usize) -> Result<(), ReconcileError> {
        let (entries, settled) = (i32::try_from(entries).unwrap_or(i32::MAX), i32::try_from(settled).unwrap_or(0));
        self.query(
            "UPDATE reconciliation SET status = 'done', statement_entries = $2, settled_sends = settled_sends + $3,
                    error = NULL, finished_at = now() WHERE id = $1",
            &[&id, &entries, &settled],
        )
        .await
        .map(drop)
    }

    /// The end of the last window the schedule reconciled.
    pub async fn last_scheduled_end(&self) -> Result<Option<SystemTime>, ReconcileError> {
        let rows = self
            .query(
                "SELECT max(window_to) FROM reconciliation WHERE ispb = $1 AND origin = 'schedule' AND status = 'done'",
                &[&self.ispb],
            )
            .await?;
        Ok(rows.first().and_then(|r| r.get::<_, Option<SystemTime>>(0)))
    }

    /// Statement pages received since `since`, not among `seen`: (inbox id, raw).
    pub async fn statement_pages(
        &self,
        since: SystemTime,
        seen: &[i64],
    ) -> Result<Vec<(i64, Vec<u8>)>, ReconcileError> {
        let rows = self
            .query(
                "SELECT id, raw FROM inbox WHERE ispb = $1 AND msg_def LIKE 'camt.053%' AND status = 'received'
                   AND received_at >= $2 AND NOT (id = ANY($3)) ORDER BY id",
                &[&self.ispb, &since, &seen],
            )
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// Inbox credits received from `since` on: one per transaction of each pacs.008 (a message
    /// may carry several), with what the message says of it.
    pub async fn inbox_credits(&self, since: SystemTime) -> Result<Vec<InboxCredit>, ReconcileError> {
        let rows = self
            .query(
                "SELECT id, end_to_end_id, msg_id, received_at, raw FROM inbox
                 WHERE ispb = $1 AND status = 'received' AND msg_def LIKE 'pacs.008%' AND received_at >= $2",
                &[&self.ispb, &since],
            )
            .await?;
        let mut credits = Vec::with_capacity(rows.len());
        for r in &rows {
            let raw: Vec<u8> = r.get(4);
            let mut txs: Vec<(String, statement::Transaction)> =
                statement::transactions(&raw).map(|t| t.into_iter().collect()).unwrap_or_default();
            if txs.is_empty()
                && let Some(e2e) = r.get::<_, Option<String>>(1)
            {
                txs.push((e2e, statement::Transaction::default()));
            }
            for (e2e, tx) in txs {
                credits.push(InboxCredit {
                    id: r.get(0),
                    end_to_end_id: e2e,
                    msg_id: r.get(2),
                    received_at: r.get(3),
                    accepted_at: tx.accepted_at,
                    amount_cents: tx.amount_cents,
                });
            }
        }
        Ok(credits)
    }

    /// Our pacs.008 sends carrying one of `e2es`, and those that may have
    /// reached the SPI within `[from, to)` without a verdict (`sent`, `in_doubt`).
    pub async fn sends(
        &self,
        e2es: &[String],
        from: SystemTime,
        to: SystemTime,
    ) -> Result<Vec<OurSend>, ReconcileError> {
        let rows = self
            .query(
                "SELECT msg_id, status, end_to_end_ids, raw, COALESCE(sent_at, maybe_stored_at) FROM outbound
                 WHERE ispb = $1 AND msg_id IS NOT NULL AND msg_type LIKE 'pacs.008%'
                   AND (end_to_end_ids && $2
                        OR (status IN ('sent', 'in_doubt')
                            AND COALESCE(sent_at, maybe_stored_at) >= $3 AND COALESCE(sent_at, maybe_stored_at) < $4))",
                &[&self.ispb, &e2es, &from, &to],
            )
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let status: String = r.get(1);
            let raw: Vec<u8> = r.get(3);
            out.push(OurSend {
                msg_id: r.get(0),
                status: status.parse::<OutboundStatus>().map_err(ReconcileError::Fatal)?,
                end_to_end_ids: r.get(2),
                amounts: statement::amounts(&raw).unwrap_or_default(),
                attempted_at: r.get(4),
            });
        }
        Ok(out)
    }

    /// Stores what was found; what a re-run finds again is left as it was.
    pub async fn add_discrepancies(&self, id: i64, found: &[NewDiscrepancy]) -> Result<(), ReconcileError> {
        for d in found {
            let (kind, level) = (d.kind.label(), d.kind.level().label());
            self.query(
                "INSERT INTO reconciliation_discrepancy (reconciliation_id, kind, level, end_to_end_id, msg_id, evidence, action)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (reconciliation_id, kind, end_to_end_id) DO NOTHING",
                &[&id, &kind, &level, &d.end_to_end_id, &d.msg_id, &d.evidence, &d.action],
            )
            .await?;
        }
        Ok(())
    }

    /// What the action of a stored finding did, unless a run before already recorded it.
    pub async fn acted(&self, id: i64, kind: DiscrepancyKind, e2e: &str, done: &str) -> Result<(), ReconcileError> {
        let planned = format!("{}%", super::PLANNED);
        self.query(
            "UPDATE reconciliation_discrepancy SET action = $4
             WHERE reconciliation_id = $1 AND kind = $2 AND end_to_end_id = $3 AND action LIKE $5",
            &[&id, &kind.label(), &e2e, &done, &planned],
        )
        .await
        .map(drop)
    }

    /// Discrepancies of a run, by kind.
    pub async fn counts(&self, id: i64) -> Result<Vec<(DiscrepancyKind, u64)>, ReconcileError> {
        let rows = self
            .query(
                "SELECT kind, count(*) FROM reconciliation_discrepancy WHERE reconciliation_id = $1 GROUP BY kind",
                &[&id],
            )
            .await?;
        let mut out: Vec<(DiscrepancyKind, u64)> = rows
            .iter()
            .filter_map(|r| {
                let (kind, n): (String, i64) = (r.get(0), r.get(1));
                DiscrepancyKind::from_label(&kind).map(|k| (k, n.max(0) as u64))
            })
            .collect();
        out.sort();
        Ok(out)
    }

    /// Runs whose window overlaps `[from, to)`, newest first (at most 1,000).
    pub async fn runs(&self, from: SystemTime, to: SystemTime) -> Result<Vec<RunRow>, ReconcileError> {
        let rows = self
            .query(
                &format!(
                    "{RUN_SELECT} WHERE r.ispb = $1 AND r.window_to > $2 AND r.window_from < $3
                          GROUP BY r.id ORDER BY r.window_from DESC, r.id DESC LIMIT 1000"
                ),
                &[&self.ispb, &from, &to],
            )
            .await?;
        Ok(rows.iter().map(run_row).collect())
    }

    /// One run with its discrepancies.
    pub async fn run(&self, id: i64) -> Result<Option<(RunRow, Vec<DiscrepancyRow>)>, ReconcileError> {
        let rows = self
            .query(&format!("{RUN_SELECT} WHERE r.ispb = $1 AND r.id = $2 GROUP BY r.id"), &[&self.ispb, &id])
            .await?;
        let Some(run) = rows.first().map(run_row) else { return Ok(None) };
        let found = self
            .query(
                "SELECT kind, level, end_to_end_id, msg_id, evidence, action, found_at FROM reconciliation_discrepancy
                 WHERE reconciliation_id = $1 ORDER BY id",
                &[&id],
            )
            .await?;
        let found = found
            .iter()
            .map(|r| DiscrepancyRow {
                kind: r.get(0),
                level: r.get(1),
                end_to_end_id: r.get(2),
                msg_id: r.get(3),
                evidence: r.get(4),
                action: r.get(5),
                found_at: stamp(r.get(6)),
            })
            .collect();
        Ok(Some((run, found)))
    }
}

const RUN_SELECT: &str = "SELECT r.id, r.window_from, r.window_to, r.origin, r.status, r.request_msg_id,
        r.statement_entries, r.settled_sends, r.attempts, r.error, r.started_at, r.finished_at,
        COALESCE(jsonb_object_agg(d.kind, d.n) FILTER (WHERE d.kind IS NOT NULL), '{}'::jsonb)
    FROM reconciliation r
    LEFT JOIN (SELECT reconciliation_id, kind, count(*) AS n FROM reconciliation_discrepancy GROUP BY 1, 2) d
      ON d.reconciliation_id = r.id";

fn run_row(r: &Row) -> RunRow {
    let counts: serde_json::Value = r.get(12);
    RunRow {
        id: r.get(0),
        window_from: stamp(r.get(1)),
        window_to: stamp(r.get(2)),
        origin: r.get(3),
        status: r.get(4),
        request_msg_id: r.get(5),
        statement_entries: r.get(6),
        settled_sends: r.get(7),
        attempts: r.get(8),
        error: r.get(9),
        started_at: stamp(r.get(10)),
        finished_at: r.get::<_, Option<SystemTime>>(11).map(stamp),
        discrepancies: serde_json::from_value(counts).unwrap_or_default(),
    }
}
