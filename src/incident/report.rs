//! The incident report of a window: which messages a bad hour touched, read
//! back from Postgres — inbound delayed (received → published above a lag),
//! outbound retried, past their deadline, timed out, in doubt and how each
//! was resolved, the failovers, quarantines and breaker openings the pods
//! recorded, and the reconciliation's findings — counts plus the MsgIds /
//! EndToEndIds (at most [`MAX_ITEMS`] per section), as JSON or Markdown.

use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::db::Db;
use crate::db::bounded;

/// Items listed per section (the count is always whole).
pub const MAX_ITEMS: i64 = 500;

/// Reads the report's sources, each statement bounded by `timeout`.
#[derive(Clone)]
pub struct IncidentReports {
    pub db: Db,
    pub ispb: String,
    pub timeout: Duration,
}

/// A Postgres call of the incident log or report that failed (pool, timeout, statement).
#[derive(Debug, thiserror::Error)]
#[error("incident store: {0}")]
pub struct ReportError(pub String);

impl bounded::Bounded for ReportError {
    fn pool(e: deadpool_postgres::PoolError) -> Self {
        ReportError(format!("postgres pool: {e}"))
    }

    fn timed_out(after: Duration) -> Self {
        ReportError(format!("postgres: no answer within {after:?}"))
    }
}

/// One section: how many, and the first [`MAX_ITEMS`] of them.
#[derive(Debug, Serialize)]
pub struct Section {
    pub count: i64,
    pub items: Vec<serde_json::Value>,
    pub truncated: bool,
}

#[derive(Debug, Serialize)]
pub struct IncidentReport {
    pub ispb: String,
    pub from: String,
    pub to: String,
    pub inbound_lag_threshold_ms: u64,
    pub inbound_delayed: Section,
    pub outbound_retried: Section,
    pub outbound_past_deadline: Section,
    pub outbound_timed_out: Section,
    pub outbound_in_doubt: Section,
    pub failovers: Section,
    pub quarantines: Section,
    pub breaker_openings: Section,
    pub reconciliation: Section,
}

