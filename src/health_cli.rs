//! `cabine health [--ready]`: the pod's own probe from inside its container —
//! `GET /health/live` (or `/health/ready`) on `http.bind`, exit 0 on 200, 1
//! otherwise. For runtimes whose health check runs a command (ECS, the image's
//! `HEALTHCHECK`), since the image carries no shell and no curl.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use crate::config::Settings;

#[derive(Debug, Clone, Args)]
pub struct HealthArgs {
    /// Ask `/health/ready` (every dependency reachable) instead of `/health/live`.
    #[arg(long)]
    pub ready: bool,
    /// The pod's base URL. Default: `http.bind` (a wildcard bind asked on loopback).
    #[arg(long)]
    pub pod: Option<String>,
    /// Give up after this long.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

pub async fn health(args: HealthArgs, settings: &Settings) -> anyhow::Result<ExitCode> {
    let base = args.pod.unwrap_or_else(|| crate::outbound_cli::default_pod(settings.http.bind));
    let path = if args.ready { "health/ready" } else { "health/live" };
    let url = format!("{}/{path}", base.trim_end_matches('/'));
    let http = reqwest::Client::builder().timeout(args.timeout).build().context("an HTTP client")?;
    let answer = match http.get(&url).send().await {
        Ok(response) => response,
        Err(e) => {
            eprintln!("{url}: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let status = answer.status();
    let body = answer.text().await.unwrap_or_default();
    println!("{} {}", status.as_u16(), body.trim_end());
    Ok(if status.is_success() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
