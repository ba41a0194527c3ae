//! From an ICOM response (status, headers, capped body) to the typed outcome
//! of the operation. Pure functions, so every status code is unit-tested.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode, header};

use cabine_actors::ports::{CloseOutcome, PollOutcome};

use super::headers::{PULL_NEXT, RESOURCE_ID};
use super::inbound::{self, BodyHead};
use super::limits::{WireError, WireLimits};
use super::problem::Problem;

/// Outcome of a send (`POST /api/v1/in/{ispb}/msgs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendOutcome {
    /// 201: stored; one resource id per message, in order (`PI-ResourceId: id1,id2,…`).
    Accepted { resource_ids: Vec<String> },
    /// 429 with an optional `Retry-After`: nothing stored, retry later.
    RateLimited { retry_after: Option<Duration> },
    /// Another 4xx: nothing stored; do not resend unchanged.
    Rejected { status: u16, problem: Option<Problem> },
    /// 5xx: maybe stored, resend (the MsgId guards against duplicates).
    ServerError { status: u16 },
    /// No complete response in `send_timeout`: maybe stored.
    Timeout,
    /// No response at all (refused, reset, TLS, framing): maybe stored.
    Transport(String),
}

/// A whole response as the client read it.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// At most the wire cap (`WireLimits::max_wire_bytes`) of the body.
    pub body: Bytes,
    /// The body was longer than the cap: `body` holds its first bytes only.
    pub over_limit: bool,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn retry_after(&self) -> Option<Duration> {
        let secs: f64 = self.header(header::RETRY_AFTER.as_str())?.trim().parse().ok()?;
        Duration::try_from_secs_f64(secs.min(3600.0)).ok()
    }

    /// The RFC 7807 problem in the body, if it is one.
    pub fn problem(&self) -> Option<Problem> {
        Problem::parse(&self.body).ok()
    }
}

/// Which stream operation a reply answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamOp {
    Start,
    Next,
}

/// 200 → batch, 204 → empty, 429 → too many streams (start) / rate limited
/// (next), 404/410 → unknown stream (next), 5xx → server error, else rejected.
/// A 200 whose framing is fine (PI-Pull-Next) but whose body breaks a limit or
/// cannot be read is still a batch: one malformed message, so it is persisted
/// and acknowledged instead of wedging the stream.
pub fn poll_outcome(op: StreamOp, reply: Reply, limits: &WireLimits) -> PollOutcome {
    let status = reply.status.as_u16();
    match status {
        200 | 204 => stream_reply(reply, limits).unwrap_or_else(|e| PollOutcome::Transport(e.to_string())),
        429 if op == StreamOp::Start => PollOutcome::TooManyStreams,
        429 => PollOutcome::RateLimited { retry_after: reply.retry_after() },
        404 | 410 if op == StreamOp::Next => PollOutcome::UnknownStream,
        500..=599 => PollOutcome::ServerError { status },
        _ => PollOutcome::Rejected {
            status,
            problem: reply.problem().map(|_| String::from_utf8_lossy(&reply.body).into()),
        },
    }
}

fn stream_reply(reply: Reply, limits: &WireLimits) -> Result<PollOutcome, WireError> {
    let pull_next = reply
        .header(PULL_NEXT)
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .ok_or_else(|| WireError::Multipart("response without PI-Pull-Next".into()))?;
    if pull_next.len() > limits.max_header_bytes {
        return Err(WireError::HeaderTooLong { max: limits.max_header_bytes }.counted());
    }
    let pull_next = pull_next.to_owned();
    if reply.status == StatusCode::NO_CONTENT {
        return Ok(PollOutcome::Empty { pull_next });
    }
    let head = BodyHead {
        content_type: reply.header(header::CONTENT_TYPE.as_str()),
        content_encoding: reply.header(header::CONTENT_ENCODING.as_str()),
        resource_id: reply.header(RESOURCE_ID),
    };
    let batch = if reply.over_limit {
        let e = WireError::BodyTooLarge { max: limits.max_wire_bytes() };
        vec![inbound::unreadable(head, reply.body.clone(), &e, limits)]
    } else {
        inbound::read_batch(head, reply.body.clone(), limits)
    };
    Ok(PollOutcome::Messages { batch, pull_next })
}

/// 2xx or 410 (already gone) → closed; anything else → failed.
pub fn close_outcome(reply: &Reply) -> CloseOutcome {
    match reply.status.as_u16() {
        200..=299 | 410 => CloseOutcome::Closed,
        status => CloseOutcome::Failed(match reply.problem() {
            Some(p) => format!("status {status}: {}", p.summary()),
            None => format!("status {status}"),
        }),
    }
}

