//! The ICOM endpoints of one channel's listener, request by request: route,
//! authorisation (configured ISPB, client certificate CN), the in-flight cap,
//! faults, the header whitelist and the Host rule, then streams or sends.
//! Stream responses are framed here (multipart/mixed or one message, gzip).

use std::io::Write;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use cabine_actors::domain::ChannelId;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::faults::FaultAction;
use super::headers::{self, HostCheck};
use super::lane::{Lane, ReadOutcome, ReadRules};
use super::problem::{self, Problem};
use super::sends;
use super::state::Shared;
use super::streams::Message;

/// What one TCP connection knows about itself.
pub struct ConnCtx {
    pub shared: Arc<Shared>,
    pub channel: ChannelId,
    /// Subject CN of the client certificate (mTLS).
    pub peer_cn: Option<String>,
    /// The lane the connection is counted against (set once: at accept, or at its first request).
    lane: OnceLock<Arc<Lane>>,
    /// Signalled by a reset fault: the connection task drops the socket with an RST.
    pub reset: Notify,
    /// The simulator's shutdown: ends the handling of every request, held or not.
    cancel: CancellationToken,
}

impl ConnCtx {
    pub fn new(shared: Arc<Shared>, channel: ChannelId, peer_cn: Option<String>, cancel: CancellationToken) -> Self {
        ConnCtx { shared, channel, peer_cn, lane: OnceLock::new(), reset: Notify::new(), cancel }
    }

    /// Counts this connection against `lane`, once.
    pub fn attribute(&self, lane: &Arc<Lane>) {
        if self.lane.set(lane.clone()).is_ok() {
            lane.counters.tcp_connections.enter();
        }
    }

