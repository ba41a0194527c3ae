//! Reading outbound rows and history lines back from Postgres, and the split
//! of Postgres errors into transient (`Unavailable`), refused values
//! (`Refused`: a data exception) and fatal (a statement cut by the query
//! timeout is transient).

use std::time::SystemTime;

use cabine_actors::ports::outbound::{HistoryEntry, OutboundError, OutboundRow, Priority};
use tokio_postgres::Row;

/// The columns [`outbound_row`] reads, in its order.
pub(super) const ROW_COLUMNS: &str = "id, msg_id, msg_type, channel, priority, deadline, status, attempts, not_before, \
     resource_ids, last_error, ingress_ref, created_at, updated_at, sent_at, confirmed_at, unconfirmed_since";

pub(super) fn outbound_row(r: &Row) -> Result<OutboundRow, OutboundError> {
    let rank: i16 = get(r, 4)?;
    Ok(OutboundRow {
        id: get(r, 0)?,
        msg_id: get(r, 1)?,
        msg_type: get(r, 2)?,
        channel: get::<Option<String>>(r, 3)?.map(|c| c.parse()).transpose().map_err(OutboundError::Fatal)?,
        priority: Priority::from_rank(rank).ok_or_else(|| OutboundError::Fatal(format!("priority rank {rank}")))?,
        deadline: get(r, 5)?,
        status: get::<String>(r, 6)?.parse().map_err(OutboundError::Fatal)?,
        attempts: u32::try_from(get::<i32>(r, 7)?).unwrap_or(0),
        not_before: get(r, 8)?,
        resource_ids: get(r, 9)?,
        last_error: get(r, 10)?,
        ingress_ref: get(r, 11)?,
        created_at: get(r, 12)?,
        updated_at: get(r, 13)?,
        sent_at: get(r, 14)?,
        confirmed_at: get(r, 15)?,
        unconfirmed_since: get(r, 16)?,
    })
}

/// Reads `at, from_status, to_status, attempt, event, detail`.
pub(super) fn history_entry(r: &Row) -> Result<HistoryEntry, OutboundError> {
    let status = |s: String| s.parse().map_err(OutboundError::Fatal);
    Ok(HistoryEntry {
        at: get::<SystemTime>(r, 0)?,
        from: get::<Option<String>>(r, 1)?.map(status).transpose()?,
        to: status(get(r, 2)?)?,
        attempt: u32::try_from(get::<i32>(r, 3)?).unwrap_or(0),
        event: get::<Option<String>>(r, 4)?.map(|e| e.parse().map_err(OutboundError::Fatal)).transpose()?,
        detail: get(r, 5)?,
    })
}

pub(super) fn get<'a, T: tokio_postgres::types::FromSql<'a>>(r: &'a Row, i: usize) -> Result<T, OutboundError> {
    r.try_get(i).map_err(|e| OutboundError::Fatal(format!("column {i}: {e}")))
}

/// Connection trouble, shutdown, resource exhaustion, serialization failure and
/// deadlock are transient; values Postgres cannot take (a data exception, an
/// index row too large) are refused; anything else (a constraint, a bad
/// query) is a bug.
pub(crate) fn pg_error(e: &tokio_postgres::Error) -> OutboundError {
    let transient_class =
        |code: &str| ["08", "53", "57", "58"].iter().any(|c| code.starts_with(c)) || code == "40001" || code == "40P01";
    match e.code() {
        Some(code) if transient_class(code.code()) => OutboundError::Unavailable(e.to_string()),
        Some(code) if is_data_error(code.code()) => OutboundError::Refused(db_detail(e)),
        Some(_) => OutboundError::Fatal(e.to_string()),
        None if e.is_closed() || io_source(e) => OutboundError::Unavailable(e.to_string()),
        None => OutboundError::Fatal(e.to_string()),
    }
}

/// SQLSTATE class 22 (data exception: NUL in text, bad encoding, a bad
/// escape in JSON…) or 54000 (program limit exceeded: an index row too large).
pub(crate) fn is_data_error(code: &str) -> bool {
    code.starts_with("22") || code == "54000"
}

/// `message (SQLSTATE)`, without the values (they are what was refused).
fn db_detail(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

fn io_source(e: &tokio_postgres::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.is::<std::io::Error>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// A pool wait or a statement past `postgres.query_timeout` is transient: retry.
impl crate::db::bounded::Bounded for OutboundError {
    fn pool(e: deadpool_postgres::PoolError) -> Self {
        pool_error(e)
    }

    fn timed_out(after: std::time::Duration) -> Self {
        OutboundError::Unavailable(format!("postgres: no answer within {after:?} (statement cancelled)"))
    }
}

pub(crate) fn pool_error(e: deadpool_postgres::PoolError) -> OutboundError {
    use deadpool_postgres::PoolError as P;
    match e {
        P::Backend(e) => pg_error(&e),
        P::Timeout(_) | P::PostCreateHook(_) => OutboundError::Unavailable(e.to_string()),
        P::Closed | P::NoRuntimeSpecified => OutboundError::Fatal(e.to_string()),
    }
}
