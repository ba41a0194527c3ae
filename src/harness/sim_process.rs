//! `cabine sim` as a child process on free ports, and a client of its control
//! API (inject, audit, faults, ledger): what tests, `bench inbound` and
//! `ops/up` drive the simulator through.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::sim::{AuditReport, LaneAudit};

#[derive(Debug, thiserror::Error)]
pub enum SimProcessError {
    #[error("spawning {0}: {1}")]
    Spawn(String, std::io::Error),
    #[error("simulator exited before reporting its addresses")]
    NoAddress,
    #[error("simulator's first line is not its addresses: {0}")]
    BadLine(String),
    #[error("simulator control API: {0}")]
    Control(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// A running child simulator; dropping it kills it.
pub struct SimProcess {
    pub child: Child,
    pub primary: SocketAddr,
    pub secondary: SocketAddr,
    pub control: SimControl,
    /// The simulated DICT's listener.
    pub dict: SocketAddr,
}

impl SimProcess {
    /// Starts `{exe} sim --ispb {ispb} … {extra}` on port 0 listeners and reads its address line.
    pub async fn spawn(exe: &Path, ispb: &str, extra: &[String]) -> Result<SimProcess, SimProcessError> {
        let mut cmd = Command::new(exe);
        cmd.args(["sim", "--ispb", ispb, "--primary", "127.0.0.1:0", "--secondary", "127.0.0.1:0"])
            .args(["--control", "127.0.0.1:0", "--dict", "127.0.0.1:0"])
            .args(extra)
            .env("CABINE__LOG__FILTER", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| SimProcessError::Spawn(exe.display().to_string(), e))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut lines = BufReader::new(stdout).lines();
        let line = match super::first_line("simulator", &mut lines, super::STARTUP_BOUND).await {
            Ok(line) => line.ok_or(SimProcessError::NoAddress)?,
            Err(e) => {
                let _ = child.start_kill();
                return Err(e.into());
            }
        };
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let v: Value = serde_json::from_str(&line).map_err(|_| SimProcessError::BadLine(line.clone()))?;
        let addr = |k: &str| v[k].as_str().and_then(|s| s.parse().ok()).ok_or(SimProcessError::BadLine(line.clone()));
        let (primary, secondary, control) = (addr("primary")?, addr("secondary")?, addr("control")?);
        Ok(SimProcess { child, primary, secondary, control: SimControl::new(control), dict: addr("dict")? })
    }
}

/// A client of the simulator's control API.
#[derive(Clone)]
pub struct SimControl {
    base: String,
    http: reqwest::Client,
}

impl SimControl {
    pub fn new(addr: SocketAddr) -> SimControl {
        crate::install_crypto_provider();
        let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("a plain HTTP client");
        SimControl { base: format!("http://{addr}"), http }
    }

    /// `http://{control address}`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Queues `count` messages of `kind` (`pacs008`, `pacs002`, `malformed`) on `cpm`; their ResourceIds.
    pub async fn inject(&self, count: usize, kind: &str) -> Result<Vec<String>, SimProcessError> {
        self.inject_json(json!({ "count": count, "kind": kind })).await
    }

    pub async fn inject_json(&self, body: Value) -> Result<Vec<String>, SimProcessError> {
        let v = self.inject_answer(body).await?;
        let ids = v["ids"].as_array().ok_or_else(|| SimProcessError::Control(format!("inject answered {v}")))?;
        Ok(ids.iter().filter_map(|i| i.as_str().map(str::to_owned)).collect())
    }

    /// `POST /sim/inject` with `body`: the whole answer (`ids`, `msg_ids`, `end_to_end_ids`).
    pub async fn inject_answer(&self, body: Value) -> Result<Value, SimProcessError> {
        self.post("/sim/inject", &body).await
    }

    /// The audit lane of `channel` (`cpm` / `csm`) of the first ISPB.
    pub async fn audit(&self, channel: &str) -> Result<Value, SimProcessError> {
        let v = self.get("/sim/audit").await?;
        v["lanes"]
            .as_array()
            .and_then(|lanes| lanes.iter().find(|l| l["channel"] == channel).cloned())
            .ok_or_else(|| SimProcessError::Control(format!("no {channel} lane in {v}")))
    }

    /// Every lane of the audit, typed.
    pub async fn audit_lanes(&self) -> Result<Vec<LaneAudit>, SimProcessError> {
        let v = self.get("/sim/audit").await?;
        let report: AuditReport =
            serde_json::from_value(v).map_err(|e| SimProcessError::Control(format!("audit: {e}")))?;
        Ok(report.lanes)
    }

    /// The typed audit lane of `channel` (`cpm` / `csm`) of the first ISPB.
    pub async fn audit_lane(&self, channel: &str) -> Result<LaneAudit, SimProcessError> {
        let lanes = self.audit_lanes().await?;
        lanes
            .into_iter()
            .find(|l| l.channel == channel)
            .ok_or_else(|| SimProcessError::Control(format!("no {channel} lane in the audit")))
    }

    pub async fn faults(&self, patch: Value) -> Result<Value, SimProcessError> {
        self.post("/sim/faults", &patch).await
    }

    pub async fn get(&self, path: &str) -> Result<Value, SimProcessError> {
        let r = self.http.get(format!("{}{path}", self.base)).send().await;
        Self::json(r).await
    }

    async fn post(&self, path: &str, body: &Value) -> Result<Value, SimProcessError> {
        let r = self.http.post(format!("{}{path}", self.base)).json(body).send().await;
        Self::json(r).await
    }

    async fn json(r: reqwest::Result<reqwest::Response>) -> Result<Value, SimProcessError> {
        let r = r.map_err(|e| SimProcessError::Control(e.to_string()))?;
        let status = r.status();
        let v: Value = r.json().await.map_err(|e| SimProcessError::Control(e.to_string()))?;
        if !status.is_success() {
            return Err(SimProcessError::Control(format!("{status}: {v}")));
        }
        Ok(v)
    }
}
