//! Redis: the fred client cabine coordinates through, built with a command
//! timeout, a bounded command queue and a reconnect policy with a capped delay,
//! so an unreachable Redis fails calls fast (fail closed) instead of hanging;
//! and the coordination adapters built on it: leased slots and pod heartbeats.

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

use crate::config::RedisSettings;

/// Builds and starts connecting a client; never waits for Redis to be up.
pub fn connect(settings: &RedisSettings) -> Result<Client, fred::error::Error> {
    let mut config = Config::from_url(&settings.url)?;
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
        .build()?;
    client.connect();
    Ok(client)
}
