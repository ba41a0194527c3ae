//! Harness for running cabine processes locally: isolated names, free ports,
//! child pods that report where they listen, private Redis / Postgres / NATS
//! servers to restart under them (or to reach over TLS, with throw-away
//! certificates). Used by the benchmarks, the
//! integration tests and `ops/up`, so that all three start pods the same way.

mod bus_reader;
pub mod cluster;
mod nats_server;
pub mod outbound;
mod pod;
mod postgres_server;
mod redis_server;
mod sim_process;
mod tls;

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use bus_reader::{Arrivals, BusReader};
pub use cluster::{ClusterError, ClusterSpec, LocalCluster};
pub use nats_server::{NatsServer, NatsServerError};
pub use pod::{Pod, PodError};
pub use postgres_server::{PostgresServer, PostgresServerError};
pub use redis_server::{RedisServer, RedisServerError, delete_keys_under};
pub use sim_process::{SimControl, SimProcess, SimProcessError};
pub use tls::{ServerTls, TestPki};

/// The longest a child process (pod, simulator) may take to print its address
/// line: past it the rig fails naming the process instead of waiting forever.
pub const STARTUP_BOUND: Duration = Duration::from_secs(30);

/// The longest one rig HTTP request (a pod's status, the simulator's control
/// API) may take, connection included.
pub const REQUEST_BOUND: Duration = Duration::from_secs(10);

/// The rig's HTTP client: every request bounded by [`REQUEST_BOUND`].
pub fn http_client() -> reqwest::Client {
    crate::install_crypto_provider();
    reqwest::Client::builder().timeout(REQUEST_BOUND).build().expect("a plain HTTP client")
}

/// Reads a child's first stdout line within `within`: `Ok(None)` when it
/// closed stdout first, `Err` naming `what` when it printed nothing in time (a
/// child stuck or stopped before it listens must not hold a test forever).
pub async fn first_line<R>(
    what: &str,
    lines: &mut tokio::io::Lines<R>,
    within: Duration,
) -> std::io::Result<Option<String>>
where
    R: tokio::io::AsyncBufRead + Unpin,
{
    match tokio::time::timeout(within, lines.next_line()).await {
        Ok(line) => line,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("{what} printed no address line within {within:?}"),
        )),
    }
}

/// A name no other test or run on this machine uses: `{tag}_{pid}_{n}_{nanos}`, lowercase.
pub fn unique_name(tag: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("{tag}_{}_{n}_{nanos:x}", std::process::id()).to_lowercase()
}

/// `len` letters and digits drawn from `seed` (xorshift): an identifier Postgres cannot
/// compress below its index row limit (~2.7 KB), unlike a repeated character.
pub fn incompressible(seed: u64, len: usize) -> String {
    const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(ALNUM[(x % ALNUM.len() as u64) as usize])
        })
        .collect()
}

/// A loopback port that was free a moment ago (for servers that cannot bind port 0 themselves).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Environment overrides that give one test or bench run its own Postgres schema,
/// Redis key prefix, NATS subjects and streams, and an HTTP port chosen by the OS —
/// and no Reconciler unless the run turns it on: its statement requests and
/// statements would add to every count a run judges.
pub fn isolated_env(name: &str) -> Vec<(String, String)> {
    let upper = name.to_uppercase();
    [
        ("CABINE__POSTGRES__SCHEMA", name.to_owned()),
        ("CABINE__REDIS__PREFIX", name.to_owned()),
        ("CABINE__CLUSTER__NAME", name.to_owned()),
        ("CABINE__NATS__SUBJECT_PREFIX", name.to_owned()),
        ("CABINE__NATS__INBOUND_STREAM", format!("{upper}_IN")),
        ("CABINE__NATS__OUTBOUND_STREAM", format!("{upper}_OUT")),
        ("CABINE__NATS__RESULTS_STREAM", format!("{upper}_RESULTS")),
        ("CABINE__HTTP__BIND", "127.0.0.1:0".to_owned()),
        ("CABINE__RECONCILE__ENABLED", "false".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

#[cfg(test)]
mod tests {
    use std::process::Stdio;
    use std::time::Duration;

    use tokio::io::{AsyncBufReadExt, BufReader};

    #[tokio::test]
    async fn a_child_that_never_prints_its_address_fails_the_rig_within_the_bound() {
        let mut child = tokio::process::Command::new("sh")
            .args(["-c", "sleep 30"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let started = tokio::time::Instant::now();
        let e = super::first_line("pod", &mut lines, Duration::from_millis(300)).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(e.to_string(), "pod printed no address line within 300ms");
        child.kill().await.unwrap();
        let mut quick =
            tokio::process::Command::new("sh").args(["-c", "echo ok"]).stdout(Stdio::piped()).spawn().unwrap();
        let mut lines = BufReader::new(quick.stdout.take().unwrap()).lines();
        let line = super::first_line("pod", &mut lines, Duration::from_secs(5)).await.unwrap();
        assert_eq!(line.as_deref(), Some("ok"));
        quick.wait().await.unwrap();
    }
}