/// 2xx → accepted with the resource ids, 429 → rate limited, 5xx → server error, else rejected.
pub fn send_outcome(reply: &Reply) -> SendOutcome {
    let status = reply.status.as_u16();
    match status {
        200..=299 => SendOutcome::Accepted {
            resource_ids: reply
                .header(RESOURCE_ID)
                .unwrap_or("")
                .split(',')
                .map(str::trim)
                .filter(|id| !id.is_empty())
                .map(str::to_owned)
                .collect(),
        },
        429 => SendOutcome::RateLimited { retry_after: reply.retry_after() },
        500..=599 => SendOutcome::ServerError { status },
        _ => SendOutcome::Rejected { status, problem: reply.problem() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn reply(status: u16, headers: &[(&'static str, &str)], body: &'static [u8]) -> Reply {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        Reply {
            status: StatusCode::from_u16(status).unwrap(),
            headers: map,
            body: Bytes::from_static(body),
            over_limit: false,
        }
    }

    const PROBLEM: &[u8] = b"<problem xmlns=\"urn:ietf:rfc:7807\"><type>x/error/invalidHeader</type></problem>";
    const NEXT: (&str, &str) = ("pi-pull-next", "/api/v1/out/99999010/stream/abc");

    #[test]
    fn stream_statuses() {
        let l = WireLimits::ICOM;
        let empty = PollOutcome::Empty { pull_next: NEXT.1.into() };
        assert_eq!(poll_outcome(StreamOp::Start, reply(204, &[NEXT], b""), &l), empty);
        assert!(matches!(poll_outcome(StreamOp::Next, reply(204, &[], b""), &l), PollOutcome::Transport(_)));
        assert_eq!(poll_outcome(StreamOp::Start, reply(429, &[], b""), &l), PollOutcome::TooManyStreams);
        assert_eq!(
            poll_outcome(StreamOp::Next, reply(429, &[("retry-after", "2")], b""), &l),
            PollOutcome::RateLimited { retry_after: Some(Duration::from_secs(2)) }
        );
        assert_eq!(poll_outcome(StreamOp::Next, reply(404, &[], b""), &l), PollOutcome::UnknownStream);
        assert_eq!(poll_outcome(StreamOp::Next, reply(410, &[], b""), &l), PollOutcome::UnknownStream);
        assert_eq!(poll_outcome(StreamOp::Start, reply(503, &[], b""), &l), PollOutcome::ServerError { status: 503 });
        assert_eq!(
            poll_outcome(StreamOp::Start, reply(400, &[], PROBLEM), &l),
            PollOutcome::Rejected { status: 400, problem: Some(String::from_utf8(PROBLEM.to_vec()).unwrap()) }
        );
        assert_eq!(
            poll_outcome(StreamOp::Start, reply(404, &[], b"<html/>"), &l),
            PollOutcome::Rejected { status: 404, problem: None }
        );
    }

    #[test]
    fn a_single_message_takes_the_response_resource_id() {
        let got = poll_outcome(
            StreamOp::Next,
            reply(200, &[NEXT, ("content-type", "application/xml; charset=utf-8"), ("pi-resourceid", "R9")], b"<x"),
            &WireLimits::ICOM,
        );
        let PollOutcome::Messages { batch, pull_next } = got else { panic!("{got:?}") };
        assert_eq!((pull_next.as_str(), batch.len(), batch[0].resource_id.as_str()), (NEXT.1, 1, "R9"));
        assert!(batch[0].malformed.is_some(), "unparseable XML is kept, marked malformed");
        assert_eq!(&batch[0].raw[..], b"<x");
        let no_id = poll_outcome(StreamOp::Next, reply(200, &[NEXT], b"<x/>"), &WireLimits::ICOM);
        let PollOutcome::Messages { batch, .. } = no_id else { panic!("{no_id:?}") };
        assert_eq!(batch[0].resource_id, "", "the inbox keys it by content");
        assert!(batch[0].malformed.as_deref().is_some_and(|r| r.contains("PI-ResourceId")));
    }

    #[test]
    fn a_body_over_the_limit_is_one_malformed_message_not_a_transport_failure() {
        let small = WireLimits { max_body_bytes: 8, ..WireLimits::ICOM };
        let mut big = reply(200, &[NEXT, ("pi-resourceid", "R7")], b"<Envelope>too long</Envelope>");
        let got = poll_outcome(StreamOp::Next, reply(200, &[NEXT, ("pi-resourceid", "R7")], b"<Envelope>x"), &small);
        let PollOutcome::Messages { batch, pull_next } = got else { panic!("{got:?}") };
        assert_eq!((batch.len(), batch[0].resource_id.as_str(), pull_next.as_str()), (1, "R7", NEXT.1));
        assert!(batch[0].malformed.as_deref().is_some_and(|r| r.contains("max_body_bytes")), "{batch:?}");
        big.over_limit = true;
        let got = poll_outcome(StreamOp::Next, big, &WireLimits::ICOM);
        let PollOutcome::Messages { batch, .. } = got else { panic!("{got:?}") };
        assert_eq!(&batch[0].raw[..], b"<Envelope>too long</Envelope>", "the bytes read are kept");
        assert!(batch[0].malformed.as_deref().is_some_and(|r| r.contains("max_body_bytes")));
    }

    #[test]
    fn close_statuses() {
        assert_eq!(close_outcome(&reply(200, &[], b"")), CloseOutcome::Closed);
        assert_eq!(close_outcome(&reply(410, &[], b"")), CloseOutcome::Closed);
        assert_eq!(close_outcome(&reply(404, &[], b"")), CloseOutcome::Failed("status 404".into()));
    }

    #[test]
    fn send_statuses() {
        assert_eq!(
            send_outcome(&reply(201, &[("pi-resourceid", "a1, b2,c3")], b"")),
            SendOutcome::Accepted { resource_ids: vec!["a1".into(), "b2".into(), "c3".into()] }
        );
        assert_eq!(
            send_outcome(&reply(429, &[("retry-after", "0.5")], b"")),
            SendOutcome::RateLimited { retry_after: Some(Duration::from_millis(500)) }
        );
        assert_eq!(
            send_outcome(&reply(429, &[("retry-after", "soon")], b"")),
            SendOutcome::RateLimited { retry_after: None }
        );
        assert_eq!(send_outcome(&reply(502, &[], b"")), SendOutcome::ServerError { status: 502 });
        let SendOutcome::Rejected { status: 400, problem: Some(p) } = send_outcome(&reply(400, &[], PROBLEM)) else {
            panic!("a 400 with a problem body")
        };
        assert_eq!(p.kind.as_deref(), Some("x/error/invalidHeader"));
        assert_eq!(send_outcome(&reply(413, &[], b"")), SendOutcome::Rejected { status: 413, problem: None });
    }
}
