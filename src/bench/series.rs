//! Time series of a bench run, read back from the cluster's own tables before
//! they are dropped (`--series FILE`): messages per second over time and the
//! latency CDF — inbound: persisted and published per second, persisted →
//! published; outbound: accepted, sent and confirmed per second, accepted →
//! sent, and its rows by state over time (from the history's intervals).
//! `cabine bench report` draws them.

use std::path::Path;
use std::time::SystemTime;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::db::Db;

/// Width of one throughput bucket.
const BUCKET_MS: f64 = 250.0;

/// Quantiles of the CDF.
const QUANTILES: [f64; 16] = [0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999];

/// One run's series: named lines of messages per second over seconds since the first row, and a CDF.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Series {
    pub bench: String,
    /// Seconds since the run's first row, one per bucket.
    pub t_s: Vec<f64>,
    /// (name, messages per second per bucket).
    pub rates: Vec<(String, Vec<f64>)>,
    /// What the CDF measures (`persisted_to_published`, `accepted_to_sent`).
    pub cdf_of: String,
    pub cdf_quantiles: Vec<f64>,
    pub cdf_ms: Vec<f64>,
    /// (state, rows in it at each bucket's end); outbound only.
    #[serde(default)]
    pub states: Vec<(String, Vec<f64>)>,
}

/// Outbound rows in each state at the end of each bucket: every history line
/// holds its `to_status` from its `at` until the row's next line. `at` is the
/// writing transaction's start, so a line can carry an earlier `at` than the
/// one before it (a verdict that waited for the record's row lock): each line
/// starts at the latest `at` so far, and a row's intervals never overlap.
const STATES_SQL: &str = "
    WITH l AS (
        SELECT outbound_id, id, to_status,
               max(at) OVER (PARTITION BY outbound_id ORDER BY id ROWS UNBOUNDED PRECEDING) AS at
        FROM outbound_history
    ),
    h AS (
        SELECT to_status, at, lead(at) OVER (PARTITION BY outbound_id ORDER BY id) AS until FROM l
    ),
    t AS (
        SELECT b, $1::timestamptz + (b + 1) * $2::float8 * interval '1 millisecond' AS at
        FROM generate_series(0, $3::int - 1) AS b
    )
    SELECT t.b::bigint, h.to_status, count(*) FROM t JOIN h ON h.at <= t.at AND (h.until IS NULL OR h.until > t.at)
    GROUP BY t.b, h.to_status ORDER BY t.b";

/// The states in the order a message goes through them; others after.
const STATE_ORDER: [&str; 4] = ["queued", "sending", "sent", "confirmed"];

/// (column expression, name) of the per-second lines, the table, and the CDF's duration.
struct Shape {
    bench: &'static str,
    table: &'static str,
    start: &'static str,
    lines: &'static [(&'static str, &'static str)],
    cdf_of: &'static str,
    cdf: &'static str,
}

const INBOUND: Shape = Shape {
    bench: "inbound",
    table: "inbox",
    start: "received_at",
    lines: &[("received_at", "persisted"), ("published_at", "published")],
    cdf_of: "persisted_to_published",
    cdf: "published_at - received_at",
};

const OUTBOUND: Shape = Shape {
    bench: "outbound",
    table: "outbound",
    start: "created_at",
    lines: &[("created_at", "accepted"), ("sent_at", "sent"), ("confirmed_at", "confirmed")],
    cdf_of: "accepted_to_sent",
    cdf: "sent_at - created_at",
};

/// The inbox's series (of the schema `db` works in).
pub async fn inbound(db: &Db) -> anyhow::Result<Series> {
    Ok(read(db, &INBOUND).await?.0)
}

/// The outbound table's series.
pub async fn outbound(db: &Db) -> anyhow::Result<Series> {
    let (mut series, t0) = read(db, &OUTBOUND).await?;
    if let Some(t0) = t0 {
        series.states = states(db, &series, t0).await?;
    }
    Ok(series)
}

