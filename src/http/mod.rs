//! The status server (axum): health, readiness, Prometheus metrics, the actor
//! tree (`/actors`), the cluster view (`/cluster`), the operator restart of
//! one actor (`POST /actors/{id}/restart`, bearer `http.admin_token`) and the
//! outbound operator endpoints (`/v1/outbound…`, `/v1/parked…`, `/v1/breakers/…/reset`,
//! `/v1/reconciliations…`, `/v1/incidents/report`, `/v1/reports/timings`; reads
//! of payment data need `http.read_token` off loopback). With
//! `http.operator_bind` the operator endpoints get a listener of their own
//! ([`Routes`]).

mod actors;
mod auth;
mod breaker;
mod cluster;
mod dict;
mod health;
mod incident;
mod outbound;
mod outbound_parked;
mod outbound_send;
mod outbound_view;
mod reconcile;
mod status_page;
mod timings;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use cabine_actors::Tree;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

pub use auth::Access;
pub use cluster::{ClusterSource, ClusterView};
pub use outbound::OutboundOperator;

use crate::readiness::Readiness;

/// What every handler may read.
#[derive(Clone)]
pub struct AppState {
    pub readiness: Readiness,
    pub metrics: PrometheusHandle,
    /// The bearer checks (`http.admin_token`, `http.read_token`).
    pub access: Access,
    /// The running pod's tree and cluster view; `None` before the tree exists.
    pub operator: Option<Operator>,
}

/// The handles the operator endpoints act through.
#[derive(Clone)]
pub struct Operator {
    pub tree: Arc<Tree>,
    pub cluster: Arc<ClusterSource>,
    /// The outbound side's handles; `None` when `outbound.enabled` is false (503).
    pub outbound: Option<OutboundOperator>,
    /// The Reconciler's adapter; `None` when this pod does not reconcile (503).
    pub reconciler: Option<Arc<crate::reconcile::PgReconciliation>>,
    /// Reads the incident report of a window.
    pub incidents: Arc<crate::incident::IncidentReports>,
    /// Reads the stage timings of a window.
    pub timings: Arc<crate::timings::TimingReports>,
    /// DICT lookups; `None` when `dict.enabled` is false (503).
    pub dict: Option<Arc<crate::dict::DictLookups>>,
}

/// Body limit of `POST /v1/outbound` on a pod without an outbound side (it answers 503 anyway).
const NO_OUTBOUND_BODY_LIMIT: usize = 64 * 1024;

/// Which endpoints a listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routes {
    /// Everything (one listener: `http.bind` without `http.operator_bind`).
    All,
    /// Health, readiness and `/metrics` (`http.bind` beside an operator listener).
    Public,
    /// `/actors`, `/cluster` and `/v1/…` (`http.operator_bind`).
    Operator,
}

/// Every endpoint on one router.
pub fn router(state: AppState) -> Router {
    routes(state, Routes::All)
}

/// The endpoints of `which`.
pub fn routes(state: AppState, which: Routes) -> Router {
    let public = Router::new()
        .route("/health/live", get(health::live))
        .route("/health/ready", get(health::ready))
        .route("/metrics", get(metrics));
    let app = match which {
        Routes::All => public.merge(operator_routes(&state)),
        Routes::Public => public,
        Routes::Operator => operator_routes(&state),
    };
    app.with_state(state)
}

fn operator_routes(state: &AppState) -> Router<AppState> {
    let max_body = state
        .operator
        .as_ref()
        .and_then(|o| o.outbound.as_ref())
        .map_or(NO_OUTBOUND_BODY_LIMIT, |o| o.rules.max_message_bytes);
    Router::new()
        .route("/", get(status_page::page))
        .route("/ui/status.css", get(status_page::style))
        .route("/ui/status.js", get(status_page::script))
        .route("/actors", get(actors::tree))
        // Actor ids contain slashes (`slot/cpm/3`): `/actors/{id}/restart` is matched as a catch-all.
        .route("/actors/{*target}", post(actors::restart))
        .route("/cluster", get(cluster::view))
        .route("/v1/outbound", get(outbound::list).post(outbound_send::send).layer(DefaultBodyLimit::max(max_body)))
        .route("/v1/outbound/{msg_id}", get(outbound::detail))
        .route("/v1/dict/entries/{key}", get(dict::entry))
        .route("/v1/outbound/{msg_id}/reprocess", post(outbound::reprocess))
        .route("/v1/parked", get(outbound_parked::list))
        .route("/v1/parked/{ingress_ref}", get(outbound_parked::detail))
        .route("/v1/parked/{ingress_ref}/reprocess", post(outbound_parked::reprocess))
        .route("/v1/breakers/{ispb}/{channel}/reset", post(breaker::reset))
        .route("/v1/reconciliations", get(reconcile::list).post(reconcile::run))
        .route("/v1/reconciliations/{id}", get(reconcile::detail))
        .route("/v1/incidents/report", get(incident::report))
        .route("/v1/reports/timings", get(timings::report))
}

