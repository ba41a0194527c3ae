//! One `cabine run` child process: started with an environment, it reports its
//! HTTP address on its first stdout line; dropping it kills it.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

#[derive(Debug, thiserror::Error)]
pub enum PodError {
    #[error("spawning {0}: {1}")]
    Spawn(String, std::io::Error),
    #[error("pod exited before reporting its address (status {0:?})")]
    NoAddress(Option<std::process::ExitStatus>),
    #[error("pod's first line is not its address: {0}")]
    BadLine(String),
    #[error("pod not ready within {0:?}: {1}")]
    NotReady(Duration, String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// A running pod.
pub struct Pod {
    pub child: Child,
    /// Health, readiness, metrics (and the operator endpoints unless they have their own listener).
    pub http: SocketAddr,
    /// The operator endpoints (`/actors`, `/cluster`, `/v1/…`): `http` unless `http.operator_bind` is set.
    pub operator: SocketAddr,
    pub pod_id: String,
}

impl Pod {
    /// Starts `{exe} run` with `env` on top of the inherited environment and waits for its address line.
    pub async fn spawn(exe: &Path, env: &[(String, String)]) -> Result<Pod, PodError> {
        let mut cmd = Command::new(exe);
        cmd.arg("run").envs(env.iter().cloned());
        Pod::spawn_command(cmd).await
    }

    /// Starts `cmd`, a `cabine run` however wrapped (e.g. under `chroot` in an image's
    /// root filesystem), and waits for its address line.
    pub async fn spawn_command(mut cmd: Command) -> Result<Pod, PodError> {
        cmd.stdout(Stdio::piped()).stderr(Stdio::inherit()).kill_on_drop(true);
        let what = format!("{:?}", cmd.as_std().get_program());
        let mut child = cmd.spawn().map_err(|e| PodError::Spawn(what, e))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut lines = BufReader::new(stdout).lines();
        let line = match super::first_line("pod", &mut lines, super::STARTUP_BOUND).await {
            Ok(Some(line)) => line,
            Ok(None) => return Err(PodError::NoAddress(child.try_wait()?)),
            Err(e) => {
                let _ = child.start_kill();
                return Err(e.into());
            }
        };
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let v: serde_json::Value = serde_json::from_str(&line).map_err(|_| PodError::BadLine(line.clone()))?;
        let http = v["http"].as_str().and_then(|s| s.parse().ok()).ok_or_else(|| PodError::BadLine(line.clone()))?;
        let operator = v["operator"].as_str().and_then(|s| s.parse().ok()).unwrap_or(http);
        let pod_id = v["pod_id"].as_str().unwrap_or_default().to_owned();
        Ok(Pod { child, http, operator, pod_id })
    }

    /// Polls `/health/ready` until 200 or `timeout`.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), PodError> {
        let url = format!("http://{}/health/ready", self.http);
        let client = super::http_client();
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = String::from("no answer");
        while tokio::time::Instant::now() < deadline {
            match client.get(&url).timeout(Duration::from_secs(2)).send().await {
                Ok(r) if r.status().is_success() => return Ok(()),
                Ok(r) => last = r.text().await.unwrap_or_default(),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(PodError::NotReady(timeout, last))
    }

    /// Sends SIGTERM and waits up to `timeout` for the exit status.
    pub async fn terminate(&mut self, timeout: Duration) -> Result<Option<std::process::ExitStatus>, PodError> {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        Ok(tokio::time::timeout(timeout, self.child.wait()).await.ok().transpose()?)
    }

    /// Sends a signal (SIGKILL, SIGSTOP, SIGCONT, ...) to the pod.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal);
        }
    }
}
