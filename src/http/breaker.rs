//! `POST /v1/breakers/{ispb}/{channel}/reset` (bearer): closes the circuit
//! breaker every pod shares for that channel (window cleared, a new
//! generation) and answers its state afterwards. 404 for another ISPB or a
//! channel this pod does not run.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use cabine_actors::ports::breaker::BreakerError;
use serde_json::json;

use super::AppState;
use super::auth::Refusal;
use super::outbound::outbound_of;
use crate::outbound::ingress::enabled_channel;

pub async fn reset(
    State(state): State<AppState>,
    Path((ispb, channel)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    state.access.admin(&headers)?;
    let o = outbound_of(&state)?;
    if ispb != o.rules.ispb.as_str() {
        let why = format!("this cluster serves ISPB {}, not {ispb:?}", o.rules.ispb);
        return Err(Refusal::new(StatusCode::NOT_FOUND, why));
    }
    let channel = enabled_channel(&channel, &o.rules).map_err(|why| Refusal::new(StatusCode::NOT_FOUND, why))?;
    let after = async {
        o.breaker.reset(channel).await?;
        o.breaker.state(channel).await
    };
    match o.bounded(after).await {
        Some(Ok(view)) => {
            tracing::warn!(%channel, "operator breaker reset");
            Ok(Json(json!({ "ispb": ispb, "channel": channel, "breaker": view })).into_response())
        }
        Some(Err(e @ BreakerError::Unavailable(_))) => {
            Err(Refusal::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))
        }
        Some(Err(e @ BreakerError::Fatal(_))) => Err(Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
        None => {
            Err(Refusal::new(StatusCode::SERVICE_UNAVAILABLE, format!("breaker: no answer within {:?}", o.timeout)))
        }
    }
}
