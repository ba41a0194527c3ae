//! The reconciliation endpoints: `GET /v1/reconciliations?from=&to=` (runs
//! whose window overlaps, newest first; default the last 24 h),
//! `GET /v1/reconciliations/{id}` (a run and its discrepancies, with their
//! evidence) — both with the read or the admin token — and
//! `POST /v1/reconciliations?from=&to=` (admin token): reconcile that window
//! now, answering when it is done. Times are RFC 3339. All answer 503 when
//! this pod does not reconcile.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use cabine_actors::ports::reconcile::ReconcileError;
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::auth::Refusal;
use crate::reconcile::PgReconciliation;

/// Longest window an operator may reconcile in one call.
const MAX_WINDOW: Duration = Duration::from_secs(24 * 3600);

fn reconciler_of(state: &AppState) -> Result<&Arc<PgReconciliation>, Refusal> {
    let disabled = || {
        Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "this pod does not reconcile (reconcile.enabled and outbound.enabled)",
        )
    };
    state.operator.as_ref().and_then(|o| o.reconciler.as_ref()).ok_or_else(disabled)
}

fn refusal(e: ReconcileError) -> Refusal {
    let status = match e {
        ReconcileError::Unavailable(_) | ReconcileError::NoStatement { .. } => StatusCode::SERVICE_UNAVAILABLE,
        ReconcileError::Fatal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    Refusal::new(status, e.to_string())
}

#[derive(Debug, Deserialize)]
pub struct WindowQuery {
    from: Option<String>,
    to: Option<String>,
}

/// `from` and `to` (RFC 3339); either may default.
fn window(
    query: Result<Query<WindowQuery>, QueryRejection>,
    default_from: impl FnOnce(SystemTime) -> Option<SystemTime>,
) -> Result<(SystemTime, SystemTime), Refusal> {
    let Query(q) = query.map_err(|e| Refusal::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    rfc3339_window(q.from.as_deref(), q.to.as_deref(), default_from)
}

/// `[from, to)` from RFC 3339 texts: `to` defaults to now, `from` to `default_from(to)`; 400 otherwise.
pub(super) fn rfc3339_window(
    from: Option<&str>,
    to: Option<&str>,
    default_from: impl FnOnce(SystemTime) -> Option<SystemTime>,
) -> Result<(SystemTime, SystemTime), Refusal> {
    let bad = |why: String| Refusal::new(StatusCode::BAD_REQUEST, why);
    let parse = |name: &str, text: &str| {
        humantime::parse_rfc3339_weak(text).map_err(|e| bad(format!("{name} {text:?} is not an RFC 3339 time: {e}")))
    };
    let to = to.map(|t| parse("to", t)).transpose()?.unwrap_or_else(SystemTime::now);
    let from = match from {
        Some(f) => parse("from", f)?,
        None => default_from(to).ok_or_else(|| bad("from is required".into()))?,
    };
    if from >= to {
        return Err(bad("from must be before to".into()));
    }
    Ok((from, to))
}

pub async fn list(
    State(state): State<AppState>,
    query: Result<Query<WindowQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    state.access.read(&headers)?;
    let r = reconciler_of(&state)?;
    let (from, to) = window(query, |to| to.checked_sub(MAX_WINDOW))?;
    let runs = r.records.runs(from, to).await.map_err(refusal)?;
    Ok(Json(json!({ "reconciliations": runs })).into_response())
}

pub async fn detail(
    State(state): State<AppState>,
    Path(id): Path<i64>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    state.access.read(&headers)?;
    let r = reconciler_of(&state)?;
    let (run, discrepancies) = r
        .records
        .run(id)
        .await
        .map_err(refusal)?
        .ok_or_else(|| Refusal::new(StatusCode::NOT_FOUND, format!("no reconciliation {id}")))?;
    Ok(Json(json!({ "reconciliation": run, "discrepancies": discrepancies })).into_response())
}

pub async fn run(
    State(state): State<AppState>,
    query: Result<Query<WindowQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    state.access.admin(&headers)?;
    let r = reconciler_of(&state)?;
    let (from, to) = window(query, |_| None)?;
    if to.duration_since(from).unwrap_or_default() > MAX_WINDOW {
        return Err(Refusal::new(StatusCode::BAD_REQUEST, "a window is at most 24 h: reconcile it in parts"));
    }
    if to + r.policy.settle_margin > SystemTime::now() {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            format!(
                "the window is still open: to must be at least reconcile.settle_margin ({:?}) ago",
                r.policy.settle_margin
            ),
        ));
    }
    tracing::warn!(from = %humantime::format_rfc3339_millis(from), to = %humantime::format_rfc3339_millis(to), "operator reconciliation");
    let report = r.reconcile_window(from, to, "operator").await.map_err(refusal)?;
    if let Some(o) = &state.operator {
        o.tree.reconciled(&report);
    }
    let (run, discrepancies) = r.records.run(report.id).await.map_err(refusal)?.unzip();
    Ok(Json(json!({ "reconciliation": run, "discrepancies": discrepancies.unwrap_or_default() })).into_response())
}
