//! Shared by `tests/cluster_outbound_ops.rs`: a one-pod cluster with the
//! simulator and short outbound timings, the operator's HTTP calls on that
//! pod, the `cabine` binary as a client, and polling until a condition holds.
#![allow(dead_code)]

use std::time::Duration;

pub use crate::cluster_support::{OUTBOUND_TIMINGS, TOKEN, exe, run, until};
use anyhow::Context;
use cabine::harness::LocalCluster;
use reqwest::{Method, StatusCode};
use serde_json::Value;

/// One pod (or `pods`) against a child simulator; `extra` overrides last.
pub async fn start(tag: &str, pods: usize, extra: &[(&str, &str)]) -> LocalCluster {
    let ops: &[(&str, &str)] = &[
        ("CABINE__OUTBOUND__MAX_MESSAGE_BYTES", "65536"),
        ("CABINE__OUTBOUND__BREAKER__BREAK_TIME", "30s"),
        ("CABINE__TIMING__BACKOFF_BASE", "50ms"),
        ("CABINE__TIMING__BACKOFF_MAX", "300ms"),
    ];
    crate::cluster_support::start(tag, pods, &[OUTBOUND_TIMINGS, ops, extra]).await
}

/// The operator's HTTP calls on one pod.
pub struct Desk {
    pub base: String,
    http: reqwest::Client,
}

/// One request's options: a bearer token, headers, a body.
#[derive(Default)]
pub struct Call<'a> {
    pub token: Option<&'a str>,
    pub headers: &'a [(&'a str, &'a str)],
    pub body: Option<bytes::Bytes>,
}

impl Call<'_> {
    pub fn authorized() -> Call<'static> {
        Call { token: Some(TOKEN), ..Default::default() }
    }
}

impl Desk {
    pub fn of(c: &LocalCluster, pod: usize) -> Desk {
        Desk { base: format!("http://{}", c.pods[pod].http), http: cabine::harness::http_client() }
    }

    /// `method path` → (status, JSON body or `Null`).
    pub async fn call(&self, method: Method, path: &str, call: Call<'_>) -> anyhow::Result<(StatusCode, Value)> {
        let mut r = self.http.request(method, format!("{}{path}", self.base)).timeout(Duration::from_secs(20));
        if let Some(token) = call.token {
            r = r.bearer_auth(token);
        }
        for (k, v) in call.headers {
            r = r.header(*k, *v);
        }
        if let Some(body) = call.body {
            r = r.body(body);
        }
        let response = r.send().await.with_context(|| path.to_owned())?;
        let status = response.status();
        let text = response.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<(StatusCode, Value)> {
        self.call(Method::GET, path, Call::default()).await
    }

    pub async fn post(&self, path: &str, call: Call<'_>) -> anyhow::Result<(StatusCode, Value)> {
        self.call(Method::POST, path, call).await
    }

    /// `GET /v1/outbound/{msg_id}` until its status is `want` (or `within` passes); the last answer.
    pub async fn until_status(&self, msg_id: &str, want: &str, within: Duration) -> anyhow::Result<Value> {
        until(within, async || {
            let (_, v) = self.get(&format!("/v1/outbound/{msg_id}")).await?;
            Ok((v["status"] == want, v))
        })
        .await
    }
}

/// `cabine {args}` as a child process: (exit code, stdout, stderr).
pub async fn cli(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<(i32, String, String)> {
    let out = tokio::process::Command::new(exe()).args(args).envs(env.iter().copied()).output().await?;
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    Ok((out.status.code().unwrap_or(-1), text(out.stdout), text(out.stderr)))
}

/// The node `id` of an `/actors` tree.
pub fn actor<'a>(tree: &'a Value, id: &str) -> Option<&'a Value> {
    if tree["id"] == id {
        return Some(tree);
    }
    tree["children"].as_array()?.iter().find_map(|c| actor(c, id))
}

/// The `history` of a `GET /v1/outbound/{msg_id}` answer as (to, event) pairs.
pub fn history(detail: &Value) -> Vec<(String, String)> {
    let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
    detail["history"]
        .as_array()
        .map_or_else(Vec::new, |h| h.iter().map(|l| (text(&l["to"]), text(&l["event"]))).collect())
}
