//! A private `redis-server` on a free loopback port, without automatic
//! persistence, for the tests, benchmarks and chaos runs that restart, flush,
//! evict or roll Redis back (the shared one on 6379 is never touched).
//! Restarting it loses every key, like a Redis without persistence that
//! crashed — unless it was started in a directory and told to `SAVE`, in which
//! case the restart loads that older snapshot (a restore, or a failover to a
//! lagging replica). Started with [`RedisServer::start_tls`] it listens only for
//! TLS (`rediss://`), and the commands of this harness (flush, save, evict) are
//! not available on it. Dropping it kills it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::ServerTls;

#[derive(Debug, thiserror::Error)]
pub enum RedisServerError {
    #[error("starting redis-server: {0}")]
    Spawn(std::io::Error),
    #[error("redis-server on port {0} did not answer PING within {1:?}")]
    NotReady(u16, Duration),
    #[error("redis-server on port {port}: {command} answered {reply:?}")]
    Refused { port: u16, command: String, reply: String },
    #[error("redis-server on port {0}: no answer within {1:?}")]
    NoAnswer(u16, Duration),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// How long a (re)started server may take to answer PING.
const READY_WITHIN: Duration = Duration::from_secs(5);
/// Bound on one command's reply (SAVE of a test-sized data set included).
const REPLY_WITHIN: Duration = Duration::from_secs(5);
/// Deletes every key that has a TTL (PTTL ≥ 0) in one atomic call; keys without
/// one (the lease epoch) stay. Returns how many went.
const EVICT_VOLATILE: &str = "local n = 0 \
    for _, k in ipairs(redis.call('KEYS', '*')) do \
      if redis.call('PTTL', k) >= 0 then redis.call('DEL', k); n = n + 1 end \
    end \
    return n";

/// A running private redis-server.
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    /// Where `SAVE` writes `dump.rdb` and a restart loads it from; None: the working directory.
    dir: Option<PathBuf>,
    /// TLS only (`--port 0 --tls-port`), when set.
    tls: Option<ServerTls>,
}

impl RedisServer {
    /// Starts one on a free port and waits until it answers PING.
    pub async fn start() -> Result<RedisServer, RedisServerError> {
        let port = super::free_port()?;
        let mut server = RedisServer { port, child: None, dir: None, tls: None };
        server.spawn().await?;
        Ok(server)
    }

    /// Like [`RedisServer::start`], TLS only: its certificate, and client certificates
    /// required when `tls.verify_clients`. Its URL is `rediss://`.
    pub async fn start_tls(tls: &ServerTls) -> Result<RedisServer, RedisServerError> {
        let port = super::free_port()?;
        let mut server = RedisServer { port, child: None, dir: None, tls: Some(tls.clone()) };
        server.spawn().await?;
        Ok(server)
    }

