//! A private `nats-server -js` on a free loopback port with its JetStream store
//! in a temporary directory, for the runs that restart NATS under the pods
//! (`cabine chaos --scenario nats-restart`); the shared one on 4222 is never
//! touched. Streams and their messages live on disk, so they survive a restart.
//! A restart is graceful (SIGTERM: the server flushes its store and exits), as
//! an orchestrated restart of the bus would be. Started with
//! [`NatsServer::start_tls`] it requires TLS (`tls://`, a `tls {}` block in a
//! config file). Dropping it kills it and removes its directory.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use super::ServerTls;

#[derive(Debug, thiserror::Error)]
pub enum NatsServerError {
    #[error("starting nats-server: {0}")]
    Spawn(std::io::Error),
    #[error("nats-server on port {0} did not greet within {1:?}")]
    NotReady(u16, Duration),
    #[error("nats-server on port {0} did not exit within {1:?} of SIGTERM")]
    NoExit(u16, Duration),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// How long a (re)started server may take to send its INFO greeting.
const READY_WITHIN: Duration = Duration::from_secs(10);
/// How long a graceful stop may take before it is a failure.
const EXIT_WITHIN: Duration = Duration::from_secs(10);

/// A running private nats-server.
pub struct NatsServer {
    port: u16,
    /// The JetStream store (`-sd`).
    dir: PathBuf,
    child: Option<Child>,
    /// TLS required, when set.
    tls: Option<ServerTls>,
}

impl NatsServer {
    /// Starts one with JetStream on a free port and waits for its greeting.
    pub async fn start() -> Result<NatsServer, NatsServerError> {
        NatsServer::start_with(None).await
    }

    /// Like [`NatsServer::start`], requiring TLS with this certificate (and client
    /// certificates when `tls.verify_clients`). Its URL is `tls://`.
    pub async fn start_tls(tls: &ServerTls) -> Result<NatsServer, NatsServerError> {
        NatsServer::start_with(Some(tls.clone())).await
    }

    async fn start_with(tls: Option<ServerTls>) -> Result<NatsServer, NatsServerError> {
        let dir = std::env::temp_dir().join(super::unique_name("cabine_nats"));
        std::fs::create_dir_all(&dir)?;
        let mut server = NatsServer { port: super::free_port()?, dir, child: None, tls };
        server.spawn().await?;
        Ok(server)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "tls" } else { "nats" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// SIGTERM, wait for the exit, stay down for `down`, start again on the same port and store.
    pub async fn restart_after(&mut self, down: Duration) -> Result<(), NatsServerError> {
        self.stop_gracefully().await?;
        tokio::time::sleep(down).await;
        self.spawn().await
    }

    async fn stop_gracefully(&mut self) -> Result<(), NatsServerError> {
        let Some(mut child) = self.child.take() else { return Ok(()) };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = tokio::time::Instant::now() + EXIT_WITHIN;
        while child.try_wait()?.is_none() {
            if tokio::time::Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(NatsServerError::NoExit(self.port, EXIT_WITHIN));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    async fn spawn(&mut self) -> Result<(), NatsServerError> {
        let mut cmd = Command::new("nats-server");
        if let Some(tls) = &self.tls {
            cmd.arg("-c").arg(self.write_tls_config(tls)?);
        }
        let child = cmd
            .args(["-js", "-a", "127.0.0.1", "-p", &self.port.to_string(), "-sd"])
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(NatsServerError::Spawn)?;
        self.child = Some(child);
        let deadline = tokio::time::Instant::now() + READY_WITHIN;
        while tokio::time::Instant::now() < deadline {
            if self.greets().await {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(NatsServerError::NotReady(self.port, READY_WITHIN))
    }

    /// `tls.conf` in its directory: the `tls {}` block (the rest stays on the command line).
    fn write_tls_config(&self, tls: &ServerTls) -> Result<PathBuf, NatsServerError> {
        let quoted = |p: &std::path::Path| format!("{:?}", p.display().to_string());
        let text = format!(
            "tls {{\n  cert_file: {}\n  key_file: {}\n  ca_file: {}\n  verify: {}\n  timeout: 2\n}}\n",
            quoted(&tls.cert),
            quoted(&tls.key),
            quoted(&tls.ca),
            tls.verify_clients
        );
        let path = self.dir.join("tls.conf");
        std::fs::write(&path, text)?;
        Ok(path)
    }

    /// A client connecting is greeted with `INFO {…}` (in plain text, TLS or not).
    async fn greets(&self) -> bool {
        let read = async {
            let mut conn = TcpStream::connect(("127.0.0.1", self.port)).await.ok()?;
            let mut buf = [0u8; 4];
            conn.read_exact(&mut buf).await.ok()?;
            Some(buf == *b"INFO")
        };
        tokio::time::timeout(Duration::from_secs(1), read).await.ok().flatten().unwrap_or(false)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
