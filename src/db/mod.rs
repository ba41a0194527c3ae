//! Postgres plumbing: the deadpool pool (bounded waits, verified recycling,
//! `search_path` pinned to the configured schema, TCP keepalives, TLS per
//! `postgres.sslmode` over rustls) and the embedded migrations.

pub mod bounded;
mod migrate;

use std::ops::Deref;
use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::config::{ConfigError, PostgresSettings};
use crate::store_tls::{StoreTls, StoreTlsError};

pub use migrate::{MigrateError, applied_version, latest_version, migrate};

/// A pool that cannot be built: the URL or schema in config is unusable.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("postgres.url: {0}")]
    Url(#[source] tokio_postgres::Error),
    #[error("postgres.schema: {0:?} must be a plain identifier [a-z0-9_]")]
    Schema(String),
    #[error("postgres pool: {0}")]
    Build(#[from] deadpool_postgres::BuildError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Tls(#[from] StoreTlsError),
}

/// The pool, and the TLS connector its connections use — which a statement's
/// cancel request ([`bounded`]) needs too: a server that requires TLS refuses
/// a cancel sent without it. Use it as a [`Pool`].
#[derive(Clone)]
pub struct Db {
    pool: Pool,
    tls: MakeRustlsConnect,
}

impl Deref for Db {
    type Target = Pool;

    fn deref(&self) -> &Pool {
        &self.pool
    }
}

impl Db {
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The connector cancel requests go through (TLS exactly as the connections).
    pub fn tls(&self) -> MakeRustlsConnect {
        self.tls.clone()
    }
}

/// TCP keepalive on every connection: idle this long, then probes every
/// [`KEEPALIVE_INTERVAL`], the connection dead after [`KEEPALIVE_RETRIES`]
/// unanswered ones (≈ 25 s). The OS default (2 h idle) would leave a pooled
/// connection to a vanished server looking alive.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
pub const KEEPALIVE_RETRIES: u32 = 3;
/// Data sent and not acknowledged for this long (a blackholed peer while a
/// statement is on the wire, where keepalives do not probe) closes the connection.
pub const TCP_USER_TIMEOUT: Duration = Duration::from_secs(30);

/// Builds the pool without connecting: an unreachable Postgres shows up later as
/// a failed checkout (readiness 503), not as a failed start; so does a server
/// whose certificate is refused.
pub fn pool(settings: &PostgresSettings) -> Result<Db, PoolError> {
    let pg = connection_config(settings)?;
    let tls = connector(settings.tls()?.as_ref())?;
    let manager = Manager::from_config(pg, tls.clone(), ManagerConfig { recycling_method: RecyclingMethod::Verified });
    let pool = Pool::builder(manager)
        .max_size(settings.pool_size)
        .wait_timeout(Some(settings.wait_timeout))
        .create_timeout(Some(settings.create_timeout))
        .recycle_timeout(Some(settings.recycle_timeout))
        .runtime(Runtime::Tokio1)
        .build()?;
    Ok(Db { pool, tls })
}

/// rustls per `postgres.sslmode`; with `disable` a connector that is never asked
/// (the connection config says no TLS), so one type serves every mode.
fn connector(tls: Option<&StoreTls>) -> Result<MakeRustlsConnect, PoolError> {
    let config = match tls {
        Some(tls) => tls.client_config()?,
        None => crate::store_tls::trusting_nothing("postgres")?,
    };
    Ok(MakeRustlsConnect::new(config))
}

/// How each connection is opened: URL, password, schema, timeouts, keepalives.
pub fn connection_config(settings: &PostgresSettings) -> Result<tokio_postgres::Config, PoolError> {
    let mut pg = tokio_postgres::Config::from_str(&settings.url).map_err(PoolError::Url)?;
    if let Some(pw) = &settings.password {
        pg.password(pw.expose());
    }
    check_identifier(&settings.schema)?;
    // Never `prefer`: a server (or whoever answers for it) saying "no TLS" must not get plain text.
    pg.ssl_mode(if settings.tls()?.is_some() { SslMode::Require } else { SslMode::Disable });
    pg.options(format!("-c search_path={}", settings.schema));
    pg.connect_timeout(settings.create_timeout);
    pg.application_name("cabine");
    pg.keepalives(true)
        .keepalives_idle(KEEPALIVE_IDLE)
        .keepalives_interval(KEEPALIVE_INTERVAL)
        .keepalives_retries(KEEPALIVE_RETRIES)
        .tcp_user_timeout(TCP_USER_TIMEOUT);
    Ok(pg)
}

/// Schemas are interpolated into SQL (`search_path`, `CREATE SCHEMA`), so only plain names pass.
pub fn check_identifier(name: &str) -> Result<(), PoolError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit();
    if ok { Ok(()) } else { Err(PoolError::Schema(name.to_owned())) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DEFAULT_TOML, Settings};

    #[test]
    fn connections_probe_a_vanished_server_within_seconds() {
        let env = std::collections::HashMap::new();
        let settings = Settings::from_sources(DEFAULT_TOML, None, &env).expect("defaults are valid");
        let pg = connection_config(&settings.postgres).expect("the default URL parses");
        assert!(pg.get_keepalives());
        assert_eq!(pg.get_keepalives_idle(), KEEPALIVE_IDLE);
        assert_eq!(pg.get_keepalives_interval(), Some(KEEPALIVE_INTERVAL));
        assert_eq!(pg.get_keepalives_retries(), Some(KEEPALIVE_RETRIES));
        assert_eq!(pg.get_tcp_user_timeout(), Some(&TCP_USER_TIMEOUT));
    }
}
