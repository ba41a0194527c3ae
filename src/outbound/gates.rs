//! The send slots' gate rows on Postgres (`send_slot`, DESIGN §2.5): a new
//! holder of send slot n claims its row (next fence) and learns what is left
//! of the previous holder's busy window; every POST is preceded by a fenced
//! write of `busy_until = greatest(busy_until, now() + busy_for)`; a release
//! clears it when nothing of its holder is in flight. Bounded statements,
//! cancelled on the server past `query_timeout`.

use std::time::Duration;

use cabine_actors::domain::{ChannelId, Ispb};
use cabine_actors::ports::{GateClaim, GateError, SendGates};
use deadpool_postgres::{Object, PoolError};

use crate::db::Db;
use crate::db::bounded::{self, Bounded};
use crate::inbox::is_transient;

/// The next fence; `wait_ms` from `busy_until` as the claim found it (kept in
/// `claimed_over`); the claim's own window arms the first POST only when `wait_ms` is 0.
const CLAIM: &str = "\
INSERT INTO send_slot (ispb, channel, slot, fence, holder, updated_at, busy_until)
VALUES ($1, $2, $3, 1, $4, now(), now() + $5::bigint * interval '1 millisecond')
ON CONFLICT (ispb, channel, slot)
DO UPDATE SET fence = send_slot.fence + 1, holder = EXCLUDED.holder, updated_at = now(),
              claimed_over = send_slot.busy_until,
              busy_until = greatest(send_slot.busy_until, now() + $5::bigint * interval '1 millisecond')
RETURNING fence, coalesce(greatest(0, ceil(extract(epoch FROM claimed_over - now()) * 1000)), 0)::bigint AS wait_ms";

const ARM: &str = "\
UPDATE send_slot SET busy_until = greatest(busy_until, now() + $5::bigint * interval '1 millisecond')
WHERE ispb = $1 AND channel = $2 AND slot = $3 AND fence = $4";

const RELEASE: &str = "\
UPDATE send_slot SET busy_until = NULL, updated_at = now()
WHERE ispb = $1 AND channel = $2 AND slot = $3 AND fence = $4";

const CURRENT_FENCE: &str = "\
SELECT COALESCE((SELECT fence FROM send_slot WHERE ispb = $1 AND channel = $2 AND slot = $3), 0)";

/// [`SendGates`] on Postgres for one participant.
#[derive(Clone)]
pub struct PgSendGates {
    pool: Db,
    ispb: String,
    query_timeout: Duration,
}

impl PgSendGates {
    pub fn new(pool: Db, ispb: &Ispb, query_timeout: Duration) -> Self {
        metrics::describe_counter!("cabine_gate_arms_total", "Fenced gate writes made only to arm a request.");
        PgSendGates { pool, ispb: ispb.to_string(), query_timeout }
    }

    /// A fenced write (ARM or RELEASE); no row matched: the fence is lost.
    async fn fenced(
        &self,
        sql: &'static str,
        channel: ChannelId,
        slot: u8,
        fence: i64,
        busy_ms: i64,
    ) -> Result<(), GateError> {
        let (ispb, ch, n) = (self.ispb.as_str(), channel.as_str(), i16::from(slot));
        bounded::with_conn(&self.pool, self.query_timeout, |conn| async move {
            let stmt = conn.prepare_cached(sql).await.map_err(pg)?;
            let moved = if sql == RELEASE {
                conn.execute(&stmt, &[&ispb, &ch, &n, &fence]).await
            } else {
                conn.execute(&stmt, &[&ispb, &ch, &n, &fence, &busy_ms]).await
            };
            if moved.map_err(pg)? == 1 { Ok(()) } else { Err(fence_lost(&conn, (ispb, ch, n), fence).await) }
        })
        .await
    }
}

async fn fence_lost(conn: &Object, (ispb, ch, n): (&str, &str, i16), ours: i64) -> GateError {
    let current = async {
        let stmt = conn.prepare_cached(CURRENT_FENCE).await?;
        conn.query_one(&stmt, &[&ispb, &ch, &n]).await.map(|r| r.get::<_, i64>(0))
    };
    match current.await {
        Ok(current) => GateError::FenceLost { ours, current },
        Err(e) => pg(e),
    }
}

/// Whole milliseconds, rounded up: Postgres's window is never shorter than the holder assumes.
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_micros().div_ceil(1000)).unwrap_or(i64::MAX)
}

fn pg(e: tokio_postgres::Error) -> GateError {
    if is_transient(&e) { GateError::Unavailable(e.to_string()) } else { GateError::Fatal(e.to_string()) }
}

impl Bounded for GateError {
    fn pool(e: PoolError) -> Self {
        match e {
            PoolError::Backend(e) => pg(e),
            PoolError::NoRuntimeSpecified => GateError::Fatal("postgres pool without a runtime".into()),
            other => GateError::Unavailable(format!("postgres pool: {other}")),
        }
    }

    fn timed_out(after: Duration) -> Self {
        GateError::Unavailable(format!("no answer within {after:?}"))
    }
}

#[async_trait::async_trait]
impl SendGates for PgSendGates {
    async fn claim(
        &self,
        channel: ChannelId,
        slot: u8,
        holder: &str,
        busy_for: Duration,
    ) -> Result<GateClaim, GateError> {
        let (ispb, ch, n, busy_ms) = (self.ispb.as_str(), channel.as_str(), i16::from(slot), millis(busy_for));
        bounded::with_conn(&self.pool, self.query_timeout, |conn| async move {
            let stmt = conn.prepare_cached(CLAIM).await.map_err(pg)?;
            let row = conn.query_one(&stmt, &[&ispb, &ch, &n, &holder, &busy_ms]).await.map_err(pg)?;
            let wait = Duration::from_millis(u64::try_from(row.get::<_, i64>("wait_ms")).unwrap_or(0));
            Ok(GateClaim { fence: row.get("fence"), wait })
        })
        .await
    }

    async fn arm(&self, channel: ChannelId, slot: u8, fence: i64, busy_for: Duration) -> Result<(), GateError> {
        self.fenced(ARM, channel, slot, fence, millis(busy_for)).await?;
        metrics::counter!("cabine_gate_arms_total", "pool" => "send").increment(1);
        Ok(())
    }

    async fn release(&self, channel: ChannelId, slot: u8, fence: i64) -> Result<(), GateError> {
        self.fenced(RELEASE, channel, slot, fence, 0).await
    }
}
