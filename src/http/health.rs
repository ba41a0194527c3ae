//! `/health/live` (the process answers) and `/health/ready` (every dependency
//! reachable, migrations applied, not stopping; 503 naming what fails).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;

use super::AppState;

pub async fn live() -> impl IntoResponse {
    (StatusCode::OK, "live\n")
}

pub async fn ready(State(state): State<AppState>) -> impl IntoResponse {
    let report = state.readiness.report();
    let status = if report.ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(report))
}
