//! What the operator endpoints share: the JSON error answer and the bearer
//! check (`http.admin_token`, compared in constant time).

use axum::Json;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

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

/// A 401 refusal unless `headers` carry `Authorization: Bearer {token}`.
pub fn require_bearer(headers: &HeaderMap, token: &str) -> Result<(), Refusal> {
    if bearer_matches(headers, token) {
        return Ok(());
    }
    Err(Refusal::new(StatusCode::UNAUTHORIZED, "a valid bearer token (http.admin_token) is required"))
}

/// `Authorization: Bearer {token}`, compared in constant time; an empty token never matches.
fn bearer_matches(headers: &HeaderMap, token: &str) -> bool {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or("");
    !token.is_empty() && constant_time_eq(given.as_bytes(), token.as_bytes())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let diff = a.iter().zip(b).fold(a.len() ^ b.len(), |acc, (x, y)| acc | usize::from(x ^ y));
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_bearer_token_passes() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, v.parse().unwrap());
            h
        };
        assert!(bearer_matches(&with("Bearer s3cret"), "s3cret"));
        assert!(!bearer_matches(&with("Bearer s3cre"), "s3cret"));
        assert!(!bearer_matches(&with("Bearer s3cretX"), "s3cret"));
        assert!(!bearer_matches(&with("Basic s3cret"), "s3cret"));
        assert!(!bearer_matches(&HeaderMap::new(), "s3cret"));
        assert!(!bearer_matches(&with("Bearer "), ""));
        let refused = require_bearer(&HeaderMap::new(), "s3cret").unwrap_err().into_response();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
        assert!(refused.headers().contains_key(header::WWW_AUTHENTICATE));
    }
}
