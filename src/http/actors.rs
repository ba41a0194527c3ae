//! `GET /actors` (the tree from the status board, no mailbox touched) and
//! `POST /actors/{id}/restart`: bearer token required (401), unknown id 404,
//! an actor that cannot be restarted alone or is not running 409.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use cabine_actors::{ActorStatus, RestartError};
use serde_json::json;

use super::AppState;
use super::auth::answer;

pub async fn tree(State(state): State<AppState>) -> Json<ActorStatus> {
    Json(state.operator.as_ref().map_or_else(ActorStatus::empty_root, |o| o.tree.status()))
}

/// `POST /actors/{id}/restart`; `target` is `{id}/restart` (the id may hold slashes).
pub async fn restart(State(state): State<AppState>, Path(target): Path<String>, headers: HeaderMap) -> Response {
    let Some(id) = target.strip_suffix("/restart").filter(|id| !id.is_empty()).map(str::to_owned) else {
        return answer(StatusCode::NOT_FOUND, "POST /actors/{id}/restart");
    };
    if let Err(refused) = state.access.admin(&headers) {
        return refused.into_response();
    }
    let Some(operator) = state.operator else {
        return answer(StatusCode::SERVICE_UNAVAILABLE, "the actor tree is not running");
    };
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
