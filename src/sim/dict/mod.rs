//! The simulated DICT (spec 1.8.0, `bacen/pix-dict-api`): a listener of its
//! own (mTLS when the simulator has TLS) serving `GET /api/v1/entries/{Key}`
//! with the headers the spec requires (`PI-RequestingParticipant`,
//! `PI-PayerId`, `PI-EndToEndId`), `GET /api/v1/policies/` and
//! `/api/v1/policies/{policy}`, the request-limiting buckets of
//! [`policies`], faults (latency, 503 every n-th lookup, down: connections
//! dropped) and an audit. Keys come from [`directory`], seeded.

pub mod directory;
pub mod policies;
mod xml;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use serde::{Deserialize, Serialize};

use directory::Directory;
use policies::Policies;

/// Keys of each type the simulated DICT knows.
pub const KEYS_PER_TYPE: usize = 10_000;

/// Faults of the DICT listener, set through the control API.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DictFaults {
    /// Added before every answer.
    pub latency_ms: u64,
    /// Every n-th lookup answers 503 (0: never).
    pub fail_every: u64,
    /// Every request's connection is dropped without an answer.
    pub down: bool,
}

/// What the DICT answered, as the control API reports it.
#[derive(Debug, Default, Serialize)]
pub struct DictAudit {
    pub dict_lookups: u64,
    pub dict_found: u64,
    pub dict_404: u64,
    pub dict_429_participant: u64,
    pub dict_429_user: u64,
    pub dict_5xx: u64,
    pub dict_400: u64,
    pub dict_403: u64,
    pub dict_dropped: u64,
    pub policy_reads: u64,
    pub category: String,
}

#[derive(Default)]
struct Counters {
    lookups: AtomicU64,
    found: AtomicU64,
    not_found: AtomicU64,
    limited_participant: AtomicU64,
    limited_user: AtomicU64,
    failed: AtomicU64,
    bad: AtomicU64,
    forbidden: AtomicU64,
    dropped: AtomicU64,
    policy_reads: AtomicU64,
}

/// The DICT's state, shared by its listener and the control API.
pub struct DictState {
    pub directory: Directory,
    participants: Vec<String>,
    policies: Mutex<Policies>,
    faults: Mutex<DictFaults>,
    counters: Counters,
    /// Correlation ids.
    seq: AtomicU64,
    /// Lookups, for `fail_every`.
    lookups_seen: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A request the listener does not answer: its connection is dropped (fault `down`).
#[derive(Debug, thiserror::Error)]
#[error("DICT down (simulated)")]
pub struct Dropped;

type Answer = Response<Full<Bytes>>;

impl DictState {
    /// `participants`: the simulated ISPBs (the first owns every account).
    pub fn new(seed: u64, participants: Vec<String>, category: &str) -> DictState {
        let owner = participants.first().cloned().unwrap_or_else(|| "99999010".into());
        DictState {
            directory: Directory::new(seed, KEYS_PER_TYPE, &owner),
            participants,
            policies: Mutex::new(Policies::new(category)),
            faults: Mutex::new(DictFaults::default()),
            counters: Counters::default(),
            seq: AtomicU64::new(0),
            lookups_seen: AtomicU64::new(0),
        }
    }

    pub fn faults(&self) -> DictFaults {
        *lock(&self.faults)
    }

    pub fn set_faults(&self, faults: DictFaults) {
        *lock(&self.faults) = faults;
    }

    pub fn set_category(&self, category: &str) -> bool {
        lock(&self.policies).set_category(category)
    }

    pub fn set_participant_tokens(&self, ispb: &str, tokens: f64) {
        lock(&self.policies).set_participant_tokens(ispb, tokens, Instant::now());
    }

    pub fn audit(&self) -> DictAudit {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DictAudit {
            dict_lookups: get(&c.lookups),
            dict_found: get(&c.found),
            dict_404: get(&c.not_found),
            dict_429_participant: get(&c.limited_participant),
            dict_429_user: get(&c.limited_user),
            dict_5xx: get(&c.failed),
            dict_400: get(&c.bad),
            dict_403: get(&c.forbidden),
            dict_dropped: get(&c.dropped),
            policy_reads: get(&c.policy_reads),
            category: lock(&self.policies).category.clone(),
        }
    }

