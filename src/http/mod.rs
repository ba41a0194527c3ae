//! The status server (axum): health, readiness, Prometheus metrics, the actor
//! tree (`/actors`), the cluster view (`/cluster`), the operator restart of
//! one actor (`POST /actors/{id}/restart`, bearer `http.admin_token`) and the
//! outbound operator endpoints (`/v1/outbound…`, `/v1/parked…`, `/v1/breakers/…/reset`).

mod actors;
mod auth;
mod breaker;
mod cluster;
mod health;
mod outbound;
mod outbound_parked;
mod outbound_send;
mod outbound_view;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use cabine_actors::Tree;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

pub use cluster::{ClusterSource, ClusterView};
pub use outbound::OutboundOperator;

use crate::config::Secret;
use crate::readiness::Readiness;

/// What every handler may read.
#[derive(Clone)]
pub struct AppState {
    pub readiness: Readiness,
    pub metrics: PrometheusHandle,
    /// The running pod's tree and cluster view; `None` before the tree exists.
    pub operator: Option<Operator>,
}

/// The handles the operator endpoints act through.
#[derive(Clone)]
pub struct Operator {
    pub tree: Arc<Tree>,
    pub cluster: Arc<ClusterSource>,
    /// Bearer token of the endpoints that change things.
    pub admin_token: Secret,
    /// The outbound side's handles; `None` when `outbound.enabled` is false (503).
    pub outbound: Option<OutboundOperator>,
}

/// Body limit of `POST /v1/outbound` on a pod without an outbound side (it answers 503 anyway).
const NO_OUTBOUND_BODY_LIMIT: usize = 64 * 1024;

pub fn router(state: AppState) -> Router {
    let max_body = state
        .operator
        .as_ref()
        .and_then(|o| o.outbound.as_ref())
        .map_or(NO_OUTBOUND_BODY_LIMIT, |o| o.rules.max_message_bytes);
    Router::new()
        .route("/health/live", get(health::live))
        .route("/health/ready", get(health::ready))
        .route("/metrics", get(metrics))
        .route("/actors", get(actors::tree))
        // Actor ids contain slashes (`slot/cpm/3`): `/actors/{id}/restart` is matched as a catch-all.
        .route("/actors/{*target}", post(actors::restart))
        .route("/cluster", get(cluster::view))
        .route("/v1/outbound", get(outbound::list).post(outbound_send::send).layer(DefaultBodyLimit::max(max_body)))
        .route("/v1/outbound/{msg_id}", get(outbound::detail))
        .route("/v1/outbound/{msg_id}/reprocess", post(outbound::reprocess))
        .route("/v1/parked", get(outbound_parked::list))
        .route("/v1/parked/{ingress_ref}", get(outbound_parked::detail))
        .route("/v1/parked/{ingress_ref}/reprocess", post(outbound_parked::reprocess))
        .route("/v1/breakers/{ispb}/{channel}/reset", post(breaker::reset))
        .with_state(state)
}

/// Binds the configured address (port 0 allowed) and serves until `shutdown` resolves.
pub async fn serve(
    bind: SocketAddr,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>)> {
    let listener = TcpListener::bind(bind).await?;
    let addr = listener.local_addr()?;
    let app = router(state);
    let task = tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(shutdown).await });
    Ok((addr, task))
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    ([(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render())
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::*;

    #[tokio::test]
    async fn without_an_outbound_side_every_outbound_endpoint_answers_503() {
        crate::install_crypto_provider();
        let state =
            AppState { readiness: Readiness::default(), metrics: crate::telemetry::metrics_handle(), operator: None };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (addr, server) = serve("127.0.0.1:0".parse().unwrap(), state, async { _ = stopped.await }).await.unwrap();
        let http = reqwest::Client::new();
        for (method, path) in [
            (reqwest::Method::GET, "/v1/outbound/M1"),
            (reqwest::Method::GET, "/v1/outbound?status=dead"),
            (reqwest::Method::POST, "/v1/outbound?channel=cpm"),
            (reqwest::Method::POST, "/v1/outbound/M1/reprocess"),
            (reqwest::Method::POST, "/v1/breakers/99999010/cpm/reset"),
        ] {
            let r = http.request(method, format!("http://{addr}{path}")).send().await.unwrap();
            assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE, "{path}");
            let body: serde_json::Value = r.json().await.unwrap();
            assert!(body["error"].as_str().unwrap().contains("outbound.enabled"), "{path}: {body}");
        }
        let _ = stop.send(());
        server.await.unwrap().unwrap();
    }
}
