//! The ICOM client of one slot: one value owns one connection (a reqwest
//! client with at most one idle connection, built for it alone) and issues one
//! request at a time (`&mut self`). Every request carries exactly the
//! whitelisted headers, is bounded by its timeout, and reads at most the
//! configured body size; every outcome is counted and timed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::Method;
use reqwest::Url;

use cabine_actors::ports::{CloseOutcome, IcomStream, PollOutcome};

use super::endpoint::IcomEndpoint;
use super::gzip;
use super::headers::{self, RequestBody};
use super::limits::{WireError, WireLimits};
use super::multipart::{self, Part};
use super::outcome::{self, Reply, SendOutcome, StreamOp};

/// Why a request produced no complete reply.
#[derive(Debug)]
enum Failure {
    Timeout,
    Transport(String),
}

/// One slot's connection to one channel's ICOM. Not `Clone`: it is the connection.
pub struct IcomClient {
    endpoint: Arc<IcomEndpoint>,
    http: reqwest::Client,
}

impl IcomClient {
    pub(super) fn new(endpoint: Arc<IcomEndpoint>, http: reqwest::Client) -> IcomClient {
        IcomClient { endpoint, http }
    }

    pub fn endpoint(&self) -> &IcomEndpoint {
        &self.endpoint
    }

    /// `GET /api/v1/out/{ispb}/stream/start`: opens a stream and reads its first batch.
    pub async fn start(&mut self) -> PollOutcome {
        let url = self.endpoint.start_url();
        self.poll(StreamOp::Start, url).await
    }

    /// `GET {pull_next}`: acknowledges the previous batch and reads the next.
    pub async fn next(&mut self, pull_next: &str) -> PollOutcome {
        match self.endpoint.pull_next_url(pull_next) {
            Ok(url) => self.poll(StreamOp::Next, url).await,
            Err(reason) => self.observe("next", "transport", Instant::now(), PollOutcome::Transport(reason)),
        }
    }

    /// `DELETE {pull_next}`: acknowledges the previous batch and closes the stream.
    pub async fn close(&mut self, pull_next: &str) -> CloseOutcome {
        let started = Instant::now();
        let url = match self.endpoint.pull_next_url(pull_next) {
            Ok(url) => url,
            Err(reason) => return self.observe("close", "transport", started, CloseOutcome::Failed(reason)),
        };
        let timeout = self.endpoint.settings.long_poll_timeout;
        let outcome = match self.exchange(Method::DELETE, url, RequestBody::None, None, timeout).await {
            Ok(reply) => outcome::close_outcome(&reply),
            Err(Failure::Timeout) => CloseOutcome::Failed("timeout".into()),
            Err(Failure::Transport(reason)) => CloseOutcome::Failed(reason),
        };
        let label = if outcome == CloseOutcome::Closed { "closed" } else { "failed" };
        self.observe("close", label, started, outcome)
    }

    /// `POST /api/v1/in/{ispb}/msgs` with 1..=max_parts raw XML messages: one
    /// gzipped XML body for one message, a gzipped `multipart/mixed` for more.
    /// `Err` means the batch itself is unusable and nothing was sent.
    pub async fn send(&mut self, batch: &[Bytes]) -> Result<SendOutcome, WireError> {
        // The send timeout counts from here, gzip included: the gate's busy window
        // (armed just before) covers the whole call, not only the wire part.
        let started = Instant::now();
        let (body, boundary) = send_body(batch, &self.endpoint.settings.limits)?;
        let kind = boundary.as_deref().map_or(RequestBody::GzipXml, RequestBody::GzipMultipart);
        let url = self.endpoint.send_url();
        let timeout = self.endpoint.settings.send_timeout.saturating_sub(started.elapsed());
        let outcome = match self.exchange(Method::POST, url, kind, Some(body), timeout).await {
            Ok(reply) => outcome::send_outcome(&reply),
            Err(Failure::Timeout) => SendOutcome::Timeout,
            Err(Failure::Transport(reason)) => SendOutcome::Transport(reason),
        };
        let label = send_label(&outcome);
        Ok(self.observe("send", label, started, outcome))
    }

    async fn poll(&mut self, op: StreamOp, url: Url) -> PollOutcome {
        let started = Instant::now();
        let timeout = self.endpoint.settings.long_poll_timeout;
        let outcome = match self.exchange(Method::GET, url, RequestBody::None, None, timeout).await {
            Ok(reply) => outcome::poll_outcome(op, reply, &self.endpoint.settings.limits),
            Err(Failure::Timeout) => PollOutcome::Timeout,
            Err(Failure::Transport(reason)) => PollOutcome::Transport(reason),
        };
        let name = if op == StreamOp::Start { "start" } else { "next" };
        let label = outcome.label();
        self.observe(name, label, started, outcome)
    }

