//! Parked outbound requests (delivered more than `outbound.max_deliver` times
//! without being stored, or refused by the store): `GET /v1/parked?after=&limit=`
//! (a page of those still parked, oldest first), `GET /v1/parked/{ingress_ref}`
//! (one, with its body) — reads of payment data, `http.read_token` — and
//! `POST /v1/parked/{ingress_ref}/reprocess` (`http.admin_token`): parsed again with the bus ingress's rules — the deadline budget
//! counted from now — and stored like a fresh request; a second reprocess is
//! 409. All answer 503 when this pod runs no outbound side.

use std::time::SystemTime;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use cabine_actors::ports::outbound::{Inserted, Parked, ParkedPage, Unparked};
use cabine_actors::ports::outbound_bus::{Arrival, OutboundRequest};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::AppState;
use super::auth::Refusal;
use super::outbound::{MAX_PAGE, outbound_of};
use super::outbound_view::rfc3339;
use crate::outbound::ingress::{IngressRules, RawRequest, channel_of_subject, parse_request};

/// Bytes of a parked body shown by `GET /v1/parked/{ingress_ref}` (as text, lossy).
const MAX_SHOWN_BODY: usize = 64 * 1024;

#[derive(Debug, Serialize)]
pub struct ParkedView {
    pub id: i64,
    pub ingress_ref: Option<String>,
    pub subject: String,
    pub headers: Vec<(String, String)>,
    pub deliveries: u32,
    pub reason: String,
    pub state: &'static str,
    pub parked_at: String,
    pub reprocessed_at: Option<String>,
    pub outbound_msg_id: Option<String>,
    pub raw_bytes: usize,
    /// The body as text (invalid UTF-8 replaced), cut at 64 KiB; detail only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
}

impl ParkedView {
    fn of(p: Parked, with_body: bool) -> Self {
        let body = with_body
            .then(|| String::from_utf8_lossy(&p.arrival.raw[..p.arrival.raw.len().min(MAX_SHOWN_BODY)]).into_owned());
        ParkedView {
            id: p.id,
            raw_bytes: p.arrival.raw.len(),
            ingress_ref: p.arrival.ingress_ref,
            subject: p.arrival.subject,
            headers: p.arrival.headers,
            deliveries: p.arrival.deliveries,
            reason: p.reason,
            state: p.state.as_str(),
            parked_at: rfc3339(p.parked_at),
            reprocessed_at: p.reprocessed_at.map(rfc3339),
            outbound_msg_id: p.outbound_msg_id,
            body,
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct PageQuery {
    after: Option<i64>,
    limit: Option<u32>,
}

pub async fn list(
    State(state): State<AppState>,
    Query(q): Query<PageQuery>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    state.access.read(&headers)?;
    let o = outbound_of(&state)?;
    let limit = q.limit.unwrap_or(100);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(Refusal::new(StatusCode::BAD_REQUEST, format!("limit is 1..={MAX_PAGE}, got {limit}")));
    }
    let ParkedPage { rows, next_after } = o.stored(o.store.parked(q.after, limit)).await?;
    let rows: Vec<ParkedView> = rows.into_iter().map(|p| ParkedView::of(p, false)).collect();
    Ok(Json(json!({ "rows": rows, "next": next_after })).into_response())
}

fn unknown(ingress_ref: &str) -> Refusal {
    Refusal::new(StatusCode::NOT_FOUND, format!("no parked request {ingress_ref:?}"))
}

pub async fn detail(
    State(state): State<AppState>,
    Path(ingress_ref): Path<String>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    state.access.read(&headers)?;
    let o = outbound_of(&state)?;
    let parked = o.stored(o.store.parked_request(&ingress_ref)).await?.ok_or_else(|| unknown(&ingress_ref))?;
    Ok(Json(ParkedView::of(parked, true)).into_response())
}

pub async fn reprocess(
    State(state): State<AppState>,
    Path(ingress_ref): Path<String>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    state.access.admin(&headers)?;
    let o = outbound_of(&state)?;
    let parked = o.stored(o.store.parked_request(&ingress_ref)).await?.ok_or_else(|| unknown(&ingress_ref))?;
    let request = parse_again(&parked.arrival, &o.rules);
    let inserted = match o.stored(o.store.unpark(&ingress_ref, &request)).await? {
        Unparked::Stored(inserted) => inserted,
        Unparked::NotFound => return Err(unknown(&ingress_ref)),
        Unparked::AlreadyReprocessed => {
            let why = format!("{ingress_ref} was reprocessed already");
            let body = json!({ "error": why, "ingress_ref": ingress_ref, "state": "reprocessed" });
            return Ok((StatusCode::CONFLICT, Json(body)).into_response());
        }
    };
    tracing::warn!(ingress_ref, "operator reprocess of a parked request");
    let body = match inserted {
        Inserted::New { event } => {
            let published = matches!(o.bounded(o.results.publish(std::slice::from_ref(&event))).await, Some(Ok(_)));
            json!({ "ingress_ref": ingress_ref, "msg_id": event.msg_id, "status": event.status,
                    "duplicate": false, "event_published": published })
        }
        Inserted::Duplicate { row, .. } => {
            json!({ "ingress_ref": ingress_ref, "msg_id": row.msg_id, "status": row.status, "duplicate": true })
        }
    };
    Ok((StatusCode::OK, Json(body)).into_response())
}

/// The parked bus message through the ingress's parser again, its deadline
/// budget counted from now (it was published long ago).
pub fn parse_again(arrival: &Arrival, rules: &IngressRules) -> OutboundRequest {
    let header = |name: &str| arrival.header(name);
    let raw = RawRequest {
        channel: channel_of_subject(&arrival.subject, rules),
        header: &header,
        body: arrival.raw.clone(),
        ingress_ref: arrival.ingress_ref.clone(),
        published: SystemTime::now(),
    };
    parse_request(raw, rules)
}
