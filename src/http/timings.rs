//! `GET /v1/reports/timings?from=&to=&format=json|md|csv` (read or admin
//! token): per channel and stage the count and p50 / p95 / p99 / max in ms
//! (JSON or Markdown), or every message's stage timestamps as CSV, streamed
//! page by page (one bounded statement per page; a failed page ends the body
//! with an `# error:` line). `to` defaults to now; a window covers ≤ 7 days.

use std::time::SystemTime;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::stream;
use serde::Deserialize;

use super::AppState;
use super::auth::Refusal;
use crate::timings::{CSV_HEADER, CsvPage, TimingReports};

#[derive(Debug, Deserialize)]
pub struct TimingsQuery {
    from: Option<String>,
    to: Option<String>,
    format: Option<String>,
}

pub async fn report(
    State(state): State<AppState>,
    query: Result<Query<TimingsQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    state.access.read(&headers)?;
    let bad = |why: String| Refusal::new(StatusCode::BAD_REQUEST, why);
    let Query(q) = query.map_err(|e| bad(e.body_text()))?;
    let (operator, from, to) = super::incident::report_window(&state, q.from.as_deref(), q.to.as_deref())?;
    let timings = operator.timings.clone();
    let unavailable = |e: crate::timings::TimingsError| Refusal::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string());
    match q.format.as_deref() {
        None | Some("json") => Ok(Json(timings.report(from, to).await.map_err(unavailable)?).into_response()),
        Some("md" | "markdown") => {
            let md = timings.report(from, to).await.map_err(unavailable)?.markdown();
            Ok(([(header::CONTENT_TYPE, "text/markdown; charset=utf-8")], md).into_response())
        }
        Some("csv") => {
            // The first page before the answer starts: an unreachable Postgres is a 503, not an empty file.
            let first = timings.page(from, to, (-1, 0)).await.map_err(unavailable)?;
            Ok(([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], csv_body(timings, from, to, first))
                .into_response())
        }
        Some(other) => Err(bad(format!("format {other:?}: json, md or csv"))),
    }
}

/// The header, the first page, then the next pages as they are read.
fn csv_body(timings: std::sync::Arc<TimingReports>, from: SystemTime, to: SystemTime, first: CsvPage) -> Body {
    let head = stream::iter([Ok::<String, std::convert::Infallible>(format!("{CSV_HEADER}\n"))]);
    let pages = stream::unfold(Some(Ok(first)), move |state| {
        let timings = timings.clone();
        async move {
            let page = state?;
            let (lines, next) = match page {
                Ok(page) => page,
                Err(e) => return Some((Ok(format!("# error: {e}\n")), None)),
            };
            let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
            let after = match next {
                Some(after) => Some(timings.page(from, to, after).await),
                None => None,
            };
            Some((Ok(text), after))
        }
    });
    Body::from_stream(futures::StreamExt::chain(head, pages))
}
