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
use std::time::{SystemTime, UNIX_EPOCH};

pub use bus_reader::{Arrivals, BusReader};
pub use cluster::{ClusterError, ClusterSpec, LocalCluster};
pub use nats_server::{NatsServer, NatsServerError};
pub use pod::{Pod, PodError};
pub use postgres_server::{PostgresServer, PostgresServerError};
pub use redis_server::{RedisServer, RedisServerError, delete_keys_under};
pub use sim_process::{SimControl, SimProcess, SimProcessError};
pub use tls::{ServerTls, TestPki};

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
            (x ^= x << 13, x ^= x >> 7, x ^= x << 17);
            char::from(ALNUM[(x % ALNUM.len() as u64) as usize])
        })
        .collect()
}

/// A loopback port that was free a moment ago (for servers that cannot bind port 0 themselves).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Environment overrides that give one test or bench run its own Postgres schema,
/// Redis key prefix, NATS subjects and streams, and an HTTP port chosen by the OS.
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
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}
