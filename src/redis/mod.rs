//! Redis: the fred client cabine coordinates through, built with a command
//! timeout, a bounded command queue and a reconnect policy with a capped delay,
//! so an unreachable Redis fails calls fast (fail closed) instead of hanging;
//! over rustls with a `rediss://` URL (`redis.ca_file`, optional client
//! certificate); and the coordination adapters built on it: leased slots and
//! pod heartbeats.

mod epoch;
pub mod grant;
pub mod keys;
mod lease_metrics;
pub mod leases;
pub mod pods;
pub mod policy;
pub mod scripts;

pub mod breaker;
pub mod bucket;
pub mod guard;

use fred::prelude::*;

pub use keys::KeyLayout;
pub use leases::{LeaseConfig, RedisLeaseStore};
pub use pods::RedisPodRegistry;

use crate::config::{ConfigError, RedisSettings};
use crate::store_tls::StoreTlsError;

/// A client that cannot be built from the configuration.
#[derive(Debug, thiserror::Error)]
pub enum RedisClientError {
    #[error("redis.url: {0}")]
    Url(#[source] fred::error::Error),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Tls(#[from] StoreTlsError),
    #[error("redis client: {0}")]
    Build(#[source] fred::error::Error),
}

/// Builds and starts connecting a client; never waits for Redis to be up. A
/// server whose certificate is refused stays unreachable: calls fail, readiness says so.
pub fn connect(settings: &RedisSettings) -> Result<Client, RedisClientError> {
    let client = build(settings)?;
    client.connect();
    Ok(client)
}

/// The client, not connected yet.
pub fn build(settings: &RedisSettings) -> Result<Client, RedisClientError> {
    let mut config = Config::from_url(&without_tls_scheme(&settings.url)).map_err(RedisClientError::Url)?;
    if let Some(tls) = settings.tls()? {
        config.tls = Some(fred::types::config::TlsConnector::from(tls.client_config()?).into());
    }
    if let Some(pw) = &settings.password {
        config.password = Some(pw.expose().to_owned());
    }
    let max_delay = u32::try_from(settings.reconnect_max_delay.as_millis()).unwrap_or(u32::MAX);
    let client = Builder::from_config(config)
        .with_connection_config(|c| {
            c.connection_timeout = settings.connect_timeout;
            c.internal_command_timeout = settings.command_timeout;
            c.max_command_buffer_len = settings.max_command_queue;
            c.max_command_attempts = 1;
        })
        .with_performance_config(|p| {
            p.default_command_timeout = settings.command_timeout;
        })
        .set_policy(ReconnectPolicy::new_exponential(0, 50, max_delay.max(50), 2))
        .build()
        .map_err(RedisClientError::Build)?;
    Ok(client)
}

/// `rediss://…` → `redis://…` (and `valkeys` → `valkey`): fred would otherwise build
/// its own TLS from the system roots; ours, from `redis.ca_file`, replaces it.
fn without_tls_scheme(url: &str) -> String {
    for (tls, plain) in [("rediss", "redis"), ("valkeys", "valkey")] {
        if let Some(rest) = url.strip_prefix(tls) {
            return format!("{plain}{rest}");
        }
    }
    url.to_owned()
}

#[cfg(test)]
mod tests {
    use super::without_tls_scheme;

    #[test]
    fn the_tls_scheme_is_ours_to_handle() {
        assert_eq!(without_tls_scheme("rediss://h:6380/0"), "redis://h:6380/0");
        assert_eq!(without_tls_scheme("rediss-cluster://h:1"), "redis-cluster://h:1");
        assert_eq!(without_tls_scheme("redis://h:6379"), "redis://h:6379");
    }
}
