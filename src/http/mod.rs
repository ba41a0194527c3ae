//! The status server (axum): health, readiness, Prometheus metrics and the
//! actor tree. Operator endpoints that change things require the admin token.

mod health;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::get;
use cabine_actors::ActorStatus;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::readiness::Readiness;

/// What every handler may read.
#[derive(Clone)]
pub struct AppState {
    pub readiness: Readiness,
    pub metrics: PrometheusHandle,
    pub actors: Arc<dyn Fn() -> ActorStatus + Send + Sync>,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/health/live", get(health::live))
        .route("/health/ready", get(health::ready))
        .route("/metrics", get(metrics))
        .route("/actors", get(actors))
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

async fn actors(State(state): State<AppState>) -> impl IntoResponse {
    axum::Json((state.actors)())
}