/// Binds the configured address (port 0 allowed) and serves every endpoint until `shutdown` resolves.
pub async fn serve(
    bind: SocketAddr,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>)> {
    serve_routes(bind, routes(state, Routes::All), shutdown).await
}

/// Binds `bind` (port 0 allowed) and serves `app` until `shutdown` resolves.
pub async fn serve_routes(
    bind: SocketAddr,
    app: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>)> {
    let listener = TcpListener::bind(bind).await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(shutdown).await });
    Ok((addr, task))
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    ([(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render())
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;
    use reqwest::Method;

    use super::*;
    use crate::config::Secret;

    const ADMIN: &str = "admin-token-0123456789";
    const READ: &str = "read-token-0123456789";

    const OUTBOUND_ENDPOINTS: [(Method, &str); 5] = [
        (Method::GET, "/v1/outbound/M1"),
        (Method::GET, "/v1/outbound?status=dead"),
        (Method::POST, "/v1/outbound?channel=cpm"),
        (Method::POST, "/v1/outbound/M1/reprocess"),
        (Method::POST, "/v1/breakers/99999010/cpm/reset"),
    ];

    /// A pod's HTTP side without a tree, on port 0, with the given read token and openness.
    async fn server(read: &str, reads_open: bool) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
        crate::install_crypto_provider();
        let access = Access::new(&Secret::new(ADMIN), &Secret::new(read), reads_open);
        let state = AppState {
            readiness: Readiness::default(),
            metrics: crate::telemetry::metrics_handle(),
            access,
            operator: None,
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (addr, _) = serve("127.0.0.1:0".parse().unwrap(), state, async { _ = stopped.await }).await.unwrap();
        (addr, stop)
    }

    async fn status(addr: SocketAddr, method: Method, path: &str, token: Option<&str>) -> StatusCode {
        let mut request = reqwest::Client::new().request(method, format!("http://{addr}{path}"));
        if let Some(t) = token {
            request = request.bearer_auth(t);
        }
        request.send().await.unwrap().status()
    }

    #[tokio::test]
    async fn without_an_outbound_side_every_outbound_endpoint_answers_503() {
        let (addr, _stop) = server("", true).await;
        for (method, path) in OUTBOUND_ENDPOINTS {
            let r = reqwest::Client::new().request(method, format!("http://{addr}{path}")).bearer_auth(ADMIN);
            let r = r.send().await.unwrap();
            assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE, "{path}");
            let body: serde_json::Value = r.json().await.unwrap();
            assert!(body["error"].as_str().unwrap().contains("outbound.enabled"), "{path}: {body}");
        }
    }

    #[tokio::test]
    async fn payment_data_is_read_with_the_read_or_admin_token_and_changed_only_with_the_admin_one() {
        let (addr, _stop) = server(READ, false).await;
        for (method, path) in OUTBOUND_ENDPOINTS {
            let is_read = method == Method::GET;
            assert_eq!(status(addr, method.clone(), path, None).await, StatusCode::UNAUTHORIZED, "{path}");
            assert_eq!(status(addr, method.clone(), path, Some("wrong")).await, StatusCode::UNAUTHORIZED, "{path}");
            let with_read = if is_read { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::UNAUTHORIZED };
            assert_eq!(status(addr, method.clone(), path, Some(READ)).await, with_read, "{path} with the read token");
            let with_admin = status(addr, method.clone(), path, Some(ADMIN)).await;
            assert_eq!(with_admin, StatusCode::SERVICE_UNAVAILABLE, "{path}: past the bearer check");
        }
        assert_eq!(
            status(addr, Method::POST, "/actors/slot/cpm/1/restart", Some(READ)).await,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(status(addr, Method::GET, "/metrics", None).await, StatusCode::OK, "metrics stay open");
        let (open, _stop) = server("", true).await;
        assert_eq!(status(open, Method::GET, "/v1/outbound/M1", None).await, StatusCode::SERVICE_UNAVAILABLE);
    }
}
