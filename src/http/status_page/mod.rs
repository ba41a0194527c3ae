//! `GET /`: the live status page, plain HTML, CSS and a small script embedded
//! in the binary (no build step, no CDN). The script reads `/cluster` and
//! `/actors` every 2 s and draws the slot map, alerts, pods, breakers, buckets,
//! the outbound queue and the supervision tree; the incident panel and the
//! restart buttons send the token the operator types (kept in the tab only).
//! The page itself carries no data: what it shows is what those endpoints
//! answer, under their own access rules.

use axum::http::header;
use axum::response::{IntoResponse, Response};

const HTML: &str = include_str!("status.html");
const CSS: &str = include_str!("status.css");
const SCRIPT: &str = include_str!("status.js");

/// Only this origin's script, styles and requests; never framed.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                      img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

pub async fn page() -> Response {
    asset("text/html; charset=utf-8", HTML)
}

pub async fn style() -> Response {
    asset("text/css; charset=utf-8", CSS)
}

pub async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}
