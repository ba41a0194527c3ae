//! `POST /v1/outbound?channel=cpm` (bearer): one ISO 20022 message from an
//! operator, checked with the bus ingress's own parser and then published on
//! the outbound work-queue subject exactly as the bank's core would (same
//! headers, `Nats-Msg-Id` = MsgId, both awaits). 202 once JetStream holds it;
//! 400 with the reason when it is invalid (nothing published: the caller still
//! holds it); 413 beyond `outbound.max_message_bytes`; 503 when NATS does not
//! acknowledge it.

use std::time::SystemTime;

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
use super::auth::{Refusal, require_bearer};
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
    let (operator, o) = outbound_of(&state)?;
    require_bearer(&headers, operator.admin_token.expose())?;
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
        OutboundRequest::Valid(message) => publish(o, &headers, message).await,
        OutboundRequest::Invalid(invalid) => {
            let body = json!({ "error": invalid.reason, "claimed_msg_id": invalid.claimed_msg_id });
            Ok((StatusCode::BAD_REQUEST, Json(body)).into_response())
        }
    }
}

/// Publishes on `{prefix}.out.{ispb}.{channel}` and waits for the PubAck.
async fn publish(o: &OutboundOperator, headers: &HeaderMap, message: NewOutbound) -> Result<Response, Refusal> {
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
        Some(Ok(ack)) => {
            tracing::info!(msg_id = %message.msg_id, duplicate = ack.duplicate, "operator outbound request published");
            let body = json!({
                "msg_id": message.msg_id,
                "channel": message.channel,
                "status_url": format!("/v1/outbound/{}", message.msg_id),
                "duplicate": ack.duplicate,
                "stream": ack.stream,
                "sequence": ack.sequence,
            });
            Ok((StatusCode::ACCEPTED, Json(body)).into_response())
        }
        Some(Err(e)) => Err(Refusal::new(StatusCode::SERVICE_UNAVAILABLE, format!("not published on the bus: {e}"))),
        None => Err(Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not published on the bus: no PubAck within {:?}", o.timeout),
        )),
    }
}
