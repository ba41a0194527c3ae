//! `POST /api/v1/in/{ispb}/msgs`: validate and split the body, charge the token
//! bucket, then store each message — 201 with the comma-separated
//! PI-ResourceIds — and queue what the SPI answers on the sender's stream: a
//! pacs.002 (ACSP) per EndToEndId of an accepted pacs.008 (each booked as a
//! debit of the sender's settlement account), the statement pages answering a
//! camt.060, an admi.002 for a duplicate MsgId or an unreadable message.
//! With `lose_replies` (a 5xx after storing, the `lose_replies` fault) the
//! messages are stored and booked but nothing is queued: only a
//! reconciliation can tell.

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;

use super::audit::{OutboundOutcome, OutboundRecord};
use super::body::{self, BodyError, BodyLimits};
use super::bucket::{cost_of, retry_after_secs};
use super::clock::unix_millis;
use super::envelope::{self, Envelope};
use super::generator::{Draft, Generator, RejectReason};
use super::lane::Lane;
use super::problem::{self, Problem};
use super::settlement::{Direction, Statement, requested_window};
use super::state::Shared;
use super::streams::Message;

pub async fn handle(req: Request<Incoming>, lane: &Lane, shared: &Shared, lose_replies: bool) -> Response<Full<Bytes>> {
    let limits = BodyLimits { max_body_bytes: shared.cfg.max_body_bytes, max_parts: shared.cfg.max_parts };
    let parts = match read_messages(req, limits).await {
        Ok(parts) => parts,
        Err(e) => {
            lane.counters.refused_sends.add(1);
            return problem::respond(e.status(), e.problem(), &e.to_string());
        }
    };
    let envelopes: Vec<Result<Envelope, String>> = parts.iter().map(|p| envelope::read(p)).collect();
    let cost: f64 = envelopes.iter().map(|e| cost_of(e.as_ref().ok().map(|e| e.msg_def.as_str()))).sum();
    let now = shared.now();
    let rate = shared.cfg.buckets.for_channel(lane.channel, now);
    let charged = lane.bucket.lock().unwrap_or_else(std::sync::PoisonError::into_inner).try_take(cost, rate, now);
    if let Err(wait) = charged {
        lane.counters.rejected_rate.add(1);
        lane.counters.rejected_429.add(1);
        let mut response = problem::respond(
            StatusCode::TOO_MANY_REQUESTS,
            Problem::RateLimited,
            &format!("the operation bucket lacks {cost} tokens"),
        );
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs(wait)));
        return response;
    }
    let reply_room: usize = envelopes.iter().map(|e| e.as_ref().map_or(1, |e| e.end_to_end_ids.len().max(1))).sum();
    if lane.queued() + reply_room > shared.cfg.max_queue {
        lane.counters.refused_sends.add(1);
        return problem::respond(
            StatusCode::SERVICE_UNAVAILABLE,
            Problem::ServiceUnavailable,
            "the participant's queue is full",
        );
    }
    let ids = store(lane, shared, parts, envelopes, lose_replies);
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::CREATED;
    if let Ok(v) = HeaderValue::from_str(&ids.join(",")) {
        response.headers_mut().insert("pi-resourceid", v);
    }
    response
}

async fn read_messages(req: Request<Incoming>, limits: BodyLimits) -> Result<Vec<Bytes>, BodyError> {
    let framing = body::framing(req.headers(), limits)?;
    let raw = body::collect(req.into_body(), limits).await?;
    body::messages(raw, &framing, limits).await
}

/// Stores every message of an accepted request and queues the SPI's answers. Returns the ResourceIds.
fn store(
    lane: &Lane,
    shared: &Shared,
    parts: Vec<Bytes>,
    envelopes: Vec<Result<Envelope, String>>,
    lose_replies: bool,
) -> Vec<String> {
    let now = shared.now();
    let mut ids = Vec::with_capacity(parts.len());
    let mut replies = Vec::new();
    for (raw, env) in parts.into_iter().zip(envelopes) {
        let resource_id = shared.next_resource_id();
        ids.push(resource_id.to_string());
        lane.counters.received_outbound.add(1);
        let mut record = OutboundRecord {
            seq: 0,
            ispb: lane.ispb.clone(),
            channel: lane.channel.as_str(),
            resource_id: resource_id.clone(),
            received_at_ms: unix_millis(now),
            outcome: OutboundOutcome::Accepted,
            msg_def: None,
            biz_msg_id: None,
            msg_id: None,
            end_to_end_ids: Vec::new(),
            from: None,
            reason: None,
            body: raw.clone(),
        };
        let mut generator = shared.generator();
        match env {
            Err(reason) => {
                lane.counters.malformed_outbound.add(1);
                record.outcome = OutboundOutcome::Malformed;
                record.reason = Some(reason);
                replies.push(generator.reject(&lane.ispb, &resource_id, RejectReason::Malformed, now));
            }
            Ok(env) => {
                if !shared.admit_msg_id(&lane.ispb, env.dedup_id()) {
                    lane.counters.duplicates_outbound.add(1);
                    record.outcome = OutboundOutcome::Duplicate;
                    replies.push(generator.reject(&lane.ispb, env.dedup_id(), RejectReason::Duplicate, now));
                } else if env.is_credit_transfer() {
                    for (i, e2e) in env.end_to_end_ids.iter().enumerate() {
                        let amount = env.amounts.get(i).cloned().unwrap_or_default();
                        shared.settle(&lane.ispb, Direction::Debit, e2e, env.dedup_id(), amount);
                        replies.push(generator.acceptance(&lane.ispb, env.dedup_id(), e2e, now));
                    }
                } else if env.is_reporting_request() {
                    replies.extend(statement(lane, shared, &mut generator, &raw, &env, now));
                }
                record.msg_def = Some(env.msg_def);
                record.biz_msg_id = Some(env.biz_msg_id);
                record.msg_id = env.msg_id;
                record.end_to_end_ids = env.end_to_end_ids;
                record.from = env.from;
            }
        }
        drop(generator);
        shared.record_outbound(record);
    }
    if lose_replies {
        replies.clear();
    }
    lane.counters.replies.add(replies.len() as u64);
    lane.enqueue(replies.into_iter().map(|draft| Message::new(shared.next_resource_id(), draft)).collect());
    ids
}

/// The statement pages answering a camt.060 (an admi.002 when its window cannot be read).
fn statement(
    lane: &Lane,
    shared: &Shared,
    generator: &mut Generator,
    raw: &[u8],
    env: &Envelope,
    now: std::time::SystemTime,
) -> Vec<Draft> {
    let (from, to) = match requested_window(raw) {
        Ok(window) => window,
        Err(_) => return vec![generator.reject(&lane.ispb, env.dedup_id(), RejectReason::Malformed, now)],
    };
    let st = Statement { ispb: &lane.ispb, request_msg_id: env.dedup_id(), from, to, now };
    let entries = st.select(shared.settlements().iter());
    st.pages(&entries, || generator.message_id()).into_iter().map(Draft::Raw).collect()
}
