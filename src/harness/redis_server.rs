//! A private `redis-server` on a free loopback port, without persistence, for
//! the tests and benchmarks that restart or flush Redis (the shared one on 6379
//! is never touched). Restarting it loses every key, like a Redis without
//! persistence that crashed. Dropping it kills it.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug, thiserror::Error)]
pub enum RedisServerError {
    #[error("starting redis-server: {0}")]
    Spawn(std::io::Error),
    #[error("redis-server on port {0} did not answer PING within {1:?}")]
    NotReady(u16, Duration),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// How long a (re)started server may take to answer PING.
const READY_WITHIN: Duration = Duration::from_secs(5);

/// A running private redis-server.
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts one on a free port and waits until it answers PING.
    pub async fn start() -> Result<RedisServer, RedisServerError> {
        let port = super::free_port()?;
        let mut server = RedisServer { port, child: None };
        server.spawn().await?;
        Ok(server)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills it (SIGKILL: every key is gone) and starts it again on the same port.
    pub async fn restart(&mut self) -> Result<(), RedisServerError> {
        self.stop();
        self.spawn().await
    }

    /// Kills it, if it runs; clients see connection refused until [`RedisServer::restart`].
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// FLUSHALL: every key gone, the server (and its script cache) stays up.
    pub async fn flush_all(&self) -> Result<(), RedisServerError> {
        let reply = self.command(b"FLUSHALL\r\n").await?;
        if reply.starts_with(b"+OK") { Ok(()) } else { Err(RedisServerError::NotReady(self.port, Duration::ZERO)) }
    }

    async fn spawn(&mut self) -> Result<(), RedisServerError> {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(RedisServerError::Spawn)?;
        self.child = Some(child);
        let deadline = tokio::time::Instant::now() + READY_WITHIN;
        while tokio::time::Instant::now() < deadline {
            if matches!(self.command(b"PING\r\n").await, Ok(r) if r.starts_with(b"+PONG")) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(RedisServerError::NotReady(self.port, READY_WITHIN))
    }

    /// One inline command, first reply bytes.
    async fn command(&self, line: &[u8]) -> Result<Vec<u8>, RedisServerError> {
        let mut conn = TcpStream::connect(("127.0.0.1", self.port)).await?;
        conn.write_all(line).await?;
        let mut buf = vec![0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(1), conn.read(&mut buf))
            .await
            .map_err(|_| RedisServerError::NotReady(self.port, Duration::from_secs(1)))??;
        buf.truncate(n);
        Ok(buf)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Deletes every key under `{prefix}:` (SCAN, then DEL): test and bench cleanup.
pub async fn delete_keys_under(client: &fred::prelude::Client, prefix: &str) -> Result<u64, fred::error::Error> {
    use fred::prelude::KeysInterface;
    use futures::TryStreamExt;
    let keys: Vec<fred::types::Key> =
        client.scan_buffered(format!("{prefix}:*"), Some(500), None).try_collect().await?;
    let mut deleted = 0;
    for chunk in keys.chunks(500) {
        deleted += client.del::<u64, _>(chunk.to_vec()).await?;
    }
    Ok(deleted)
}
