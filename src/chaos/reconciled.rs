//! What the run's own records say after the verdict: with `--reconcile`, the
//! Reconciler's windows over the run (every one reconciled, consecutive, and
//! what they found), and always the incident report's counts for the run —
//! the faults' effects as an operator would read them.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::time::Instant;

use crate::harness::LocalCluster;
use crate::incident::IncidentReports;

/// The Reconciler's windows over a run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ReconcileFigures {
    /// Windows reconciled (status done) that overlap the run.
    pub windows: i64,
    /// The windows start at or before the traffic, end at or after it, and follow one another.
    pub covered: bool,
    pub statement_entries: i64,
    /// Sends the statements settled (in doubt or unconfirmed at the time).
    pub settled_sends: i64,
    /// Discrepancies by kind (INFO ones included: a settled send is one).
    pub discrepancies: BTreeMap<String, i64>,
    /// Discrepancies above INFO: what fails the run.
    pub unexplained: i64,
}

/// The windows the pods' schedule reconciled over `[from, to)`, once the last one
/// covering `to` is done (or `within` passed).
pub async fn windows(c: &LocalCluster, (from, to): (SystemTime, SystemTime), within: Duration) -> ReconcileFigures {
    let deadline = Instant::now() + within;
    loop {
        let last: Option<SystemTime> = c
            .query("SELECT max(window_to) FROM reconciliation WHERE origin = 'schedule' AND status = 'done'")
            .await
            .ok()
            .and_then(|rows| rows.first().and_then(|r| r.get(0)));
        if last.is_some_and(|l| l >= to) || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    figures(c, (from, to)).await.unwrap_or_default()
}

async fn figures(c: &LocalCluster, (from, to): (SystemTime, SystemTime)) -> anyhow::Result<ReconcileFigures> {
    let runs = c
        .query(&format!(
            "SELECT window_from, window_to, COALESCE(statement_entries, 0)::bigint, settled_sends::bigint, id
             FROM reconciliation WHERE origin = 'schedule' AND status = 'done'
               AND window_to > '{}' AND window_from < '{}' ORDER BY window_from",
            humantime::format_rfc3339_micros(from),
            humantime::format_rfc3339_micros(to)
        ))
        .await?;
    let mut f = ReconcileFigures { windows: runs.len() as i64, ..Default::default() };
    let bounds: Vec<(SystemTime, SystemTime)> = runs.iter().map(|r| (r.get(0), r.get(1))).collect();
    let consecutive = bounds.windows(2).all(|w| w[0].1 == w[1].0);
    f.covered = consecutive
        && bounds.first().is_some_and(|(start, _)| *start <= from)
        && bounds.last().is_some_and(|(_, end)| *end >= to);
    f.statement_entries = runs.iter().map(|r| r.get::<_, i64>(2)).sum();
    f.settled_sends = runs.iter().map(|r| r.get::<_, i64>(3)).sum();
    let ids: Vec<String> = runs.iter().map(|r| r.get::<_, i64>(4).to_string()).collect();
    if !ids.is_empty() {
        let found = c
            .query(&format!(
                "SELECT kind, level, count(*) FROM reconciliation_discrepancy WHERE reconciliation_id IN ({})
                 GROUP BY kind, level",
                ids.join(",")
            ))
            .await?;
        for r in &found {
            let (kind, level, n): (String, String, i64) = (r.get(0), r.get(1), r.get(2));
            *f.discrepancies.entry(kind).or_default() += n;
            if level != "INFO" {
                f.unexplained += n;
            }
        }
    }
    Ok(f)
}

/// An inbound message published this long after it was received counts as delayed in a run
/// (the test timings' lease is 2 s: a takeover delays by about that).
pub const DELAYED: Duration = Duration::from_secs(1);

/// The incident report's count per section over `[from, to)` (empty when it cannot be read).
pub async fn incidents(c: &LocalCluster, (from, to): (SystemTime, SystemTime)) -> BTreeMap<String, i64> {
    let reports = IncidentReports {
        db: c.postgres.clone(),
        ispb: c.settings.cluster.ispb.to_string(),
        timeout: Duration::from_secs(30),
    };
    let Ok(report) = reports.report(from, to, DELAYED).await else { return BTreeMap::new() };
    let Ok(serde_json::Value::Object(sections)) = serde_json::to_value(&report) else { return BTreeMap::new() };
    sections.into_iter().filter_map(|(name, s)| s.get("count").and_then(|n| n.as_i64()).map(|n| (name, n))).collect()
}
