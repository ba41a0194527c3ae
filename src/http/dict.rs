//! `GET /v1/dict/entries/{key}?payer_id=…&end_to_end_id=…` (read token: the
//! answer is payment data): a DICT lookup for the bank core. 200 with the
//! entry, 404 when the DICT has no such key (both say their `source` —
//! `dict`, `cache`, `stale_cache` — and `age_ms`), 429 with `Retry-After` when
//! a bucket is empty, 503 when the DICT cannot answer and nothing servable is
//! cached, 502 for an answer the spec does not allow, 400 for bad parameters.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::auth::Refusal;
use crate::dict::{Answer, LookupError};

#[derive(Debug, Deserialize)]
pub struct LookupQuery {
    payer_id: Option<String>,
    end_to_end_id: Option<String>,
}

pub async fn entry(
    State(state): State<AppState>,
    Path(key): Path<String>,
    Query(q): Query<LookupQuery>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    state.access.read(&headers)?;
    let lookups = state.operator.as_ref().and_then(|o| o.dict.clone()).ok_or_else(|| {
        Refusal::new(StatusCode::SERVICE_UNAVAILABLE, "DICT lookups are not enabled on this pod (dict.enabled)")
    })?;
    let payer = q.payer_id.unwrap_or_default();
    if !matches!(payer.len(), 11 | 14) || !payer.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Refusal::new(StatusCode::BAD_REQUEST, "payer_id: the payer's CPF (11 digits) or CNPJ (14 digits)"));
    }
    let e2e = q.end_to_end_id.unwrap_or_default();
    if e2e.is_empty() || e2e.len() > 32 || key.is_empty() || key.len() > 77 {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "end_to_end_id (≤ 32 characters) and a key (≤ 77) are required",
        ));
    }
    Ok(match lookups.lookup(&key, &payer, &e2e).await {
        Ok(answer) => found(&key, answer),
        Err(LookupError::RateLimited { policy, retry_after }) => {
            let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
            let mut r = (StatusCode::TOO_MANY_REQUESTS, Json(json!({"error": "rate limited", "policy": policy})))
                .into_response();
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
            r
        }
        Err(e @ LookupError::Unavailable(_)) => {
            (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"error": e.to_string()}))).into_response()
        }
        Err(e @ LookupError::Malformed(_)) => {
            (StatusCode::BAD_GATEWAY, Json(json!({"error": e.to_string()}))).into_response()
        }
    })
}

fn found(key: &str, a: Answer) -> Response {
    let status = if a.entry.is_some() { StatusCode::OK } else { StatusCode::NOT_FOUND };
    let body =
        json!({"key": key, "found": a.entry.is_some(), "source": a.source, "age_ms": a.age_ms, "entry": a.entry});
    (status, Json(body)).into_response()
}
