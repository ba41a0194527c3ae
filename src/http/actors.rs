//! `GET /actors` (the tree from the status board, no mailbox touched) and
//! `POST /actors/{id}/restart`: bearer token required (401), unknown id 404,
//! an actor that cannot be restarted alone or is not running 409.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cabine_actors::{ActorStatus, RestartError};
use serde_json::json;

use super::AppState;

pub async fn tree(State(state): State<AppState>) -> Json<ActorStatus> {
    Json(state.operator.as_ref().map_or_else(ActorStatus::empty_root, |o| o.tree.status()))
}

/// `POST /actors/{id}/restart`; `target` is `{id}/restart` (the id may hold slashes).
pub async fn restart(State(state): State<AppState>, Path(target): Path<String>, headers: HeaderMap) -> Response {
    let Some(id) = target.strip_suffix("/restart").filter(|id| !id.is_empty()).map(str::to_owned) else {
        return answer(StatusCode::NOT_FOUND, "POST /actors/{id}/restart");
    };
    let Some(operator) = state.operator else {
        return answer(StatusCode::SERVICE_UNAVAILABLE, "the actor tree is not running");
    };
    if !bearer_matches(&headers, operator.admin_token.expose()) {
        let mut r = answer(StatusCode::UNAUTHORIZED, "a valid bearer token (http.admin_token) is required");
        r.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        return r;
    }
    match operator.tree.restart(&id).await {
        Ok(()) => {
            tracing::warn!(actor = %id, "operator restart");
            (StatusCode::OK, Json(json!({ "restarted": id }))).into_response()
        }
        Err(e) => {
            let status = match e {
                RestartError::UnknownActor(_) => StatusCode::NOT_FOUND,
                RestartError::NotRestartable(_) | RestartError::NotRunning(_) => StatusCode::CONFLICT,
                RestartError::TreeStopped => StatusCode::SERVICE_UNAVAILABLE,
            };
            answer(status, &e.to_string())
        }
    }
}

fn answer(status: StatusCode, error: &str) -> Response {
    (status, Json(json!({ "error": error }))).into_response()
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
    }
}
