//! Postgres plumbing: the deadpool pool (bounded waits, verified recycling,
//! `search_path` pinned to the configured schema) and the embedded migrations.

pub mod bounded;
mod migrate;

use std::str::FromStr;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

use crate::config::PostgresSettings;

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
}

/// Builds the pool without connecting: an unreachable Postgres shows up later as
/// a failed checkout (readiness 503), not as a failed start.
pub fn pool(settings: &PostgresSettings) -> Result<Pool, PoolError> {
    let mut pg = tokio_postgres::Config::from_str(&settings.url).map_err(PoolError::Url)?;
    if let Some(pw) = &settings.password {
        pg.password(pw.expose());
    }
    check_identifier(&settings.schema)?;
    pg.options(format!("-c search_path={}", settings.schema));
    pg.connect_timeout(settings.create_timeout);
    pg.application_name("cabine");
    let manager = Manager::from_config(pg, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Verified });
    let pool = Pool::builder(manager)
        .max_size(settings.pool_size)
        .wait_timeout(Some(settings.wait_timeout))
        .create_timeout(Some(settings.create_timeout))
        .recycle_timeout(Some(settings.recycle_timeout))
        .runtime(Runtime::Tokio1)
        .build()?;
    Ok(pool)
}

/// Schemas are interpolated into SQL (`search_path`, `CREATE SCHEMA`), so only plain names pass.
pub fn check_identifier(name: &str) -> Result<(), PoolError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit();
    if ok { Ok(()) } else { Err(PoolError::Schema(name.to_owned())) }
}
