//! The judge: a minimal HTTP server that counts concurrent requests on ITS side,
//! as the Central Bank does, and its client. `GET /hold/{ms}/{tag}` is held for
//! `ms` (at most 1 s) and answered 200. A request counts from the moment its
//! head is read until the server starts its response; a client that paused and
//! sends nothing is (rightly) not counted.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cabine_actors::ports::Lease;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Bounds: request head, hold, distinct tags counted.
const MAX_HEAD: usize = 1024;
const MAX_HOLD: Duration = Duration::from_secs(1);
const MAX_TAGS: usize = 1024;
const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";

#[derive(Default)]
struct Counts {
    in_flight: AtomicU64,
    max: AtomicU64,
    requests: AtomicU64,
    per_tag: Mutex<HashMap<String, u64>>,
}

/// A running judge; dropping it stops it.
pub struct Judge {
    addr: SocketAddr,
    counts: Arc<Counts>,
    arrivals: watch::Receiver<u64>,
    task: JoinHandle<()>,
}

impl Judge {
    /// Listens on a loopback port chosen by the OS.
    pub async fn start() -> io::Result<Judge> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let counts = Arc::new(Counts::default());
        let (tx, arrivals) = watch::channel(0);
        let tx = Arc::new(tx);
        let shared = counts.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                tokio::spawn(serve(stream, shared.clone(), tx.clone()));
            }
        });
        Ok(Judge { addr, counts, arrivals, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The most requests it ever held at once.
    pub fn max_concurrent(&self) -> u64 {
        self.counts.max.load(Ordering::SeqCst)
    }

    pub fn requests(&self) -> u64 {
        self.counts.requests.load(Ordering::SeqCst)
    }

    pub fn requests_from(&self, tag: &str) -> u64 {
        self.counts.per_tag.lock().unwrap_or_else(|e| e.into_inner()).get(tag).copied().unwrap_or(0)
    }

    /// Changes on every request arrival (the value is the total so far).
    pub fn arrivals(&self) -> watch::Receiver<u64> {
        self.arrivals.clone()
    }
}

impl Drop for Judge {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut stream: TcpStream, counts: Arc<Counts>, arrivals: Arc<watch::Sender<u64>>) {
    let mut buf = Vec::with_capacity(256);
    while let Ok(Some((hold, tag))) = read_head(&mut stream, &mut buf).await {
        let now = counts.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        counts.max.fetch_max(now, Ordering::SeqCst);
        let total = counts.requests.fetch_add(1, Ordering::SeqCst) + 1;
        count_tag(&counts, tag);
        arrivals.send_replace(total);
        tokio::time::sleep(hold).await;
        // Done on our side before the first response byte leaves: the client can
        // only react (release, another holder sends) after this point.
        counts.in_flight.fetch_sub(1, Ordering::SeqCst);
        if stream.write_all(RESPONSE).await.is_err() {
            return;
        }
    }
}

fn count_tag(counts: &Counts, tag: String) {
    let mut per_tag = counts.per_tag.lock().unwrap_or_else(|e| e.into_inner());
    if per_tag.len() < MAX_TAGS || per_tag.contains_key(&tag) {
        *per_tag.entry(tag).or_default() += 1;
    }
}

/// Reads one request head; `None` at a clean end of the connection.
async fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<Option<(Duration, String)>> {
    buf.clear();
    let mut byte = [0u8; 256];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut byte).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&byte[..n]);
        if buf.len() > MAX_HEAD {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "request head too large"));
        }
    }
    parse_head(buf).map(Some).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not GET /hold/{ms}/{tag}"))
}

fn parse_head(head: &[u8]) -> Option<(Duration, String)> {
    let line = std::str::from_utf8(head).ok()?.lines().next()?;
    let path = line.strip_prefix("GET /hold/")?.split(' ').next()?;
    let (ms, tag) = path.split_once('/')?;
    let hold = Duration::from_millis(ms.parse().ok()?).min(MAX_HOLD);
    Some((hold, tag.to_owned()))
}

/// What became of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// Sent and answered.
    Answered,
    /// Not sent: the lease could not outlive the request. `expired`: it had
    /// already expired (the holder was paused or starved past `valid_until`).
    NotSent { expired: bool },
}

/// One keep-alive connection to the judge, used by one holder at a time.
pub struct JudgeClient {
    addr: SocketAddr,
    tag: String,
    conn: Option<TcpStream>,
}

impl JudgeClient {
    pub fn new(addr: SocketAddr, tag: &str) -> JudgeClient {
        JudgeClient { addr, tag: tag.to_owned(), conn: None }
    }

    /// Sends one request held `hold` by the judge, only if `lease` outlives `timeout`;
    /// the validity check is the last thing before the bytes are written.
    pub async fn request(&mut self, lease: &Lease, hold: Duration, timeout: Duration) -> io::Result<Sent> {
        let not_sent = |lease: &Lease| Sent::NotSent { expired: !lease.is_valid() };
        if !lease.is_valid_for(timeout) {
            return Ok(not_sent(lease));
        }
        let head = format!("GET /hold/{}/{} HTTP/1.1\r\nhost: judge\r\n\r\n", hold.as_millis(), self.tag);
        let conn = match self.conn.take() {
            Some(conn) => conn,
            None => connect(self.addr).await?,
        };
        if !lease.is_valid_for(timeout) {
            self.conn = Some(conn);
            return Ok(not_sent(lease));
        }
        let mut conn = conn;
        match tokio::time::timeout(timeout, exchange(&mut conn, head.as_bytes())).await {
            Ok(Ok(())) => {
                self.conn = Some(conn);
                Ok(Sent::Answered)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "judge did not answer in time")),
        }
    }
}

async fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    let conn = TcpStream::connect(addr).await?;
    conn.set_nodelay(true)?;
    Ok(conn)
}

async fn exchange(conn: &mut TcpStream, head: &[u8]) -> io::Result<()> {
    conn.write_all(head).await?;
    let mut reply = Vec::with_capacity(RESPONSE.len());
    let mut chunk = [0u8; 128];
    while !reply.ends_with(b"\r\n\r\n") {
        let n = conn.read(&mut chunk).await?;
        if n == 0 || reply.len() > MAX_HEAD {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "judge closed the connection"));
        }
        reply.extend_from_slice(&chunk[..n]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hold_and_tag() {
        let (hold, tag) = parse_head(b"GET /hold/25/w123 HTTP/1.1\r\nhost: judge\r\n\r\n").unwrap();
        assert_eq!((hold, tag.as_str()), (Duration::from_millis(25), "w123"));
        assert_eq!(parse_head(b"GET /hold/99999/x HTTP/1.1\r\n\r\n").unwrap().0, MAX_HOLD);
        assert!(parse_head(b"POST /x HTTP/1.1\r\n\r\n").is_none());
    }
}