fn stamp(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// `items_sql` selects one JSON object per item (`item`) and `count(*) OVER ()` (`total`),
/// ordered, with `$1` ispb, `$2` from, `$3` to, then `extra`; `LIMIT` is added.
const SECTIONS: [(&str, &str); 9] = [
    (
        "inbound_delayed",
        "SELECT json_build_object('msg_id', msg_id, 'end_to_end_id', end_to_end_id, 'msg_def', msg_def,
                'resource_id', resource_id, 'channel', channel, 'received_at', received_at,
                'published_at', published_at,
                'lag_ms', (extract(epoch FROM COALESCE(published_at, now()) - received_at) * 1000)::bigint) AS item,
                count(*) OVER () AS total
         FROM inbox WHERE ispb = $1 AND received_at >= $2 AND received_at < $3 AND status = 'received'
           AND extract(epoch FROM COALESCE(published_at, now()) - received_at) * 1000 > $4::bigint
         ORDER BY received_at",
    ),
    (
        "outbound_retried",
        "SELECT json_build_object('msg_id', msg_id, 'end_to_end_ids', end_to_end_ids, 'attempts', attempts,
                'status', status, 'last_error', last_error, 'created_at', created_at) AS item,
                count(*) OVER () AS total
         FROM outbound WHERE ispb = $1 AND created_at >= $2 AND created_at < $3 AND attempts > 1
         ORDER BY created_at",
    ),
    (
        "outbound_past_deadline",
        "SELECT json_build_object('msg_id', msg_id, 'end_to_end_ids', end_to_end_ids, 'status', status,
                'deadline', deadline, 'class_ms', (extract(epoch FROM deadline - created_at) * 1000)::bigint,
                'attempts', attempts) AS item,
                count(*) OVER () AS total
         FROM outbound WHERE ispb = $1 AND deadline >= $2 AND deadline < $3
           AND (sent_at IS NULL OR sent_at > deadline) AND status NOT IN ('rejected', 'rejected_invalid')
         ORDER BY deadline",
    ),
    (
        "outbound_timed_out",
        "SELECT json_build_object('msg_id', o.msg_id, 'end_to_end_ids', o.end_to_end_ids, 'at', h.at,
                'from', h.from_status, 'detail', h.detail) AS item,
                count(*) OVER () AS total
         FROM outbound_history h JOIN outbound o ON o.id = h.outbound_id
         WHERE o.ispb = $1 AND h.at >= $2 AND h.at < $3 AND h.to_status = 'timeout'
         ORDER BY h.at",
    ),
    (
        "outbound_in_doubt",
        "SELECT json_build_object('msg_id', o.msg_id, 'end_to_end_ids', o.end_to_end_ids, 'at', h.at,
                'status', o.status,
                'resolved', (SELECT json_build_object('to', n.to_status, 'at', n.at, 'detail', n.detail)
                             FROM outbound_history n WHERE n.outbound_id = o.id AND n.id > h.id
                             ORDER BY n.id LIMIT 1)) AS item,
                count(*) OVER () AS total
         FROM outbound_history h JOIN outbound o ON o.id = h.outbound_id
         WHERE o.ispb = $1 AND h.at >= $2 AND h.at < $3 AND h.to_status = 'in_doubt'
         ORDER BY h.at",
    ),
    (
        "failovers",
        "SELECT json_build_object('pod', pod, 'channel', channel, 'slot', slot, 'at', at, 'detail', detail) AS item,
                count(*) OVER () AS total
         FROM incident_event WHERE ispb = $1 AND at >= $2 AND at < $3 AND kind = 'failover' ORDER BY at",
    ),
    (
        "quarantines",
        "SELECT json_build_object('pod', pod, 'at', at, 'detail', detail) AS item, count(*) OVER () AS total
         FROM incident_event WHERE ispb = $1 AND at >= $2 AND at < $3 AND kind = 'quarantine' ORDER BY at",
    ),
    (
        "breaker_openings",
        "SELECT json_build_object('pod', pod, 'channel', channel, 'at', at, 'detail', detail) AS item,
                count(*) OVER () AS total
         FROM incident_event WHERE ispb = $1 AND at >= $2 AND at < $3 AND kind = 'breaker_opened' ORDER BY at",
    ),
    (
        "reconciliation",
        "SELECT json_build_object('reconciliation', r.id, 'window_from', r.window_from, 'window_to', r.window_to,
                'kind', d.kind, 'level', d.level, 'end_to_end_id', d.end_to_end_id, 'msg_id', d.msg_id,
                'action', d.action) AS item,
                count(*) OVER () AS total
         FROM reconciliation_discrepancy d JOIN reconciliation r ON r.id = d.reconciliation_id
         WHERE r.ispb = $1 AND r.window_to > $2 AND r.window_from < $3
         ORDER BY r.window_from, d.id",
    ),
];

impl IncidentReports {
    async fn section(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Section, ReportError> {
        let sql = format!("{sql} LIMIT {MAX_ITEMS}");
        let rows: Vec<Row> = bounded::with_conn(&self.db, self.timeout, |conn| async move {
            conn.query(&sql, params).await.map_err(|e| ReportError(e.to_string()))
        })
        .await?;
        let count = rows.first().map_or(0, |r| r.get::<_, i64>("total"));
        let items: Vec<serde_json::Value> = rows.iter().map(|r| r.get("item")).collect();
        Ok(Section { truncated: count > items.len() as i64, count, items })
    }

    /// The report of `[from, to)`; an inbound message is delayed past `lag`.
    pub async fn report(&self, from: SystemTime, to: SystemTime, lag: Duration) -> Result<IncidentReport, ReportError> {
        let lag_ms = i64::try_from(lag.as_millis()).unwrap_or(i64::MAX);
        let mut sections = Vec::with_capacity(SECTIONS.len());
        for (name, sql) in SECTIONS {
            let base: [&(dyn ToSql + Sync); 3] = [&self.ispb, &from, &to];
            let section = if name == "inbound_delayed" {
                self.section(sql, &[base[0], base[1], base[2], &lag_ms]).await?
            } else {
                self.section(sql, &base).await?
            };
            sections.push(section);
        }
        let mut s = sections.into_iter();
        let mut next = || s.next().unwrap_or(Section { count: 0, items: Vec::new(), truncated: false });
        Ok(IncidentReport {
            ispb: self.ispb.clone(),
            from: stamp(from),
            to: stamp(to),
            inbound_lag_threshold_ms: lag.as_millis() as u64,
            inbound_delayed: next(),
            outbound_retried: next(),
            outbound_past_deadline: next(),
            outbound_timed_out: next(),
            outbound_in_doubt: next(),
            failovers: next(),
            quarantines: next(),
            breaker_openings: next(),
            reconciliation: next(),
        })
    }
}

impl IncidentReport {
    /// The sections in order, with their headings.
    fn sections(&self) -> [(String, &Section); 9] {
        [
            (
                format!("Inbound delayed (received → published > {} ms)", self.inbound_lag_threshold_ms),
                &self.inbound_delayed,
            ),
            ("Outbound retried (more than one attempt)".into(), &self.outbound_retried),
            ("Outbound past their deadline (not sent in time)".into(), &self.outbound_past_deadline),
            ("Outbound timed out (never reached the SPI)".into(), &self.outbound_timed_out),
            ("Outbound in doubt, and how each was resolved".into(), &self.outbound_in_doubt),
            ("Failovers".into(), &self.failovers),
            ("Lease quarantines".into(), &self.quarantines),
            ("Breaker openings".into(), &self.breaker_openings),
            ("Reconciliation discrepancies".into(), &self.reconciliation),
        ]
    }

