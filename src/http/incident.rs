//! `GET /v1/incidents/report?from=&to=&lag=&format=` (read or admin token):
//! the incident report of a window (RFC 3339 times; `lag`, e.g. `5s`, is the
//! received → published delay past which an inbound message counts as
//! delayed, default 5 s), as JSON, or Markdown with `format=markdown`;
//! `to` defaults to now.

use std::time::{Duration, SystemTime};

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::AppState;
use super::auth::Refusal;

/// Longest window one report covers.
const MAX_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);
const DEFAULT_LAG: Duration = Duration::from_secs(5);

#[derive(Debug, Deserialize)]
pub struct ReportQuery {
    from: Option<String>,
    to: Option<String>,
    lag: Option<String>,
    format: Option<String>,
}

/// What a report's handler starts from, once the reader's token passed: the
/// running tree's handles and a window of at most 7 days (RFC 3339; `to`
/// defaults to now).
pub(super) fn report_window<'a>(
    state: &'a AppState,
    from: Option<&str>,
    to: Option<&str>,
) -> Result<(&'a super::Operator, SystemTime, SystemTime), Refusal> {
    let operator = state
        .operator
        .as_ref()
        .ok_or_else(|| Refusal::new(StatusCode::SERVICE_UNAVAILABLE, "the pod is not running its tree"))?;
    let (from, to) = super::reconcile::rfc3339_window(from, to, |_| None)?;
    if to.duration_since(from).unwrap_or_default() > MAX_WINDOW {
        return Err(Refusal::new(StatusCode::BAD_REQUEST, "a report covers at most 7 days"));
    }
    Ok((operator, from, to))
}

pub async fn report(
    State(state): State<AppState>,
    query: Result<Query<ReportQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    state.access.read(&headers)?;
    let bad = |why: String| Refusal::new(StatusCode::BAD_REQUEST, why);
    let Query(q) = query.map_err(|e| bad(e.body_text()))?;
    let (operator, from, to) = report_window(&state, q.from.as_deref(), q.to.as_deref())?;
    let reports = operator.incidents.clone();
    let lag = match q.lag.as_deref() {
        None => DEFAULT_LAG,
        Some(l) => humantime::parse_duration(l).map_err(|e| bad(format!("lag {l:?}: {e}")))?,
    };
    let report = reports
        .report(from, to, lag)
        .await
        .map_err(|e| Refusal::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    Ok(match q.format.as_deref() {
        None | Some("json") => Json(report).into_response(),
        Some("markdown") => {
            ([(header::CONTENT_TYPE, "text/markdown; charset=utf-8")], report.markdown()).into_response()
        }
        Some(other) => return Err(bad(format!("format {other:?}: json or markdown"))),
    })
}
