//! Shared by the lease tests: short timings, one key prefix per test, stores
//! standing for pods, and waiting out a brand-new cluster's quarantine.
#![allow(dead_code)]

use std::time::Duration;

use cabine::config::{DEFAULT_TOML, RedisSettings, Settings};
use cabine::redis::{KeyLayout, LeaseConfig, RedisLeaseStore};
use cabine_actors::domain::ChannelId;
use cabine_actors::ports::{Acquired, Lease, LeaseStore, Pool};
use fred::prelude::{Client, ClientLike};
use tokio::time::Instant;

pub const LEASE: Duration = Duration::from_millis(1000);
pub const LOCK_DELAY: Duration = Duration::from_millis(300);
pub const DRIFT: Duration = Duration::from_millis(100);
pub const HEARTBEAT: Duration = Duration::from_millis(250);
pub const COMMAND_TIMEOUT: Duration = Duration::from_millis(500);
/// Redis TTL of a slot and length of a quarantine.
pub const TTL: Duration = Duration::from_millis(1300);
pub const STREAM: Pool = Pool::Stream(ChannelId::Cpm);

pub fn settings() -> Settings {
    Settings::from_sources(DEFAULT_TOML, None, &Default::default()).unwrap()
}

pub fn redis_settings(url: &str) -> RedisSettings {
    RedisSettings {
        url: url.to_owned(),
        command_timeout: COMMAND_TIMEOUT,
        reconnect_max_delay: Duration::from_millis(100),
        ..settings().redis
    }
}

/// One test's view of a Redis: its own key prefix, stores standing for pods.
pub struct Cluster {
    pub url: String,
    pub prefix: String,
    pub client: Client,
}

impl Cluster {
    pub async fn on(url: &str) -> Cluster {
        let client = cabine::redis::connect(&redis_settings(url)).unwrap();
        client.wait_for_connect().await.unwrap();
        Cluster { url: url.to_owned(), prefix: cabine::harness::unique_name("lease"), client }
    }

    pub async fn shared() -> Cluster {
        Cluster::on(&settings().redis.url).await
    }

    pub fn keys(&self) -> KeyLayout {
        KeyLayout::new(&self.prefix, "t", "99999010")
    }

    pub fn config(&self, pod: &str) -> LeaseConfig {
        LeaseConfig {
            keys: self.keys(),
            pod_id: pod.to_owned(),
            stream_slots: 2,
            send_slots: 1,
            lease: LEASE,
            lock_delay: LOCK_DELAY,
            drift_margin: DRIFT,
            command_timeout: COMMAND_TIMEOUT,
        }
    }

    /// A pod: its own client (connection) and store.
    pub async fn pod(&self, pod: &str) -> RedisLeaseStore {
        let client = cabine::redis::connect(&redis_settings(&self.url)).unwrap();
        client.wait_for_connect().await.unwrap();
        RedisLeaseStore::new(client, self.config(pod))
    }

    pub async fn cleanup(&self) {
        let _ = cabine::harness::delete_keys_under(&self.client, &self.prefix).await;
    }
}

/// A brand-new cluster: the first acquire finds no epoch and quarantines
/// everything for lease + lock_delay; returns once grants are possible.
pub async fn boot(store: &RedisLeaseStore) {
    let Acquired::Quarantined { remaining } = store.acquire(Pool::Leader, None).await.unwrap() else {
        panic!("a brand-new cluster must start quarantined");
    };
    assert!(remaining <= TTL && remaining >= TTL - Duration::from_millis(100), "{remaining:?}");
    tokio::time::sleep(remaining).await;
}

pub async fn granted(store: &RedisLeaseStore, pool: Pool, slot: Option<u8>) -> Lease {
    match store.acquire(pool, slot).await.unwrap() {
        Acquired::Granted(lease) => lease,
        other => panic!("expected a grant of {pool} {slot:?}, got {other:?}"),
    }
}

/// Polls `acquire` every 20 ms until granted or `within`; returns the lease and when it came.
pub async fn first_grant(store: &RedisLeaseStore, pool: Pool, within: Duration) -> Option<(Lease, Instant)> {
    let give_up = Instant::now() + within;
    while Instant::now() < give_up {
        if let Ok(Acquired::Granted(lease)) = store.acquire(pool, None).await {
            return Some((lease, Instant::now()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}