    /// The readable form: a summary table, then each non-empty section's items.
    pub fn markdown(&self) -> String {
        let mut md = format!(
            "# Incident report {} — {}\n\nParticipant {}, window `[{}, {})`.\n\n",
            self.from, self.to, self.ispb, self.from, self.to
        );
        md.push_str("| what | count |\n| --- | ---: |\n");
        for (title, s) in self.sections() {
            md.push_str(&format!("| {title} | {} |\n", s.count));
        }
        for (title, s) in self.sections() {
            if s.count == 0 {
                continue;
            }
            md.push_str(&format!("\n## {title}: {}\n\n", s.count));
            for item in &s.items {
                md.push_str(&format!("- {}\n", line(item)));
            }
            if s.truncated {
                md.push_str(&format!(
                    "- … {} more (JSON lists the first {MAX_ITEMS})\n",
                    s.count - s.items.len() as i64
                ));
            }
        }
        md
    }
}

/// One item as a Markdown line: identifiers first, in code, then the rest.
fn line(item: &serde_json::Value) -> String {
    let Some(fields) = item.as_object() else { return item.to_string() };
    let mut parts = Vec::new();
    for (k, v) in fields {
        let text = match v {
            serde_json::Value::Null => continue,
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        parts.push(if k.ends_with("id") || k.ends_with("ids") {
            format!("{k} `{text}`")
        } else {
            format!("{k} {text}")
        });
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(items: Vec<serde_json::Value>, count: i64) -> Section {
        Section { truncated: count > items.len() as i64, count, items }
    }

    #[test]
    fn markdown_has_a_summary_and_the_items_of_each_nonempty_section() {
        let empty = || section(vec![], 0);
        let report = IncidentReport {
            ispb: "99999010".into(),
            from: "2026-12-04T10:00:00.000Z".into(),
            to: "2026-12-04T11:00:00.000Z".into(),
            inbound_lag_threshold_ms: 5000,
            inbound_delayed: empty(),
            outbound_retried: section(vec![serde_json::json!({"msg_id": "M1", "attempts": 3})], 2),
            outbound_past_deadline: empty(),
            outbound_timed_out: empty(),
            outbound_in_doubt: empty(),
            failovers: empty(),
            quarantines: empty(),
            breaker_openings: empty(),
            reconciliation: empty(),
        };
        let md = report.markdown();
        assert!(md.contains("| Outbound retried (more than one attempt) | 2 |"), "{md}");
        assert!(md.contains("## Outbound retried (more than one attempt): 2"), "{md}");
        assert!(md.contains("attempts 3, msg_id `M1`"), "{md}");
        assert!(md.contains("… 1 more"), "{md}");
        assert!(!md.contains("## Failovers"), "{md}");
    }
}