    /// The connection ended.
    pub fn closed(&self) {
        if let Some(lane) = self.lane.get() {
            lane.counters.tcp_connections.leave();
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Endpoint<'a> {
    Start,
    Pull(&'a str),
    Send,
}

/// `(ispb, endpoint)` of an ICOM path.
fn route(path: &str) -> Option<(&str, Endpoint<'_>)> {
    let rest = path.strip_prefix("/api/v1/")?;
    if let Some(out) = rest.strip_prefix("out/") {
        let (ispb, tail) = out.split_once('/')?;
        let token = tail.strip_prefix("stream/")?;
        if token.is_empty() || token.contains('/') {
            return None;
        }
        return Some((ispb, if token == "start" { Endpoint::Start } else { Endpoint::Pull(token) }));
    }
    let (ispb, tail) = rest.strip_prefix("in/")?.split_once('/')?;
    (tail == "msgs").then_some((ispb, Endpoint::Send))
}

/// Counts a request in flight on its lane until dropped.
struct InFlight<'a> {
    lane: &'a Lane,
    send: bool,
}

impl<'a> InFlight<'a> {
    /// Enters and returns the count the cap applies to.
    fn enter(lane: &'a Lane, send: bool, separate: bool) -> (Self, u64) {
        let total = lane.counters.in_flight.enter();
        let own = if send { lane.counters.in_flight_sends.enter() } else { lane.counters.in_flight_streams.enter() };
        (InFlight { lane, send }, if separate { own } else { total })
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.lane.counters.in_flight.leave();
        if self.send {
            self.lane.counters.in_flight_sends.leave()
        } else {
            self.lane.counters.in_flight_streams.leave()
        }
    }
}

/// How the handling of one request ended.
enum Handled {
    Answer(Response<Full<Bytes>>),
    /// A reset fault fired: the connection goes with an RST, nothing is answered.
    Reset,
}

impl From<Response<Full<Bytes>>> for Handled {
    fn from(response: Response<Full<Bytes>>) -> Self {
        Handled::Answer(response)
    }
}

/// The service of an ICOM listener. Each request is handled in a task of its own that runs to its
/// end whether or not the client is still there, as on a real server: a client that goes away
/// (hyper then drops this future) drops only the wait for the answer, never the work — an
/// abandoned GET stays held, counted in flight and able to be handed a batch; an abandoned POST
/// whose body arrived is still stored. Only the simulator's shutdown ends the work early.
pub async fn serve(req: Request<Incoming>, ctx: Arc<ConnCtx>) -> Response<Full<Bytes>> {
    let work = ctx.shared.requests.spawn(detached(req, ctx.clone()));
    match work.await {
        Ok(Handled::Answer(response)) => response,
        Ok(Handled::Reset) => {
            ctx.reset.notify_one();
            std::future::pending().await
        }
        Err(e) => problem::respond(StatusCode::INTERNAL_SERVER_ERROR, Problem::ServerError, &e.to_string()),
    }
}

/// One request's handling, until it ends or the simulator stops.
async fn detached(req: Request<Incoming>, ctx: Arc<ConnCtx>) -> Handled {
    tokio::select! {
        handled = handle(req, &ctx) => handled,
        _ = ctx.cancel.cancelled() => {
            problem::respond(StatusCode::SERVICE_UNAVAILABLE, Problem::ServiceUnavailable, "the simulator is stopping")
                .into()
        }
    }
}

async fn handle(req: Request<Incoming>, ctx: &ConnCtx) -> Handled {
    let shared = ctx.shared.clone();
    let close = shared.faults(ctx.channel).close_after_response;
    let mut handled = dispatch(req, ctx, &shared).await;
    if let (true, Handled::Answer(response)) = (close, &mut handled) {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    handled
}

async fn dispatch(req: Request<Incoming>, ctx: &ConnCtx, shared: &Shared) -> Handled {
    let path = req.uri().path().to_owned();
    let (lane, endpoint) = match admit(&path, ctx, shared) {
        Ok(admitted) => admitted,
        Err(refused) => return refused.answer().into(),
    };
    let send = endpoint == Endpoint::Send;
    if send {
        lane.counters.send_requests.add(1);
    }
    let (_in_flight, count) = InFlight::enter(lane, send, shared.cfg.sends_counted_separately);
    if count > shared.cfg.max_in_flight as u64 {
        return over_cap(lane, shared, count).into();
    }
    let store_then_fail = match fault(lane, ctx, shared, send).await {
        Ok(store_then_fail) => store_then_fail,
        Err(ended) => return ended,
    };
    if let Some(refusal) = header_refusal(&req, shared) {
        if send {
            lane.counters.refused_sends.add(1);
        }
        return refusal.into();
    }
    let response = match (endpoint, req.method()) {
        (Endpoint::Start, &Method::GET) => read(&req, lane, shared, ctx.channel, None).await,
        (Endpoint::Pull(token), &Method::GET) => read(&req, lane, shared, ctx.channel, Some(token)).await,
        (Endpoint::Pull(token), &Method::DELETE) => close(lane, token),
        (Endpoint::Send, &Method::POST) => {
            let lose_replies = store_then_fail.is_some() && shared.faults(ctx.channel).lose_replies;
            sends::handle(req, lane, shared, lose_replies).await
        }
        (_, method) => {
            let detail = format!("{method} is not allowed on {path}");
            problem::respond(StatusCode::METHOD_NOT_ALLOWED, Problem::MethodNotAllowed, &detail)
        }
    };
    match store_then_fail {
        Some(status) => problem::respond(status, Problem::ServerError, "fault injected after storing").into(),
        None => response.into(),
    }
}

/// A request refused before it counts in flight: what to answer.
struct Refused {
    status: StatusCode,
    problem: Problem,
    detail: String,
}

impl Refused {
    fn answer(&self) -> Response<Full<Bytes>> {
        problem::respond(self.status, self.problem, &self.detail)
    }
}

/// Route and authorisation: the lane and endpoint of the request, counted against its connection.
fn admit<'p, 's>(path: &'p str, ctx: &ConnCtx, shared: &'s Shared) -> Result<(&'s Arc<Lane>, Endpoint<'p>), Refused> {
    let Some((ispb, endpoint)) = route(path) else {
        let detail = format!("no ICOM endpoint at {path}");
        return Err(Refused { status: StatusCode::NOT_FOUND, problem: Problem::NotFound, detail });
    };
    let Some(lane) = shared.lane(ispb, ctx.channel) else {
        let detail = format!("ISPB {ispb} is not served here");
        return Err(Refused { status: StatusCode::FORBIDDEN, problem: Problem::Forbidden, detail });
    };
    if shared.tls && ctx.peer_cn.as_deref() != Some(ispb) {
        let detail = format!("the client certificate ({:?}) does not belong to ISPB {ispb}", ctx.peer_cn);
        return Err(Refused { status: StatusCode::FORBIDDEN, problem: Problem::Forbidden, detail });
    }
    ctx.attribute(lane);
    Ok((lane, endpoint))
}

/// One request more than the in-flight cap: 429 (or the configured 503).
fn over_cap(lane: &Lane, shared: &Shared, count: u64) -> Response<Full<Bytes>> {
    lane.counters.rejected_in_flight.add(1);
    let status = shared.cfg.over_in_flight_status;
    if status == StatusCode::TOO_MANY_REQUESTS {
        lane.counters.rejected_429.add(1);
    }
    let detail = format!("{count} simultaneous requests exceed {}", shared.cfg.max_in_flight);
    problem::respond(status, Problem::TooManyRequests, &detail)
}

/// The channel's faults for one request: its latency, then an early end (reset, 429, 403, 5xx), or
/// go on — with the 5xx to answer after storing a send (`store_before_5xx`).
async fn fault(lane: &Lane, ctx: &ConnCtx, shared: &Shared, send: bool) -> Result<Option<StatusCode>, Handled> {
    let faults = shared.faults(ctx.channel);
    let roll = faults.roll(send);
    if roll.delay > Duration::ZERO {
        tokio::time::sleep(roll.delay).await;
    }
    match roll.action {
        FaultAction::None => Ok(None),
        FaultAction::Reset => {
            lane.counters.fault_resets.add(1);
            Err(Handled::Reset)
        }
        FaultAction::TooManyRequests => {
            lane.counters.fault_429.add(1);
            lane.counters.rejected_429.add(1);
            let mut r = problem::respond(StatusCode::TOO_MANY_REQUESTS, Problem::TooManyRequests, "fault injected");
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            Err(r.into())
        }
        FaultAction::Forbidden => {
            lane.counters.fault_4xx_sends.add(1);
            Err(problem::respond(StatusCode::FORBIDDEN, Problem::Forbidden, "fault injected: send refused").into())
        }
        FaultAction::ServerError(status) => {
            lane.counters.fault_5xx.add(1);
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            if faults.store_before_5xx && send {
                return Ok(Some(status));
            }
            Err(problem::respond(status, Problem::ServerError, "fault injected").into())
        }
    }
}

/// The whitelist and the Host rule.
fn header_refusal(req: &Request<Incoming>, shared: &Shared) -> Option<Response<Full<Bytes>>> {
    if let Some(name) = headers::first_forbidden(req.headers()) {
        let detail = format!("header {name} is not allowed");
        return Some(problem::respond(StatusCode::BAD_REQUEST, Problem::InvalidHeader, &detail));
    }
    if shared.cfg.strict_host {
        match headers::check_host(req.headers()) {
            HostCheck::Bare => {}
            HostCheck::WithPort => {
                return Some(problem::respond(StatusCode::BAD_REQUEST, Problem::HostWithPort, "Host carries a port"));
            }
            HostCheck::Missing => {
                return Some(problem::respond(StatusCode::BAD_REQUEST, Problem::HostWithPort, "Host is missing"));
            }
        }
    }
    None
}

async fn read(
    req: &Request<Incoming>,
    lane: &Lane,
    shared: &Shared,
    channel: ChannelId,
    token: Option<&str>,
) -> Response<Full<Bytes>> {
    let multipart = headers::lists(req.headers(), header::ACCEPT, "multipart/mixed");
    let gzip = headers::lists(req.headers(), header::ACCEPT_ENCODING, "gzip");
    let rules = ReadRules {
        max_messages: if multipart { shared.cfg.max_messages_per_read } else { 1 },
        hold: shared.faults(channel).hold(),
        max_streams: shared.cfg.max_streams,
    };
    match lane.read(token, rules).await {
        ReadOutcome::Batch { messages, pull_next } => {
            let mut r = batch(&messages, shared, multipart, gzip);
            set_pull_next(&mut r, lane, &pull_next);
            r
        }
        ReadOutcome::Empty { pull_next } => {
            let mut r = Response::new(Full::new(Bytes::new()));
            *r.status_mut() = StatusCode::NO_CONTENT;
            set_pull_next(&mut r, lane, &pull_next);
            r
        }
        ReadOutcome::TooManyStreams => {
            lane.counters.rejected_429.add(1);
            let detail = format!("{} streams are open already", shared.cfg.max_streams);
            problem::respond(StatusCode::TOO_MANY_REQUESTS, Problem::TooManyStreams, &detail)
        }
        ReadOutcome::UnknownToken => {
            problem::respond(StatusCode::NOT_FOUND, Problem::StreamNotFound, "no stream with this pull-next")
        }
    }
}

fn close(lane: &Lane, token: &str) -> Response<Full<Bytes>> {
    if lane.close(token) {
        Response::new(Full::new(Bytes::new()))
    } else {
        problem::respond(StatusCode::GONE, Problem::StreamGone, "no open stream with this pull-next")
    }
}

fn set_pull_next(response: &mut Response<Full<Bytes>>, lane: &Lane, token: &str) {
    let mut value = String::with_capacity(lane.pull_prefix.len() + token.len());
    value.push_str(&lane.pull_prefix);
    value.push_str(token);
    if let Ok(v) = HeaderValue::from_str(&value) {
        response.headers_mut().insert("pi-pull-next", v);
    }
}

const XML_UTF8: &str = "application/xml; charset=utf-8";

/// A 200 carrying a batch: multipart/mixed with a `PI-ResourceId` per part, or one message.
fn batch(messages: &[Message], shared: &Shared, multipart: bool, gzip: bool) -> Response<Full<Bytes>> {
    let rendered: Vec<Bytes> = messages.iter().map(|m| m.draft.render(&shared.templates)).collect();
    let (body, content_type) = if multipart {
        let b = &shared.boundary;
        let size: usize = rendered.iter().map(|r| r.len() + b.len() + 120).sum::<usize>() + b.len() + 8;
        let mut body = BytesMut::with_capacity(size);
        for (m, xml) in messages.iter().zip(&rendered) {
            body.put_slice(b"--");
            body.put_slice(b.as_bytes());
            body.put_slice(b"\r\nContent-Type: application/xml; charset=utf-8\r\nPI-ResourceId: ");
            body.put_slice(m.resource_id.as_bytes());
            body.put_slice(b"\r\n\r\n");
            body.put_slice(xml);
            body.put_slice(b"\r\n");
        }
        body.put_slice(b"--");
        body.put_slice(b.as_bytes());
        body.put_slice(b"--\r\n");
        (body.freeze(), format!("multipart/mixed; boundary={b}"))
    } else {
        (rendered.into_iter().next().unwrap_or_default(), XML_UTF8.to_owned())
    };
    let (body, gzipped) = match gzip.then(|| compress(&body)).flatten() {
        Some(z) => (z, true),
        None => (body, false),
    };
    let mut response = Response::new(Full::new(body));
    let h = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&content_type) {
        h.insert(header::CONTENT_TYPE, v);
    }
    if gzipped {
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    if !multipart && let Some(v) = messages.first().and_then(|m| HeaderValue::from_str(&m.resource_id).ok()) {
        h.insert("pi-resourceid", v);
    }
    response
}

fn compress(body: &[u8]) -> Option<Bytes> {
    let mut enc = flate2::write::GzEncoder::new(Vec::with_capacity(body.len() / 4 + 64), flate2::Compression::fast());
    enc.write_all(body).ok()?;
    enc.finish().ok().map(Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn icom_paths_route_to_their_endpoint() {
        assert_eq!(route("/api/v1/out/99999010/stream/start"), Some(("99999010", Endpoint::Start)));
        assert_eq!(route("/api/v1/out/99999010/stream/abc"), Some(("99999010", Endpoint::Pull("abc"))));
        assert_eq!(route("/api/v1/in/99999010/msgs"), Some(("99999010", Endpoint::Send)));
        for bad in [
            "/",
            "/api/v1/out/99999010/stream/",
            "/api/v1/out/99999010/stream/a/b",
            "/api/v1/in/99999010/x",
            "/api/v2/in/1/msgs",
        ] {
            assert_eq!(route(bad), None, "{bad}");
        }
    }
}
