//! How a Postgres failure reaches the slot: transient faults (connection, pool,
//! timeout, serialization, shutdown) are `Unavailable` — retry with backoff —
//! and everything else (a schema problem, a bug) is `Fatal`.

use std::error::Error as _;

use cabine_actors::ports::InboxError;
use deadpool_postgres::PoolError;
use tokio_postgres::error::SqlState;

/// SQLSTATE classes and codes worth retrying.
fn transient_code(code: &SqlState) -> bool {
    let c = code.code();
    c.starts_with("08") // connection exception
        || c.starts_with("53") // insufficient resources (too many connections, disk full)
        || c.starts_with("57P") // admin/crash shutdown, cannot connect now
        || [SqlState::T_R_SERIALIZATION_FAILURE, SqlState::T_R_DEADLOCK_DETECTED, SqlState::QUERY_CANCELED]
            .contains(code)
        || *code == SqlState::LOCK_NOT_AVAILABLE
}

/// True when retrying the same statement later may succeed.
pub fn is_transient(e: &tokio_postgres::Error) -> bool {
    if let Some(code) = e.code() {
        return transient_code(code);
    }
    if e.is_closed() || e.source().is_some_and(|s| s.is::<std::io::Error>()) {
        return true;
    }
    let text = e.to_string();
    text.starts_with("error connecting") || text.starts_with("timeout") || text.starts_with("error communicating")
}

pub fn from_postgres(e: tokio_postgres::Error) -> InboxError {
    let detail = match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    };
    if is_transient(&e) { InboxError::Unavailable(detail) } else { InboxError::Fatal(detail) }
}

impl crate::db::bounded::Bounded for InboxError {
    fn pool(e: PoolError) -> Self {
        from_pool(e)
    }

    fn timed_out(after: std::time::Duration) -> Self {
        InboxError::Unavailable(format!("no answer within {after:?}"))
    }
}

pub fn from_pool(e: PoolError) -> InboxError {
    match e {
        PoolError::Backend(e) => from_postgres(e),
        PoolError::NoRuntimeSpecified => InboxError::Fatal("postgres pool without a runtime".into()),
        other => InboxError::Unavailable(format!("postgres pool: {other}")),
    }
}