    /// Answers one request; `peer_cn` is the client certificate's CN under mTLS.
    pub async fn serve(&self, req: Request<Incoming>, peer_cn: Option<&str>) -> Result<Answer, Dropped> {
        let faults = self.faults();
        if faults.down {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return Err(Dropped);
        }
        if faults.latency_ms > 0 {
            tokio::time::sleep(Duration::from_millis(faults.latency_ms)).await;
        }
        let path = percent_decode(req.uri().path());
        let Some(rest) = path.strip_prefix("/api/v1/") else {
            return Ok(problem(StatusCode::NOT_FOUND, "NotFound", "Not found", "no such resource"));
        };
        if req.method() != Method::GET {
            return Ok(problem(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", "Method not allowed", "GET only"));
        }
        let participant = match self.requesting_participant(req.headers(), peer_cn) {
            Ok(p) => p,
            Err(answer) => return Ok(*answer),
        };
        if let Some(key) = rest.strip_prefix("entries/") {
            return Ok(self.lookup(key, &participant, req.headers(), faults));
        }
        if let Some(policy) = rest.strip_prefix("policies/") {
            return Ok(self.policies(policy.trim_end_matches('/'), &participant));
        }
        Ok(problem(StatusCode::NOT_FOUND, "NotFound", "Not found", "no such resource"))
    }

    /// `PI-RequestingParticipant`: 8 digits, a simulated ISPB, the certificate's CN under mTLS.
    fn requesting_participant(&self, headers: &HeaderMap, peer_cn: Option<&str>) -> Result<String, Box<Answer>> {
        let value = header_str(headers, "PI-RequestingParticipant");
        if value.len() != 8 || !value.bytes().all(|b| b.is_ascii_digit()) {
            self.counters.bad.fetch_add(1, Ordering::Relaxed);
            return Err(Box::new(problem(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "Bad request",
                "PI-RequestingParticipant",
            )));
        }
        let known = self.participants.iter().any(|p| p == value);
        if !known || peer_cn.is_some_and(|cn| cn != value) {
            self.counters.forbidden.fetch_add(1, Ordering::Relaxed);
            return Err(Box::new(problem(StatusCode::FORBIDDEN, "Forbidden", "Forbidden", "not this participant")));
        }
        Ok(value.to_owned())
    }

    fn lookup(&self, key: &str, participant: &str, headers: &HeaderMap, faults: DictFaults) -> Answer {
        let payer = header_str(headers, "PI-PayerId");
        let e2e = header_str(headers, "PI-EndToEndId");
        if !matches!(payer.len(), 11 | 14) || !payer.bytes().all(|b| b.is_ascii_digit()) || e2e.is_empty() {
            self.counters.bad.fetch_add(1, Ordering::Relaxed);
            return problem(StatusCode::BAD_REQUEST, "BadRequest", "Bad request", "PI-PayerId and PI-EndToEndId");
        }
        let n = self.lookups_seen.fetch_add(1, Ordering::Relaxed) + 1;
        if faults.fail_every > 0 && n.is_multiple_of(faults.fail_every) {
            self.counters.failed.fetch_add(1, Ordering::Relaxed);
            let mut answer = problem(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", "Service unavailable", "");
            answer.headers_mut().insert(header::RETRY_AFTER, http::HeaderValue::from_static("1"));
            return answer;
        }
        let entry = self.directory.get(key);
        let key_type = entry.map_or_else(|| key_type_of(key), |e| e.key_type);
        let now = Instant::now();
        let mut policies = lock(&self.policies);
        if let Some(empty) = policies.refusal(participant, payer, key_type, now) {
            let counter = if empty == policies::PARTICIPANT {
                &self.counters.limited_participant
            } else {
                &self.counters.limited_user
            };
            counter.fetch_add(1, Ordering::Relaxed);
            return problem(StatusCode::TOO_MANY_REQUESTS, "RateLimited", "Rate limited", empty);
        }
        policies.charge(participant, payer, key_type, entry.is_some(), now);
        drop(policies);
        self.counters.lookups.fetch_add(1, Ordering::Relaxed);
        match entry {
            Some(e) => {
                self.counters.found.fetch_add(1, Ordering::Relaxed);
                xml_answer(StatusCode::OK, "application/xml", xml::entry(e, &timestamp(), &self.correlation()))
            }
            None => {
                self.counters.not_found.fetch_add(1, Ordering::Relaxed);
                let detail = "Entry associated with given key does not exist";
                problem(StatusCode::NOT_FOUND, "NotFound", "Not found", detail)
            }
        }
    }

    fn policies(&self, name: &str, participant: &str) -> Answer {
        self.counters.policy_reads.fetch_add(1, Ordering::Relaxed);
        let mut policies = lock(&self.policies);
        let states = policies.states(participant, Instant::now());
        let (category, now, id) = (policies.category.clone(), timestamp(), self.correlation());
        drop(policies);
        if name.is_empty() {
            return xml_answer(StatusCode::OK, "application/xml", xml::policies(&category, &states, &now, &id));
        }
        match states.iter().find(|s| s.name == name) {
            Some(state) => xml_answer(StatusCode::OK, "application/xml", xml::one_policy(&category, state, &now, &id)),
            None => problem(StatusCode::NOT_FOUND, "NotFound", "Not found", "no such policy"),
        }
    }

    fn correlation(&self) -> String {
        format!("{:032x}", u128::from(self.seq.fetch_add(1, Ordering::Relaxed)) | (0xd1c7u128 << 112))
    }
}

/// The type of a key the directory does not hold, by its shape.
fn key_type_of(key: &str) -> &'static str {
    let digits = key.bytes().all(|b| b.is_ascii_digit());
    match key.len() {
        11 if digits => "CPF",
        14 if digits => "CNPJ",
        _ if key.starts_with('+') => "PHONE",
        _ if key.contains('@') => "EMAIL",
        _ => "EVP",
    }
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// Now as the DICT writes times: `2020-01-10T10:00:00.000Z`.
fn timestamp() -> String {
    let t = time::OffsetDateTime::now_utc();
    let (date, clock) = (t.date(), t.time());
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        date.year(),
        u8::from(date.month()),
        date.day(),
        clock.hour(),
        clock.minute(),
        clock.second(),
        clock.millisecond()
    )
}

/// `%XX` sequences of a path decoded (keys may arrive as `%2B5511…` or `…%40…`).
fn percent_decode(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn xml_answer(status: StatusCode, content_type: &'static str, body: String) -> Answer {
    let mut answer = Response::new(Full::new(Bytes::from(body)));
    *answer.status_mut() = status;
    answer.headers_mut().insert(header::CONTENT_TYPE, http::HeaderValue::from_static(content_type));
    answer
}

fn problem(status: StatusCode, kind: &str, title: &str, detail: &str) -> Answer {
    xml_answer(status, "application/problem+xml", xml::problem(kind, title, status.as_u16(), detail))
}

/// Serves the DICT listener until cancelled (each connection its own task).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<DictState>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    cancel: tokio_util::sync::CancellationToken,
) {
    loop {
        let (tcp, _) = tokio::select! {
            _ = cancel.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(_) => { tokio::time::sleep(Duration::from_millis(20)).await; continue; }
            },
        };
        let (state, tls, cancel) = (state.clone(), tls.clone(), cancel.clone());
        tokio::spawn(async move { connection(tcp, state, tls, cancel).await });
    }
}

async fn connection(
    tcp: tokio::net::TcpStream,
    state: Arc<DictState>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    cancel: tokio_util::sync::CancellationToken,
) {
    let _ = tcp.set_nodelay(true);
    match tls {
        None => http(tcp, state, None, cancel).await,
        Some(acceptor) => {
            let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await else {
                return;
            };
            let cert = stream.get_ref().1.peer_certificates().and_then(|c| c.first().cloned());
            let cn = cert.and_then(|c| super::der::subject_common_name(&c));
            http(stream, state, cn, cancel).await;
        }
    }
}

async fn http<IO>(io: IO, state: Arc<DictState>, cn: Option<String>, cancel: tokio_util::sync::CancellationToken)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let cn: Option<Arc<str>> = cn.map(Arc::from);
    let service = hyper::service::service_fn(move |req| {
        let (state, cn) = (state.clone(), cn.clone());
        async move { state.serve(req, cn.as_deref()).await }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(hyper_util::rt::TokioIo::new(io), service);
    tokio::select! {
        _ = conn => {}
        _ = cancel.cancelled() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_arrive_percent_encoded_or_not() {
        assert_eq!(percent_decode("/api/v1/entries/%2B5511987654321"), "/api/v1/entries/+5511987654321");
        assert_eq!(percent_decode("/api/v1/entries/a%40b.com"), "/api/v1/entries/a@b.com");
        assert_eq!(percent_decode("/x%zz"), "/x%zz");
        assert_eq!(key_type_of("12345678901"), "CPF");
        assert_eq!(key_type_of("nobody@example.com"), "EMAIL");
    }
}
