//! What the operator endpoints share: the JSON error answer and [`Access`],
//! the bearer check of `http.admin_token` (changes, and reads) and
//! `http.read_token` (reads of payment data).
//!
//! Tokens are compared without leaking their content or length: at start each
//! configured token becomes an HMAC-SHA-256 tag under a key drawn for this
//! process; a request's token is tagged the same way and the two 32-byte tags
//! are compared in constant time (`ring::hmac::verify`).

use std::sync::Arc;

use axum::Json;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use ring::hmac;
use serde_json::json;

use crate::config::{HttpSettings, Secret};

/// An endpoint's refusal: its status and `{"error": "..."}` (401 adds `WWW-Authenticate`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: StatusCode,
    pub error: String,
}

impl Refusal {
    pub fn new(status: StatusCode, error: impl Into<String>) -> Self {
        Refusal { status, error: error.into() }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(json!({ "error": self.error }))).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        }
        r
    }
}

/// `{"error": "..."}` with `status`.
pub fn answer(status: StatusCode, error: &str) -> Response {
    Refusal::new(status, error).into_response()
}

/// Who may call what on this pod.
#[derive(Clone)]
pub struct Access {
    /// Drawn at start; tags made under it mean nothing to anyone else.
    key: Arc<hmac::Key>,
    /// `http.admin_token`'s tag; `None` when it is empty (nothing is authorized).
    admin: Option<hmac::Tag>,
    /// `http.read_token`'s tag; `None` when it is empty.
    read: Option<hmac::Tag>,
    /// Reads need no token: no read token is set and the operator listener is on
    /// loopback (the boot rules refuse an empty read token anywhere else).
    reads_open: bool,
}

impl Access {
    pub fn new(admin: &Secret, read: &Secret, reads_open: bool) -> Access {
        let key = hmac::Key::generate(hmac::HMAC_SHA256, &ring::rand::SystemRandom::new())
            .expect("the system's random source works");
        let tag = |s: &Secret| (!s.expose().is_empty()).then(|| hmac::sign(&key, s.expose().as_bytes()));
        let (admin, read) = (tag(admin), tag(read));
        Access { key: Arc::new(key), admin, read, reads_open }
    }

    /// The access `http.*` describes: reads open only without a read token on a loopback operator listener.
    pub fn from_settings(http: &HttpSettings) -> Access {
        let reads_open = http.read_token.expose().is_empty() && http.operator_addr().ip().is_loopback();
        Access::new(&http.admin_token, &http.read_token, reads_open)
    }

    /// A 401 unless the request carries the admin token.
    pub fn admin(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        if self.matches(headers, self.admin.as_ref()) {
            return Ok(());
        }
        Err(Refusal::new(StatusCode::UNAUTHORIZED, "a valid bearer token (http.admin_token) is required"))
    }

    /// A 401 unless reads are open or the request carries the read or the admin token.
    pub fn read(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        if self.reads_open || self.matches(headers, self.read.as_ref()) || self.matches(headers, self.admin.as_ref()) {
            return Ok(());
        }
        Err(Refusal::new(
            StatusCode::UNAUTHORIZED,
            "a valid bearer token (http.read_token or http.admin_token) is required",
        ))
    }

    /// `Authorization: Bearer {token}` whose tag is `expected`; nothing matches an unset token.
    fn matches(&self, headers: &HeaderMap, expected: Option<&hmac::Tag>) -> bool {
        let Some(expected) = expected else { return false };
        let Some(given) = bearer(headers) else { return false };
        hmac::verify(&self.key, given.as_bytes(), expected.as_ref()).is_ok()
    }
}

/// The token of `Authorization: Bearer {token}`, when there is one.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let token = value.strip_prefix("Bearer ")?.trim();
    (!token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, v.parse().unwrap());
        h
    }

    fn access(admin: &str, read: &str, reads_open: bool) -> Access {
        Access::new(&Secret::new(admin), &Secret::new(read), reads_open)
    }

    #[test]
    fn only_the_exact_admin_token_passes() {
        let a = access("s3cret-admin-token", "", false);
        assert!(a.admin(&with("Bearer s3cret-admin-token")).is_ok());
        for refused in ["Bearer s3cret-admin-toke", "Bearer s3cret-admin-tokenX", "Basic s3cret-admin-token", "Bearer "]
        {
            assert!(a.admin(&with(refused)).is_err(), "{refused}");
        }
        assert!(a.admin(&HeaderMap::new()).is_err());
        assert!(access("", "", true).admin(&with("Bearer ")).is_err(), "an empty admin token authorizes nothing");
        let refused = a.admin(&HeaderMap::new()).unwrap_err().into_response();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
        assert!(refused.headers().contains_key(header::WWW_AUTHENTICATE));
    }

    #[test]
    fn reads_take_the_read_or_the_admin_token_and_the_read_token_changes_nothing() {
        let a = access("admin-token-0123456789", "read-token-0123456789", false);
        assert!(a.read(&with("Bearer read-token-0123456789")).is_ok());
        assert!(a.read(&with("Bearer admin-token-0123456789")).is_ok());
        assert!(a.read(&with("Bearer read-token-012345678")).is_err());
        assert!(a.read(&HeaderMap::new()).is_err());
        assert!(a.admin(&with("Bearer read-token-0123456789")).is_err(), "the read token is no admin token");
        assert!(access("admin-token-0123456789", "", true).read(&HeaderMap::new()).is_ok(), "open on loopback");
        let loopback_with_token = access("admin-token-0123456789", "read-token-0123456789", false);
        assert!(loopback_with_token.read(&HeaderMap::new()).is_err(), "a read token set is a read token required");
    }

    #[test]
    fn reads_are_open_only_without_a_read_token_on_a_loopback_operator_listener() {
        let http = |bind: &str, operator: Option<&str>, read: &str| HttpSettings {
            bind: bind.parse().unwrap(),
            admin_token: Secret::new("admin-token-0123456789"),
            read_token: Secret::new(read),
            operator_bind: operator.map(|o| o.parse().unwrap()),
            probe_interval: std::time::Duration::from_secs(1),
            probe_timeout: std::time::Duration::from_secs(1),
        };
        let open = |h: HttpSettings| Access::from_settings(&h).read(&HeaderMap::new()).is_ok();
        assert!(open(http("127.0.0.1:8080", None, "")));
        assert!(open(http("[::1]:8080", None, "")));
        assert!(open(http("0.0.0.0:8080", Some("127.0.0.1:8090"), "")), "operator endpoints on loopback");
        assert!(!open(http("127.0.0.1:8080", None, "read-token-0123456789")));
        assert!(!open(http("0.0.0.0:8080", None, "")));
    }
}