    /// One request, its whole reply read within `timeout` and the body limit.
    async fn exchange(
        &mut self,
        method: Method,
        url: Url,
        body: RequestBody<'_>,
        payload: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Reply, Failure> {
        let headers = headers::request_headers(&self.endpoint.host, &self.endpoint.user_agent, body);
        let mut request = self.http.request(method, url).headers(headers);
        if let Some(payload) = payload {
            request = request.body(payload);
        }
        let cap = self.endpoint.settings.limits.max_wire_bytes();
        let exchange = async {
            let mut response = request.send().await.map_err(transport)?;
            let (body, over_limit) = read_capped(&mut response, cap).await?;
            Ok(Reply { status: response.status(), headers: std::mem::take(response.headers_mut()), body, over_limit })
        };
        tokio::time::timeout(timeout, exchange).await.unwrap_or(Err(Failure::Timeout))
    }

    fn observe<T>(&self, op: &'static str, outcome: &'static str, started: Instant, value: T) -> T {
        let channel = self.endpoint.settings.channel.as_str();
        metrics::counter!("cabine_icom_requests_total", "channel" => channel, "op" => op, "outcome" => outcome)
            .increment(1);
        metrics::histogram!("cabine_icom_request_seconds", "channel" => channel, "op" => op)
            .record(started.elapsed().as_secs_f64());
        tracing::debug!(channel, op, outcome, elapsed_ms = started.elapsed().as_millis() as u64, "icom request");
        value
    }
}

/// The gzipped body of a send and its multipart boundary (`None`: one XML message).
fn send_body(batch: &[Bytes], limits: &WireLimits) -> Result<(Vec<u8>, Option<String>), WireError> {
    if batch.is_empty() || batch.len() > limits.max_parts {
        return Err(WireError::BatchSize { len: batch.len(), max: limits.max_parts }.counted());
    }
    match batch {
        [single] if single.len() > limits.max_body_bytes => {
            Err(WireError::BodyTooLarge { max: limits.max_body_bytes }.counted())
        }
        [single] => Ok((gzip::compress(single)?, None)),
        many => {
            let parts: Vec<Part> = many.iter().cloned().map(Part::xml).collect();
            let (boundary, body) = multipart::build_fresh(&parts, limits)?;
            Ok((gzip::compress(&body)?, Some(boundary)))
        }
    }
}

/// Describes the ICOM metrics (idempotent; values are recorded without it too).
pub fn describe_metrics() {
    metrics::describe_counter!("cabine_icom_requests_total", "ICOM requests by channel, operation and outcome.");
    metrics::describe_histogram!(
        "cabine_icom_request_seconds",
        metrics::Unit::Seconds,
        "ICOM request latency, whole response read, by channel and operation."
    );
    metrics::describe_counter!(
        "cabine_icom_wire_limit_total",
        "ICOM bodies refused for breaking a wire limit, by limit."
    );
}

/// Reads the body up to `cap` bytes. A longer body (declared or read) is not
/// read further: the bytes so far come back with `over_limit`, and dropping the
/// response closes the connection.
async fn read_capped(response: &mut reqwest::Response, cap: usize) -> Result<(Bytes, bool), Failure> {
    let declared_over = response.content_length().is_some_and(|len| len > cap as u64);
    let mut body = BytesMut::new();
    while let Some(chunk) = response.chunk().await.map_err(transport)? {
        let room = cap - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            WireError::BodyTooLarge { max: cap }.counted();
            return Ok((body.freeze(), true));
        }
        body.extend_from_slice(&chunk);
        if declared_over && body.len() == cap {
            WireError::BodyTooLarge { max: cap }.counted();
            return Ok((body.freeze(), true));
        }
    }
    Ok((body.freeze(), false))
}

fn transport(e: reqwest::Error) -> Failure {
    if e.is_timeout() {
        return Failure::Timeout;
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    Failure::Transport(text)
}

fn send_label(outcome: &SendOutcome) -> &'static str {
    match outcome {
        SendOutcome::Accepted { .. } => "accepted",
        SendOutcome::RateLimited { .. } => "rate_limited",
        SendOutcome::Rejected { .. } => "rejected",
        SendOutcome::ServerError { .. } => "server_error",
        SendOutcome::Timeout => "timeout",
        SendOutcome::Transport(_) => "transport",
    }
}

#[async_trait::async_trait]
impl IcomStream for IcomClient {
    async fn start(&mut self) -> PollOutcome {
        IcomClient::start(self).await
    }
    async fn next(&mut self, pull_next: &str) -> PollOutcome {
        IcomClient::next(self, pull_next).await
    }
    async fn close(&mut self, pull_next: &str) -> CloseOutcome {
        IcomClient::close(self, pull_next).await
    }
}
