//! `POST /v1/outbound?channel=cpm` (bearer): one ISO 20022 message from an
//! operator, checked with the bus ingress's own parser and then published on
//! the outbound work-queue subject exactly as the bank's core would (same
//! headers, `Nats-Msg-Id` = MsgId, both awaits). 202 once JetStream holds it;
//! 400 with the reason when it is invalid (nothing published: the caller still
//! holds it); 413 beyond `outbound.max_message_bytes`; 503 when NATS does not
//! acknowledge it.
//!
//! A MsgId is accepted once (invariant 3): the same body again is an
//! idempotent 202 (`duplicate: true`); a different body under a MsgId already
//! stored — or already on the bus, which JetStream would silently drop as a
//! duplicate — is 409 with that MsgId's status, and never goes out.

use std::time::SystemTime;

use async_nats::jetstream::publish::PublishAck;
use async_nats::jetstream::stream::RawMessageErrorKind;
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use cabine_actors::ports::outbound::NewOutbound;
use cabine_actors::ports::outbound_bus::OutboundRequest;
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::auth::Refusal;
use super::outbound::{OutboundOperator, outbound_of};
use crate::outbound::ingress::{
    DEADLINE_CLASS_HEADER, DEADLINE_HEADER, PRIORITY_HEADER, RawRequest, enabled_channel, parse_request,
};

/// The request headers carried over to the bus.
const CARRIED: [&str; 3] = [PRIORITY_HEADER, DEADLINE_HEADER, DEADLINE_CLASS_HEADER];

#[derive(Debug, Deserialize)]
pub struct SendQuery {
    channel: Option<String>,
}

pub async fn send(
    State(state): State<AppState>,
    query: Result<Query<SendQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Refusal> {
    state.access.admin(&headers)?;
    let o = outbound_of(&state)?;
    let body = body.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => {
            let max = o.rules.max_message_bytes;
            Refusal::new(e.status(), format!("the body exceeds outbound.max_message_bytes ({max})"))
        }
        status => Refusal::new(status, e.body_text()),
    })?;
    let channel = match query {
        Ok(Query(SendQuery { channel: Some(name) })) => enabled_channel(&name, &o.rules),
        Ok(_) => Err("the query parameter channel is required (?channel=cpm)".to_owned()),
        Err(e) => Err(e.body_text()),
    };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let raw = RawRequest { channel, header: &header, body, ingress_ref: None, published: SystemTime::now() };
    match parse_request(raw, &o.rules) {
        OutboundRequest::Valid(message) => match stored_as(o, &message).await? {
            Stored::Other => conflict(o, &message.msg_id).await,
            stored => publish(o, &headers, message, stored == Stored::Same).await,
        },
        OutboundRequest::Invalid(invalid) => {
            let body = json!({ "error": invalid.reason, "claimed_msg_id": invalid.claimed_msg_id });
            Ok((StatusCode::BAD_REQUEST, Json(body)).into_response())
        }
    }
}

/// What the store holds under a request's MsgId.
#[derive(Debug, PartialEq, Eq)]
enum Stored {
    Nothing,
    Same,
    Other,
}

async fn stored_as(o: &OutboundOperator, message: &NewOutbound) -> Result<Stored, Refusal> {
    Ok(match o.stored(o.store.stored_body(&message.msg_id)).await? {
        None => Stored::Nothing,
        Some(body) if body == message.raw => Stored::Same,
        Some(_) => Stored::Other,
    })
}

/// 409: `msg_id` is taken by another body; its status (`null` while the first
/// copy still waits on the bus). Nothing was published.
async fn conflict(o: &OutboundOperator, msg_id: &str) -> Result<Response, Refusal> {
    let status = o.stored(o.store.get(msg_id)).await?.map(|d| d.row.status);
    tracing::warn!(msg_id, "operator outbound request refused: its MsgId is taken by a different body");
    let error = format!("{msg_id} already carries a different message: not sent; use a new MsgId");
    Ok((StatusCode::CONFLICT, Json(json!({ "error": error, "msg_id": msg_id, "status": status }))).into_response())
}

/// The body JetStream kept for a duplicate publish: still on the stream at
/// `sequence`, else (taken and stored since) in the store. `None`: neither
/// holds it any more.
async fn first_copy(o: &OutboundOperator, stream: &str, sequence: u64, msg_id: &str) -> Result<Option<Bytes>, Refusal> {
    let unavailable = |e: String| Refusal::new(StatusCode::SERVICE_UNAVAILABLE, e);
    let read = o
        .bounded(async {
            let stream = o.bus.get_stream_no_info(stream).await.map_err(|e| e.to_string())?;
            match stream.get_raw_message(sequence).await {
                Ok(m) => Ok(Some(m.payload)),
                Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
                Err(e) => Err(e.to_string()),
            }
        })
        .await
        .ok_or_else(|| unavailable(format!("the first copy of {msg_id}: no answer within {:?}", o.timeout)))?;
    match read.map_err(|e| unavailable(format!("the first copy of {msg_id}: {e}")))? {
        Some(body) => Ok(Some(body)),
        None => o.stored(o.store.stored_body(msg_id)).await,
    }
}

/// Publishes on `{prefix}.out.{ispb}.{channel}` and waits for the PubAck; a
/// duplicate PubAck is checked against the copy JetStream kept.
async fn publish(
    o: &OutboundOperator,
    headers: &HeaderMap,
    message: NewOutbound,
    stored: bool,
) -> Result<Response, Refusal> {
    let mut carried = async_nats::HeaderMap::new();
    for name in CARRIED {
        if let Some(value) = headers.get(name).and_then(|v| v.to_str().ok()) {
            carried.insert(name, value);
        }
    }
    carried.insert(async_nats::header::NATS_MESSAGE_ID, message.msg_id.as_str());
    let subject = o.subjects.outbound(message.channel.as_str());
    let acked = o
        .bounded(async {
            let ack = o.bus.publish_with_headers(subject, carried, message.raw.clone()).await?;
            ack.await
        })
        .await;
    match acked {
        Some(Ok(ack)) if ack.duplicate => match first_copy(o, &ack.stream, ack.sequence, &message.msg_id).await? {
            Some(first) if first == message.raw => Ok(accepted(&message, &ack, true)),
            _ => conflict(o, &message.msg_id).await,
        },
        Some(Ok(ack)) => Ok(accepted(&message, &ack, stored)),
        Some(Err(e)) => Err(Refusal::new(StatusCode::SERVICE_UNAVAILABLE, format!("not published on the bus: {e}"))),
        None => Err(Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not published on the bus: no PubAck within {:?}", o.timeout),
        )),
    }
}

/// 202: JetStream holds it (or already held this very message: `duplicate`).
fn accepted(message: &NewOutbound, ack: &PublishAck, duplicate: bool) -> Response {
    tracing::info!(msg_id = %message.msg_id, duplicate, "operator outbound request published");
    let body = json!({
        "msg_id": message.msg_id,
        "channel": message.channel,
        "status_url": format!("/v1/outbound/{}", message.msg_id),
        "duplicate": duplicate,
        "stream": ack.stream,
        "sequence": ack.sequence,
    });
    (StatusCode::ACCEPTED, Json(body)).into_response()
}
