//! The outbound operator endpoints: `GET /v1/outbound/{msg_id}` (state and
//! history), `GET /v1/outbound?status=&after=&limit=` (a page of one status)
//! and `POST /v1/outbound/{msg_id}/reprocess` (admin bearer; `dead` /
//! `rejected` → `queued` again). The reads show payment data: they take the
//! read or the admin token (open only on a loopback listener without a read
//! token). All answer 503 when this pod runs no outbound side.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use cabine_actors::ports::breaker::CircuitBreaker;
use cabine_actors::ports::outbound::{OutboundError, OutboundStatus, OutboundStore, Reprocessed};
use cabine_actors::ports::outbound_bus::ResultSink;
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::auth::Refusal;
use super::outbound_view::{DetailView, PageView};
use crate::bus::Subjects;
use crate::outbound::ingress::IngressRules;

/// Largest page of `GET /v1/outbound`, and the default one.
pub const MAX_PAGE: u32 = 500;
const DEFAULT_PAGE: u32 = 100;

/// What the outbound endpoints act through (built with `outbound.enabled`).
#[derive(Clone)]
pub struct OutboundOperator {
    pub store: Arc<dyn OutboundStore>,
    pub breaker: Arc<dyn CircuitBreaker>,
    /// Publishes the `accepted` event of a reprocess (the janitor's sweep retries it).
    pub results: Arc<dyn ResultSink>,
    /// `POST /v1/outbound` publishes here, as the bank's core does.
    pub bus: jetstream::Context,
    pub subjects: Subjects,
    /// The bus ingress's rules (ISPB, enabled channels, deadlines, `outbound.max_message_bytes`).
    pub rules: IngressRules,
    /// Bound on each store, breaker and bus call.
    pub timeout: Duration,
}

impl OutboundOperator {
    /// Runs `f` within [`OutboundOperator::timeout`]; `None` when it took longer.
    pub async fn bounded<T>(&self, f: impl Future<Output = T>) -> Option<T> {
        tokio::time::timeout(self.timeout, f).await.ok()
    }

    /// The store's answer, or the 503 / 500 that says why there is none.
    pub(super) async fn stored<T>(&self, f: impl Future<Output = Result<T, OutboundError>>) -> Result<T, Refusal> {
        match self.bounded(f).await {
            Some(Ok(v)) => Ok(v),
            Some(Err(e @ OutboundError::Unavailable(_))) => {
                Err(Refusal::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))
            }
            Some(Err(e @ OutboundError::Refused(_))) => Err(Refusal::new(StatusCode::BAD_REQUEST, e.to_string())),
            Some(Err(e @ OutboundError::Fatal(_))) => {
                Err(Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
            }
            None => Err(Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("outbound store: no answer within {:?}", self.timeout),
            )),
        }
    }
}

/// The pod's outbound side, or the 503 saying there is none.
pub fn outbound_of(state: &AppState) -> Result<&OutboundOperator, Refusal> {
    let disabled =
        || Refusal::new(StatusCode::SERVICE_UNAVAILABLE, "outbound is not enabled on this pod (outbound.enabled)");
    state.operator.as_ref().and_then(|o| o.outbound.as_ref()).ok_or_else(disabled)
}

fn unknown(msg_id: &str) -> Refusal {
    Refusal::new(StatusCode::NOT_FOUND, format!("no outbound message {msg_id:?}"))
}

pub async fn detail(
    State(state): State<AppState>,
    Path(msg_id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    state.access.read(&headers)?;
    let o = outbound_of(&state)?;
    let detail = o.stored(o.store.get(&msg_id)).await?.ok_or_else(|| unknown(&msg_id))?;
    Ok(Json(DetailView::from(detail)).into_response())
}

#[derive(Debug, Deserialize)]
pub struct ListQuery {
    status: Option<String>,
    after: Option<i64>,
    limit: Option<u32>,
}

pub async fn list(
    State(state): State<AppState>,
    query: Result<Query<ListQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    state.access.read(&headers)?;
    let o = outbound_of(&state)?;
    let (status, after, limit) = list_args(query).map_err(|why| Refusal::new(StatusCode::BAD_REQUEST, why))?;
    let page = o.stored(o.store.list(status, after, limit)).await?;
    Ok(Json(PageView::of(status, page)).into_response())
}

/// `status` (required, one of the statuses), `after` (a row id), `limit` in 1..=500 (100).
fn list_args(query: Result<Query<ListQuery>, QueryRejection>) -> Result<(OutboundStatus, Option<i64>, u32), String> {
    let Query(q) = query.map_err(|e| e.body_text())?;
    let names = OutboundStatus::ALL.map(OutboundStatus::as_str).join("|");
    let status = q.status.ok_or_else(|| format!("status is required: {names}"))?;
    let status = status.parse().map_err(|e| format!("{e}: status is {names}"))?;
    let limit = q.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(format!("limit is 1..={MAX_PAGE}, got {limit}"));
    }
    Ok((status, q.after, limit))
}

pub async fn reprocess(
    State(state): State<AppState>,
    Path(msg_id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    state.access.admin(&headers)?;
    let o = outbound_of(&state)?;
    let body = match o.stored(o.store.reprocess(&msg_id)).await? {
        Reprocessed::Queued(event) => {
            tracing::warn!(msg_id, "operator reprocess: queued again");
            let published = matches!(o.bounded(o.results.publish(std::slice::from_ref(&event))).await, Some(Ok(_)));
            json!({
                "msg_id": msg_id,
                "status": OutboundStatus::Queued,
                "result": "queued again with the same MsgId and a fresh deadline; poison attempts count from now",
                "event_published": published,
            })
        }
        Reprocessed::NotFound => return Err(unknown(&msg_id)),
        Reprocessed::NotAllowed(status) => {
            let why = format!("{msg_id} is {status}: only dead or rejected messages can be reprocessed");
            let body = json!({ "error": why, "msg_id": msg_id, "status": status });
            return Ok((StatusCode::CONFLICT, Json(body)).into_response());
        }
    };
    Ok((StatusCode::OK, Json(body)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(q: &str) -> Result<(OutboundStatus, Option<i64>, u32), String> {
        let uri: axum::http::Uri = format!("http://x/v1/outbound?{q}").parse().unwrap();
        list_args(Query::try_from_uri(&uri))
    }

    #[test]
    fn a_page_needs_a_known_status_and_a_bounded_limit() {
        assert_eq!(args("status=dead").unwrap(), (OutboundStatus::Dead, None, 100));
        assert_eq!(
            args("status=rejected_by_spi&after=7&limit=2").unwrap(),
            (OutboundStatus::RejectedBySpi, Some(7), 2)
        );
        assert!(args("status=lost").unwrap_err().contains("dead"));
        assert!(args("").unwrap_err().contains("required"));
        assert!(args("status=dead&limit=0").unwrap_err().contains("limit"));
        assert!(args("status=dead&limit=501").unwrap_err().contains("limit"));
        assert!(args("status=dead&after=x").is_err());
    }
}
