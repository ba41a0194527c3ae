//! The timing report's readable forms: the Markdown table of the figures, and
//! the per-message CSV (one line per message, RFC 3339 timestamps, empty where
//! a stage does not apply or has not happened).

use std::time::SystemTime;

use tokio_postgres::Row;

use super::TimingReport;

pub const CSV_HEADER: &str =
    "direction,channel,id,end_to_end_id,persisted_at,published_at,accepted_at,sent_at,confirmed_at";

/// The window's inbox rows after row `$4`, `$5` of them, by id.
pub(super) const INBOUND_PAGE_SQL: &str = "
    SELECT 0::int2, id, channel, COALESCE(msg_id, resource_id), end_to_end_id,
           received_at, published_at, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz
      FROM inbox WHERE ispb = $1 AND received_at >= $2 AND received_at < $3 AND status = 'received' AND id > $4
     ORDER BY id LIMIT $5";

/// The window's outbound messages after row `$4`, `$5` of them, by id.
pub(super) const OUTBOUND_PAGE_SQL: &str = "
    SELECT 1::int2, id, channel, msg_id, array_to_string(end_to_end_ids, ' '),
           NULL::timestamptz, NULL::timestamptz, created_at, sent_at, confirmed_at
      FROM outbound WHERE ispb = $1 AND created_at >= $2 AND created_at < $3 AND msg_id IS NOT NULL AND id > $4
     ORDER BY id LIMIT $5";

/// CSV lines of `rows` (a page of one direction), and the key of the last one.
pub fn csv_lines(rows: &[Row]) -> Result<(Vec<String>, Option<super::PageKey>), tokio_postgres::Error> {
    let mut lines = Vec::with_capacity(rows.len());
    let mut last = None;
    for r in rows {
        let dir: i16 = r.try_get(0)?;
        let id: i64 = r.try_get(1)?;
        let times: Vec<String> =
            (5..10).map(|i| r.try_get::<_, Option<SystemTime>>(i).map(when)).collect::<Result<_, _>>()?;
        let fields = [
            if dir == 0 { "inbound".into() } else { "outbound".into() },
            r.try_get::<_, String>(2)?,
            r.try_get::<_, Option<String>>(3)?.unwrap_or_default(),
            r.try_get::<_, Option<String>>(4)?.unwrap_or_default(),
        ];
        let cells: Vec<String> = fields.iter().map(|f| cell(f)).chain(times).collect();
        lines.push(cells.join(","));
        last = Some((dir, id));
    }
    Ok((lines, last))
}

fn when(t: Option<SystemTime>) -> String {
    t.map(|t| humantime::format_rfc3339_millis(t).to_string()).unwrap_or_default()
}

/// A CSV cell: quoted when it holds a comma, a quote or a line break; a leading
/// `=`, `+`, `-`, `@`, tab or carriage return is defused for spreadsheets.
fn cell(s: &str) -> String {
    let s = if s.starts_with(['=', '+', '-', '@', '\t', '\r']) { format!("'{s}") } else { s.to_owned() };
    if s.contains([',', '"', '\n', '\r']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s }
}

impl TimingReport {
    pub fn markdown(&self) -> String {
        let mut md = format!(
            "# Timings {} — {}\n\nParticipant {}, window `[{}, {})`; milliseconds.\n\n",
            self.from, self.to, self.ispb, self.from, self.to
        );
        md.push_str("| direction | channel | stage | count | p50 | p95 | p99 | max |\n");
        md.push_str("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
        for s in &self.stages {
            md.push_str(&format!(
                "| {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} |\n",
                s.direction, s.channel, s.stage, s.count, s.p50_ms, s.p95_ms, s.p99_ms, s.max_ms
            ));
        }
        if self.stages.is_empty() {
            md.push_str("| – | – | no message in the window | 0 | | | | |\n");
        }
        if !self.pending.is_empty() {
            md.push_str("\nNot there yet:\n\n");
            for p in &self.pending {
                md.push_str(&format!("- {} {} {}: {}\n", p.direction, p.channel, p.stage, p.count));
            }
        }
        md
    }
}

#[cfg(test)]
mod tests {
    use super::cell;

    #[test]
    fn cells_are_quoted_and_defused_for_spreadsheets() {
        assert_eq!(cell("M123"), "M123");
        assert_eq!(cell("a,b"), "\"a,b\"");
        assert_eq!(cell("say \"x\""), "\"say \"\"x\"\"\"");
        assert_eq!(cell("=SUM(A1)"), "'=SUM(A1)");
        assert_eq!(cell("\tx"), "'\tx");
    }
}
