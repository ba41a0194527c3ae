//! One statement (or a few) on a pooled connection within a deadline. On
//! timeout the statement is cancelled on the server too, so it cannot commit
//! later behind the caller's back, and its connection is taken out of the pool
//! (closed once the cancel is sent): the next caller never waits behind it,
//! never sees its own statement hit by that late cancel, and never gets a
//! connection to a server that stopped answering. A timeout, a pool error or
//! the statement's own error reach the caller as its own error type.

use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use deadpool_postgres::{Object, PoolError};
use tokio_postgres::CancelToken;

use super::Db;

/// How the caller's error type says "no connection" and "no answer in time".
pub trait Bounded: Sized {
    fn pool(e: PoolError) -> Self;
    fn timed_out(after: Duration) -> Self;
}

/// Where a [`Conn`] leaves its connection when it is dropped — at the end of
/// the work, or when the timeout drops the work — for [`with_conn`] to decide
/// its fate: back to the pool, or out of it.
type Slot = Arc<Mutex<Option<Object>>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A pooled connection lent to the work of [`with_conn`]; use it as an [`Object`].
pub struct Conn {
    object: Option<Object>,
    slot: Slot,
}

impl Deref for Conn {
    type Target = Object;

    fn deref(&self) -> &Object {
        self.object.as_ref().expect("a lent connection is there until it is dropped")
    }
}

impl DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut Object {
        self.object.as_mut().expect("a lent connection is there until it is dropped")
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        *lock(&self.slot) = self.object.take();
    }
}

/// Runs `op` on a connection from `pool`, all within `timeout`; a cancel goes
/// through the pool's TLS connector, as its connections do.
pub async fn with_conn<T, E, F, Fut>(pool: &Db, timeout: Duration, op: F) -> Result<T, E>
where
    E: Bounded,
    F: FnOnce(Conn) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let cancel: Mutex<Option<CancelToken>> = Mutex::new(None);
    let slot: Slot = Arc::default();
    let work = async {
        let conn = pool.get().await.map_err(E::pool)?;
        *lock(&cancel) = Some(conn.cancel_token());
        op(Conn { object: Some(conn), slot: slot.clone() }).await
    };
    let outcome = tokio::time::timeout(timeout, work).await;
    let object = lock(&slot).take();
    match outcome {
        Ok(outcome) => outcome,
        Err(_) => {
            let token = cancel.into_inner().unwrap_or_else(|p| p.into_inner());
            let detached = object.map(Object::take);
            let tls = pool.tls();
            tokio::spawn(async move {
                if let Some(token) = token
                    && let Err(e) = token.cancel_query(tls).await
                {
                    tracing::debug!(error = %e, "cancelling a statement past its timeout failed");
                }
                drop(detached);
            });
            Err(E::timed_out(timeout))
        }
    }
}