    /// Like [`RedisServer::start`], with its snapshot file (`dump.rdb`) in `dir`:
    /// nothing is saved unless asked ([`RedisServer::save`]); a restart loads the
    /// last saved snapshot, if any.
    pub async fn start_in(dir: &Path) -> Result<RedisServer, RedisServerError> {
        let port = super::free_port()?;
        let mut server = RedisServer { port, child: None, dir: Some(dir.to_owned()), tls: None };
        server.spawn().await?;
        Ok(server)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Kills it (SIGKILL: every key is gone, or back to the last `SAVE`) and starts it again on the same port.
    pub async fn restart(&mut self) -> Result<(), RedisServerError> {
        self.restart_after(Duration::ZERO).await
    }

    /// Kills it, leaves it down for `down`, then starts it again on the same port.
    pub async fn restart_after(&mut self, down: Duration) -> Result<(), RedisServerError> {
        self.stop();
        tokio::time::sleep(down).await;
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
        self.expect_ok(&["FLUSHALL"]).await
    }

    /// SAVE: a snapshot of this moment, loaded by the next restart.
    pub async fn save(&self) -> Result<(), RedisServerError> {
        self.expect_ok(&["SAVE"]).await
    }

    /// Deletes every key with a TTL at once (what `volatile-*` eviction or a lagging
    /// replica can do to leases); keys without a TTL stay. How many were deleted.
    pub async fn evict_volatile(&self) -> Result<u64, RedisServerError> {
        let reply = self.command(&["EVAL", EVICT_VOLATILE, "0"]).await?;
        reply.strip_prefix(':').and_then(|n| n.parse().ok()).ok_or_else(|| self.refused("EVAL evict-volatile", &reply))
    }

    async fn expect_ok(&self, args: &[&str]) -> Result<(), RedisServerError> {
        let reply = self.command(args).await?;
        if reply == "+OK" { Ok(()) } else { Err(self.refused(&args.join(" "), &reply)) }
    }

    fn refused(&self, command: &str, reply: &str) -> RedisServerError {
        RedisServerError::Refused { port: self.port, command: command.to_owned(), reply: reply.to_owned() }
    }

    async fn spawn(&mut self) -> Result<(), RedisServerError> {
        let port = self.port.to_string();
        let mut cmd = Command::new("redis-server");
        match &self.tls {
            None => cmd.args(["--port", &port]),
            Some(tls) => cmd
                .args(["--port", "0", "--tls-port", &port])
                .arg("--tls-cert-file")
                .arg(&tls.cert)
                .arg("--tls-key-file")
                .arg(&tls.key)
                .arg("--tls-ca-cert-file")
                .arg(&tls.ca)
                .args(["--tls-auth-clients", if tls.verify_clients { "yes" } else { "no" }]),
        };
        cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]);
        if let Some(dir) = &self.dir {
            cmd.arg("--dir").arg(dir).args(["--dbfilename", "dump.rdb"]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(RedisServerError::Spawn)?;
        self.child = Some(child);
        let deadline = tokio::time::Instant::now() + READY_WITHIN;
        while tokio::time::Instant::now() < deadline {
            if self.answers().await {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(RedisServerError::NotReady(self.port, READY_WITHIN))
    }

    /// Up: PONG in plain text; under TLS, the port accepts connections (it is bound once loaded).
    async fn answers(&self) -> bool {
        match &self.tls {
            None => matches!(self.command(&["PING"]).await, Ok(r) if r == "+PONG"),
            Some(_) => TcpStream::connect(("127.0.0.1", self.port)).await.is_ok(),
        }
    }

    /// One command on a fresh connection; the first line of its reply (`+OK`, `:3`,
    /// `-ERR …`; a bulk string shows only its `$len` header).
    pub async fn command(&self, args: &[&str]) -> Result<String, RedisServerError> {
        let exchange = async {
            let mut conn = TcpStream::connect(("127.0.0.1", self.port)).await?;
            conn.write_all(&resp_array(args)).await?;
            read_line(&mut conn).await
        };
        tokio::time::timeout(REPLY_WITHIN, exchange)
            .await
            .map_err(|_| RedisServerError::NoAnswer(self.port, REPLY_WITHIN))?
    }
}

/// A command as a RESP array of bulk strings.
fn resp_array(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Reads up to the first CRLF (at most 4 KiB).
async fn read_line(conn: &mut TcpStream) -> Result<String, RedisServerError> {
    let mut buf = Vec::with_capacity(64);
    let mut chunk = [0u8; 256];
    while !buf.windows(2).any(|w| w == b"\r\n") && buf.len() < 4096 {
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let end = buf.windows(2).position(|w| w == b"\r\n").unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_is_a_resp_array_of_bulk_strings() {
        assert_eq!(
            resp_array(&["EVAL", "return 1", "0"]),
            b"*3\r\n$4\r\nEVAL\r\n$8\r\nreturn 1\r\n$1\r\n0\r\n".to_vec()
        );
    }
}
