//! `report timings`: how long each stage of a window's messages took, read
//! back from Postgres — the figures the Central Bank asks participants for.
//! Inbound: persisted (the commit that precedes the acknowledgement, so the
//! moment cabine took the message) → published on the bus. Outbound: accepted
//! (row stored) → sent (the SPI's 201) → confirmed (its pacs.002). Per channel
//! and stage: count, p50 / p95 / p99 and max in ms ([`TimingReport`]); per
//! message, the timestamps as CSV, read in pages ([`TimingReports::page`]).

mod format;

use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::db::Db;
use crate::db::bounded;
pub use format::{CSV_HEADER, csv_lines};

/// Where a CSV page starts: after (direction: 0 inbound, 1 outbound; row id);
/// `(-1, 0)` is the start.
pub type PageKey = (i16, i64);

/// A page of CSV lines and where the next one starts (`None`: this was the last).
pub type CsvPage = (Vec<String>, Option<PageKey>);

/// Messages per CSV page (one bounded statement each).
pub const PAGE_ROWS: i64 = 5000;

/// Reads the timings of a window, each statement bounded by `timeout`.
#[derive(Clone)]
pub struct TimingReports {
    pub db: Db,
    pub ispb: String,
    pub timeout: Duration,
}

/// A Postgres call of the timing report that failed (pool, timeout, statement).
#[derive(Debug, thiserror::Error)]
#[error("timing report: {0}")]
pub struct TimingsError(pub String);

impl bounded::Bounded for TimingsError {
    fn pool(e: deadpool_postgres::PoolError) -> Self {
        TimingsError(format!("postgres pool: {e}"))
    }

    fn timed_out(after: Duration) -> Self {
        TimingsError(format!("postgres: no answer within {after:?}"))
    }
}

/// One stage of one channel's messages.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageFigures {
    pub direction: String,
    pub channel: String,
    pub stage: String,
    pub count: i64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

#[derive(Debug, Serialize)]
pub struct TimingReport {
    pub ispb: String,
    pub from: String,
    pub to: String,
    pub stages: Vec<StageFigures>,
    /// Messages of the window whose stage has not happened yet (not published, not sent, not confirmed).
    pub pending: Vec<Pending>,
}

#[derive(Debug, Serialize)]
pub struct Pending {
    pub direction: String,
    pub channel: String,
    pub stage: String,
    pub count: i64,
}

/// Every stage of the window as (direction, channel, stage, its duration or
/// NULL, and whether a NULL may still come: a message rejected or timed out
/// never gets sent).
const STAGES_SQL: &str = "
    SELECT 'inbound' AS direction, channel, 'persisted_to_published' AS stage, published_at - received_at AS d,
           true AS open
      FROM inbox WHERE ispb = $1 AND received_at >= $2 AND received_at < $3 AND status = 'received'
    UNION ALL
    SELECT 'outbound', o.channel, s.stage, s.d, o.status IN ('queued', 'sending', 'sent', 'in_doubt')
      FROM outbound o CROSS JOIN LATERAL (VALUES
          ('accepted_to_sent', o.sent_at - o.created_at),
          ('sent_to_confirmed', o.confirmed_at - o.sent_at),
          ('accepted_to_confirmed', o.confirmed_at - o.created_at)) AS s(stage, d)
      WHERE o.ispb = $1 AND o.created_at >= $2 AND o.created_at < $3 AND o.msg_id IS NOT NULL
        AND (s.stage = 'accepted_to_sent' OR o.sent_at IS NOT NULL)";

impl TimingReports {
    pub async fn report(&self, from: SystemTime, to: SystemTime) -> Result<TimingReport, TimingsError> {
        let figures = format!(
            "SELECT direction, channel, stage, count(*),
                    percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY ms), max(ms)
             FROM (SELECT direction, channel, stage, extract(epoch FROM d)::float8 * 1000 AS ms
                   FROM ({STAGES_SQL}) s WHERE d IS NOT NULL) t
             GROUP BY direction, channel, stage ORDER BY direction, channel, stage"
        );
        let pending = format!(
            "SELECT direction, channel, stage, count(*) FROM ({STAGES_SQL}) s WHERE d IS NULL AND open
             GROUP BY direction, channel, stage ORDER BY direction, channel, stage"
        );
        let (rows, waiting) = self
            .bounded(|client| async move {
                let figures = client.query(&figures, &[&self.ispb, &from, &to]).await;
                let pending = client.query(&pending, &[&self.ispb, &from, &to]).await;
                let e = |e: tokio_postgres::Error| TimingsError(e.to_string());
                Ok((figures.map_err(e)?, pending.map_err(e)?))
            })
            .await?;
        let stages = rows
            .iter()
            .map(|r| {
                let p: Vec<f64> = r.try_get(4)?;
                Ok(StageFigures {
                    direction: r.try_get(0)?,
                    channel: r.try_get(1)?,
                    stage: r.try_get(2)?,
                    count: r.try_get(3)?,
                    p50_ms: round(p.first().copied().unwrap_or_default()),
                    p95_ms: round(p.get(1).copied().unwrap_or_default()),
                    p99_ms: round(p.get(2).copied().unwrap_or_default()),
                    max_ms: round(r.try_get(5)?),
                })
            })
            .collect::<Result<Vec<_>, tokio_postgres::Error>>()
            .map_err(|e| TimingsError(e.to_string()))?;
        let pending = waiting
            .iter()
            .map(|r| {
                Ok(Pending {
                    direction: r.try_get(0)?,
                    channel: r.try_get(1)?,
                    stage: r.try_get(2)?,
                    count: r.try_get(3)?,
                })
            })
            .collect::<Result<Vec<_>, tokio_postgres::Error>>()
            .map_err(|e| TimingsError(e.to_string()))?;
        Ok(TimingReport { ispb: self.ispb.clone(), from: stamp(from), to: stamp(to), stages, pending })
    }

    /// Up to [`PAGE_ROWS`] messages of the window after `after`, as CSV lines:
    /// the inbox rows by id, then the outbound rows by id; each direction read
    /// through its primary key from where the last page stopped.
    pub async fn page(&self, from: SystemTime, to: SystemTime, after: PageKey) -> Result<CsvPage, TimingsError> {
        let mut lines = Vec::new();
        let mut last = after;
        for (dir, sql) in [(0, format::INBOUND_PAGE_SQL), (1, format::OUTBOUND_PAGE_SQL)] {
            if last.0 > dir {
                continue;
            }
            let start = if last.0 == dir { last.1 } else { 0 };
            let limit = PAGE_ROWS - lines.len() as i64;
            let rows = self
                .bounded(|client| async move {
                    client
                        .query(sql, &[&self.ispb, &from, &to, &start, &limit])
                        .await
                        .map_err(|e| TimingsError(e.to_string()))
                })
                .await?;
            let (page, key) = csv_lines(&rows).map_err(|e| TimingsError(e.to_string()))?;
            lines.extend(page);
            last = key.unwrap_or((dir, i64::MAX));
            if lines.len() as i64 == PAGE_ROWS {
                return Ok((lines, Some(last)));
            }
        }
        Ok((lines, None))
    }

    async fn bounded<T, F, Fut>(&self, op: F) -> Result<T, TimingsError>
    where
        F: FnOnce(bounded::Conn) -> Fut,
        Fut: Future<Output = Result<T, TimingsError>>,
    {
        bounded::with_conn(&self.db, self.timeout, op).await
    }
}

fn round(ms: f64) -> f64 {
    (ms * 1000.0).round() / 1000.0
}

fn stamp(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}
