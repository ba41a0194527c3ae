//! The DICT client: `GET {base}entries/{Key}` with the headers the spec
//! requires, `GET {policies}policies/`, over mTLS (the participant's
//! certificate, the RSFN CA) or plain HTTP for a local simulator. Answers are
//! typed by what the caller does: an entry or "not found"; rate limited (the
//! Central Bank's bucket is empty: resynchronise, refuse locally); unavailable
//! (transport, timeout, 5xx: serve from the cache if allowed); malformed.

use reqwest::{StatusCode, Url};

use super::xml::{self, Entry, Policies};
use crate::config::{DictSettings, Ispb};
use crate::icom::tls::{self, PemFiles};

/// Largest DICT answer read (an entry is a few KB).
const MAX_BODY: usize = 256 * 1024;

/// What one lookup answered.
#[derive(Clone, Debug, PartialEq)]
pub enum Found {
    Entry(Box<Entry>),
    NotFound,
}

#[derive(Debug, thiserror::Error)]
pub enum DictError {
    /// 429: a bucket of the Central Bank's is empty.
    #[error("the DICT refused: rate limited ({0})")]
    RateLimited(String),
    /// Transport error, timeout or 5xx: the DICT cannot answer now.
    #[error("the DICT is unavailable: {0}")]
    Unavailable(String),
    /// An answer that is not what the spec says (or a 4xx that means our request was wrong).
    #[error("the DICT answered unexpectedly: {0}")]
    Malformed(String),
    /// The client cannot be built (TLS files, URL): fix the configuration.
    #[error("DICT client: {0}")]
    Setup(String),
}

/// One pod's DICT client (its own connection pool).
pub struct DictClient {
    http: reqwest::Client,
    entries: Url,
    policies: Url,
    ispb: Ispb,
}

/// The headers of one payment lookup.
#[derive(Clone, Debug)]
pub struct LookupHeaders<'a> {
    /// `PI-PayerId`: the payer's CPF (11 digits) or CNPJ (14 digits).
    pub payer_id: &'a str,
    /// `PI-EndToEndId` of the payment the lookup starts.
    pub end_to_end_id: &'a str,
}

impl DictClient {
    pub fn new(settings: &DictSettings, ispb: &Ispb) -> Result<DictClient, DictError> {
        let setup = |e: &dyn std::fmt::Display| DictError::Setup(e.to_string());
        let base = Url::parse(&settings.base_url).map_err(|e| setup(&e))?;
        let root = Url::parse(settings.policies_root()).map_err(|e| setup(&e))?;
        let tls = if base.scheme() == "https" || root.scheme() == "https" {
            let files = PemFiles { ca: &settings.ca_file, cert: &settings.cert_file, key: &settings.key_file };
            tls::mtls_config(files)
        } else {
            tls::plain_config()
        }
        .map_err(|e| setup(&e))?;
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .http1_only()
            .retry(reqwest::retry::never())
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .tcp_nodelay(true)
            .timeout(settings.request_timeout)
            .connect_timeout(settings.request_timeout)
            .build()
            .map_err(|e| setup(&e))?;
        let entries = base.join("entries/").map_err(|e| setup(&e))?;
        let policies = root.join("policies/").map_err(|e| setup(&e))?;
        Ok(DictClient { http, entries, policies, ispb: ispb.clone() })
    }

    /// `GET entries/{key}`.
    pub async fn entry(&self, key: &str, h: &LookupHeaders<'_>) -> Result<Found, DictError> {
        let mut url = self.entries.clone();
        url.path_segments_mut()
            .map_err(|()| DictError::Setup("base_url cannot be a base".into()))?
            .pop_if_empty()
            .push(key);
        let request = self
            .http
            .get(url)
            .header("Accept", "application/xml")
            .header("PI-RequestingParticipant", self.ispb.as_str())
            .header("PI-PayerId", h.payer_id)
            .header("PI-EndToEndId", h.end_to_end_id);
        let (status, body) = self.exchange(request).await?;
        match status {
            StatusCode::OK => {
                xml::entry(&body).map(|e| Found::Entry(Box::new(e))).map_err(|e| DictError::Malformed(e.to_string()))
            }
            StatusCode::NOT_FOUND if xml::problem_type(&body).as_deref() == Some("NotFound") => Ok(Found::NotFound),
            other => Err(refusal(other, &body)),
        }
    }

    /// `GET policies/`: the participant's category and buckets (POLICIES_LIST: 6 a minute).
    pub async fn policies(&self) -> Result<Policies, DictError> {
        self.read_policies(self.policies.clone()).await
    }

    /// `GET policies/{name}`: one bucket (POLICIES_READ: 60 a minute).
    pub async fn policy(&self, name: &str) -> Result<Policies, DictError> {
        let url = self.policies.join(name).map_err(|e| DictError::Setup(e.to_string()))?;
        self.read_policies(url).await
    }

    async fn read_policies(&self, url: Url) -> Result<Policies, DictError> {
        let request = self.http.get(url).header("PI-RequestingParticipant", self.ispb.as_str());
        let (status, body) = self.exchange(request).await?;
        match status {
            StatusCode::OK => xml::policies(&body).map_err(|e| DictError::Malformed(e.to_string())),
            other => Err(refusal(other, &body)),
        }
    }

    async fn exchange(&self, request: reqwest::RequestBuilder) -> Result<(StatusCode, String), DictError> {
        let mut response = request.send().await.map_err(|e| DictError::Unavailable(transport(e)))?;
        let status = response.status();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| DictError::Unavailable(transport(e)))? {
            if body.len() + chunk.len() > MAX_BODY {
                return Err(DictError::Malformed(format!("answer over {MAX_BODY} bytes")));
            }
            body.extend_from_slice(&chunk);
        }
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }
}

/// What a status other than the expected ones means.
fn refusal(status: StatusCode, body: &str) -> DictError {
    let kind = xml::problem_type(body).unwrap_or_default();
    match status {
        StatusCode::TOO_MANY_REQUESTS => DictError::RateLimited(kind),
        s if s.is_server_error() => DictError::Unavailable(format!("HTTP {s} {kind}")),
        s => DictError::Malformed(format!("HTTP {s} {kind}")),
    }
}

/// A transport error's text without its URL (the key is payment data): `connect: …` when no
/// connection was made, so the caller knows the DICT cannot have counted the request.
fn transport(e: reqwest::Error) -> String {
    if e.is_timeout() {
        return "timed out".into();
    }
    let connect = e.is_connect();
    let text = e.without_url().to_string();
    if connect { format!("connect: {text}") } else { text }
}
