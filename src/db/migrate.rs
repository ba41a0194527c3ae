//! Embedded refinery migrations, applied under a Postgres advisory lock so
//! several pods starting together migrate once.

use deadpool_postgres::Pool;

refinery::embed_migrations!("migrations");

/// Arbitrary constant shared by every cabine process: the migration lock's key.
const MIGRATION_LOCK_KEY: i64 = 0x6361_6269_6e65; // "cabine"

/// The longest a migrator waits for another's lock (one key for every schema of
/// a server): past it the attempt fails naming the lock, and `migrate_on_start`
/// retries, instead of waiting forever behind a stuck session.
const MIGRATION_LOCK_WAIT: &str = "60s";

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("postgres unavailable: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("migration failed: {0}")]
    Refinery(#[from] refinery::Error),
}

/// Creates the schema if needed and applies every pending migration. Idempotent.
pub async fn migrate(pool: &Pool, schema: &str) -> Result<Option<i64>, MigrateError> {
    let mut conn = pool.get().await?;
    conn.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}")).await?;
    conn.batch_execute(&format!("SET lock_timeout = '{MIGRATION_LOCK_WAIT}'")).await?;
    let locked = conn.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK_KEY]).await;
    conn.batch_execute("RESET lock_timeout").await?;
    locked?;
    let client: &mut tokio_postgres::Client = &mut conn;
    let outcome = migrations::runner().set_abort_divergent(true).run_async(client).await;
    conn.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK_KEY]).await?;
    outcome?;
    applied_version(pool).await
}

/// The newest migration compiled into this binary.
pub fn latest_version() -> i64 {
    migrations::runner().get_migrations().iter().map(|m| i64::from(m.version())).max().unwrap_or(0)
}

/// The newest migration applied in the configured schema, `None` when none is.
pub async fn applied_version(pool: &Pool) -> Result<Option<i64>, MigrateError> {
    let conn = pool.get().await?;
    let exists =
        conn.query_one("SELECT to_regclass('refinery_schema_history') IS NOT NULL", &[]).await?.get::<_, bool>(0);
    if !exists {
        return Ok(None);
    }
    let row = conn.query_one("SELECT MAX(version)::int8 FROM refinery_schema_history", &[]).await?;
    Ok(row.get::<_, Option<i64>>(0))
}
