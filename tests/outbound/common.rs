//! Shared by the outbound tests: isolated settings and clients, and cleanup.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cabine::config::{ChannelId, DEFAULT_TOML, Settings};
use cabine::harness::{isolated_env, unique_name};
use cabine::redis::guard::GuardKeys;
use fred::prelude::*;

/// Defaults, isolated under a fresh name, plus `extra` overrides.
pub fn settings(tag: &str, extra: &[(&str, &str)]) -> Settings {
    let mut env: HashMap<String, String> = isolated_env(&unique_name(tag)).into_iter().collect();
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Settings::from_sources(DEFAULT_TOML, None, &env).expect("test settings are valid")
}

pub async fn redis(settings: &Settings) -> Client {
    let client = cabine::redis::connect(&settings.redis).expect("redis client");
    client.wait_for_connect().await.expect("redis up");
    client
}

pub fn keys(settings: &Settings) -> GuardKeys {
    GuardKeys::new(&settings.redis.prefix, &settings.cluster.name, &settings.cluster.ispb)
}

/// Deletes every guard key of this test.
pub async fn clean_redis(client: &Client, settings: &Settings) {
    let k = keys(settings);
    let all: Vec<String> =
        ChannelId::ALL.into_iter().flat_map(|c| ["bucket", "breaker", "breaker:probes"].map(|w| k.of(c, w))).collect();
    let _: i64 = client.del(all).await.expect("cleanup");
}

/// A private `redis-server` on a free port, killed on drop.
pub struct PrivateRedis {
    child: Child,
    pub url: String,
}

impl PrivateRedis {
    pub async fn start() -> PrivateRedis {
        let port = cabine::harness::free_port().unwrap();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--save", "", "--appendonly", "no", "--bind", "127.0.0.1"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on PATH");
        let redis = PrivateRedis { child, url: format!("redis://127.0.0.1:{port}") };
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return redis;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("private redis did not start");
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Milliseconds since the epoch of a Brasília (UTC−3) local time on 2024-01-02.
pub fn brasilia_ms(h: u64, m: u64, s: u64) -> u64 {
    const JAN_2_2024_UTC: u64 = 19_724 * 86_400_000;
    JAN_2_2024_UTC + ((h + 3) * 3600 + m * 60 + s) * 1000
}
