//! One statement (or a few) on a pooled connection within a deadline. On
//! timeout the statement is cancelled on the server too, so it cannot commit
//! later behind the caller's back; a timeout, a pool error or the statement's
//! own error reach the caller as its own error type.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use deadpool_postgres::{Object, Pool, PoolError};
use tokio_postgres::{CancelToken, NoTls};

/// How the caller's error type says "no connection" and "no answer in time".
pub trait Bounded: Sized {
    fn pool(e: PoolError) -> Self;
    fn timed_out(after: Duration) -> Self;
}

/// Runs `op` on a connection from `pool`, all within `timeout`.
pub async fn with_conn<T, E, F, Fut>(pool: &Pool, timeout: Duration, op: F) -> Result<T, E>
where
    E: Bounded,
    F: FnOnce(Object) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let cancel: Mutex<Option<CancelToken>> = Mutex::new(None);
    let work = async {
        let conn = pool.get().await.map_err(E::pool)?;
        *cancel.lock().unwrap_or_else(|p| p.into_inner()) = Some(conn.cancel_token());
        op(conn).await
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(outcome) => outcome,
        Err(_) => {
            if let Some(token) = cancel.into_inner().unwrap_or_else(|p| p.into_inner()) {
                tokio::spawn(async move { token.cancel_query(NoTls).await });
            }
            Err(E::timed_out(timeout))
        }
    }
}