/// Rows by state per bucket; `t0` is the series' start (its first row's `created_at`).
async fn states(db: &Db, series: &Series, t0: SystemTime) -> anyhow::Result<Vec<(String, Vec<f64>)>> {
    let conn = db.get().await?;
    let Ok(buckets) = i32::try_from(series.t_s.len()) else { return Ok(Vec::new()) };
    let rows = conn.query(STATES_SQL, &[&t0, &BUCKET_MS, &buckets]).await?;
    let mut by_state: Vec<(String, Vec<f64>)> = Vec::new();
    for r in rows {
        let (b, state, n): (i64, String, i64) = (r.get(0), r.get(1), r.get(2));
        let at = match by_state.iter().position(|(s, _)| *s == state) {
            Some(i) => i,
            None => {
                by_state.push((state, vec![0.0; series.t_s.len()]));
                by_state.len() - 1
            }
        };
        if let Some(slot) = by_state[at].1.get_mut(usize::try_from(b).unwrap_or(usize::MAX)) {
            *slot = n as f64;
        }
    }
    let rank = |s: &str| STATE_ORDER.iter().position(|o| *o == s).unwrap_or(STATE_ORDER.len());
    by_state.sort_by_key(|(s, _)| rank(s));
    Ok(by_state)
}

/// The series of `s`'s table, and when it starts (`None`: an empty table).
async fn read(db: &Db, s: &Shape) -> anyhow::Result<(Series, Option<SystemTime>)> {
    let conn = db.get().await?;
    let t0: Option<SystemTime> =
        conn.query_one(&format!("SELECT min({}) FROM {}", s.start, s.table), &[]).await?.get(0);
    let Some(t0) = t0 else { return Ok((Series { bench: s.bench.into(), ..Series::default() }, None)) };
    let mut rates = Vec::new();
    let mut buckets = 0usize;
    for (column, name) in s.lines {
        let sql = format!(
            "SELECT floor(extract(epoch FROM {column} - $1::timestamptz) * 1000 / $2::float8)::bigint AS b, count(*)
             FROM {} WHERE {column} IS NOT NULL GROUP BY b ORDER BY b",
            s.table
        );
        let rows = conn.query(&sql, &[&t0, &BUCKET_MS]).await?;
        let mut per = Vec::new();
        for r in rows {
            let (b, n): (i64, i64) = (r.get(0), r.get(1));
            let b = usize::try_from(b).unwrap_or(0);
            if per.len() <= b {
                per.resize(b + 1, 0.0);
            }
            per[b] = n as f64 * 1000.0 / BUCKET_MS;
        }
        buckets = buckets.max(per.len());
        rates.push(((*name).to_owned(), per));
    }
    for (_, per) in &mut rates {
        per.resize(buckets, 0.0);
    }
    let cdf_sql = format!(
        "SELECT percentile_cont($1::float8[]) WITHIN GROUP (ORDER BY (extract(epoch FROM {}) * 1000)::float8)
         FROM {} WHERE {} IS NOT NULL",
        s.cdf, s.table, s.cdf
    );
    let quantiles = QUANTILES.to_vec();
    let cdf_ms: Option<Vec<f64>> = conn.query_one(&cdf_sql, &[&quantiles]).await?.get(0);
    let series = Series {
        bench: s.bench.into(),
        t_s: (0..buckets).map(|b| b as f64 * BUCKET_MS / 1000.0).collect(),
        rates,
        cdf_of: s.cdf_of.into(),
        cdf_quantiles: quantiles,
        cdf_ms: cdf_ms.unwrap_or_default(),
        states: Vec::new(),
    };
    Ok((series, Some(t0)))
}

/// Writes `series` as one JSON document.
pub fn write(path: &Path, series: &Series) -> anyhow::Result<()> {
    std::fs::write(path, serde_json::to_vec_pretty(series)?).with_context(|| format!("writing {}", path.display()))
}
