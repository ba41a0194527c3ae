//! The outbound store's reads (a row, its history, its body, pages, depth by
//! priority) and its two queue statements: expiry of overdue rows and the
//! claim of a ready batch.

use bytes::Bytes;
use cabine_actors::ports::outbound::{
    BatchSize, ClaimToken, DepthLine, OutboundDetail, OutboundError, OutboundRow, OutboundStatus, Page, Priority,
    QueueDepth, ReadyMessage,
};
use cabine_actors::ports::outbound_bus::ResultEvent;

use super::{PAST_DEADLINE, PgOutboundStore, events_counted};
use crate::config::ChannelId;
use crate::outbound::rows::{ROW_COLUMNS, get, history_entry, outbound_row, pg_error};
use crate::outbound::transition::transition_sql;

/// Claims the ready rows of a channel: priority, then deadline; never a row
/// past its deadline (tested under the row lock, like the expiry).
const CLAIM_SQL: &str = "WITH picked AS (
        SELECT id FROM outbound
        WHERE status = 'queued' AND ispb = $1 AND channel = $2 AND not_before <= now() AND deadline > now()
        ORDER BY priority, deadline, id LIMIT $3 FOR UPDATE SKIP LOCKED
    ),
    taken AS (
        UPDATE outbound o SET status = 'sending', claim = $4, claimed_at = now(), updated_at = now()
        FROM picked WHERE o.id = picked.id
        RETURNING o.id, o.msg_id, o.msg_type, o.priority, o.deadline, o.attempts, o.raw
    ),
    logged AS (
        INSERT INTO outbound_history (outbound_id, from_status, to_status, attempt, detail)
        SELECT id, 'queued', 'sending', attempts, 'claim ' || $4 FROM taken
    )
    SELECT id, msg_id, msg_type, priority, deadline, attempts, raw FROM taken ORDER BY priority, deadline, id";

impl PgOutboundStore {
    pub(super) async fn claim_ready(
        &self,
        channel: ChannelId,
        max: BatchSize,
        claim: &ClaimToken,
    ) -> Result<Vec<ReadyMessage>, OutboundError> {
        let limit = max.get() as i64;
        let rows = self
            .bounded(|client| async move {
                let stmt = client.prepare_cached(CLAIM_SQL).await.map_err(|e| pg_error(&e))?;
                client.query(&stmt, &[&self.ispb, &channel.as_str(), &limit, &claim.0]).await.map_err(|e| pg_error(&e))
            })
            .await?;
        rows.iter()
            .map(|r| {
                let rank: i16 = get(r, 3)?;
                Ok(ReadyMessage {
                    id: get(r, 0)?,
                    msg_id: get(r, 1)?,
                    msg_type: get(r, 2)?,
                    priority: Priority::from_rank(rank).unwrap_or(Priority::Low),
                    deadline: get(r, 4)?,
                    attempts: u32::try_from(get::<i32>(r, 5)?).unwrap_or(0),
                    raw: Bytes::from(get::<Vec<u8>>(r, 6)?),
                })
            })
            .collect()
    }

    /// Queued rows past their deadline (of `channel`, or all) → `timeout`, or
    /// `in_doubt` when an earlier attempt may have reached the SPI.
    pub(super) async fn expire(&self, channel: Option<ChannelId>, max: u32) -> Result<Vec<ResultEvent>, OutboundError> {
        let sql = transition_sql(
            "SELECT id, status AS from_status,
                    CASE WHEN maybe_stored_at IS NULL THEN 'deadline passed before sending'
                         ELSE 'deadline passed after an attempt that may have reached the SPI: awaiting its verdict'
                    END AS note
             FROM outbound
             WHERE status = 'queued' AND ispb = $1 AND ($2::text IS NULL OR channel = $2) AND deadline <= now()
             ORDER BY deadline LIMIT $3 FOR UPDATE SKIP LOCKED",
            &format!("status = {PAST_DEADLINE}, last_error = prev.note"),
        );
        let (channel, limit) = (channel.map(ChannelId::as_str), i64::from(max));
        let changes = self.changes(&sql, &[&self.ispb, &channel, &limit]).await?;
        Ok(events_counted(changes))
    }

    pub(super) async fn row_where(&self, column: &str, value: &str) -> Result<Option<OutboundRow>, OutboundError> {
        let column = match column {
            "msg_id" => "msg_id",
            _ => "ingress_ref",
        };
        let sql = format!("SELECT {ROW_COLUMNS} FROM outbound WHERE {column} = $1");
        let row = self
            .bounded(|client| async move { client.query_opt(&sql, &[&value]).await.map_err(|e| pg_error(&e)) })
            .await?;
        row.as_ref().map(outbound_row).transpose()
    }

    pub(super) async fn detail(&self, msg_id: &str) -> Result<Option<OutboundDetail>, OutboundError> {
        let Some(row) = self.row_where("msg_id", msg_id).await? else { return Ok(None) };
        let lines = self
            .bounded(|client| async move {
                client
                    .query(
                        "SELECT at, from_status, to_status, attempt, event, detail FROM outbound_history
                         WHERE outbound_id = $1 ORDER BY id",
                        &[&row.id],
                    )
                    .await
                    .map_err(|e| pg_error(&e))
            })
            .await?;
        let history = lines.iter().map(history_entry).collect::<Result<_, _>>()?;
        Ok(Some(OutboundDetail { row, history }))
    }

    /// The body stored under `msg_id`.
    pub(super) async fn body(&self, msg_id: &str) -> Result<Option<Bytes>, OutboundError> {
        let row = self
            .bounded(|client| async move {
                client
                    .query_opt("SELECT raw FROM outbound WHERE msg_id = $1 AND ispb = $2", &[&msg_id, &self.ispb])
                    .await
                    .map_err(|e| pg_error(&e))
            })
            .await?;
        row.map(|r| get::<Vec<u8>>(&r, 0).map(Bytes::from)).transpose()
    }

    pub(super) async fn page(
        &self,
        status: OutboundStatus,
        after: Option<i64>,
        limit: u32,
    ) -> Result<Page, OutboundError> {
        let limit = i64::from(limit.clamp(1, 500));
        let sql = format!(
            "SELECT {ROW_COLUMNS} FROM outbound WHERE status = $1 AND ispb = $2 AND id > $3 ORDER BY id LIMIT $4"
        );
        let after = after.unwrap_or(0);
        let rows = self
            .bounded(|client| async move {
                client.query(&sql, &[&status.as_str(), &self.ispb, &after, &limit]).await.map_err(|e| pg_error(&e))
            })
            .await?;
        let rows: Vec<OutboundRow> = rows.iter().map(outbound_row).collect::<Result<_, _>>()?;
        let next_after = (rows.len() as i64 == limit).then(|| rows.last().map(|r| r.id)).flatten();
        Ok(Page { rows, next_after })
    }

    pub(super) async fn queue_depth(&self) -> Result<QueueDepth, OutboundError> {
        let rows = self
            .bounded(|client| async move {
                client
                    .query(
                        "SELECT channel, priority,
                                count(*) FILTER (WHERE status = 'queued'), count(*) FILTER (WHERE status = 'sending'),
                                min(created_at) FILTER (WHERE status = 'queued')
                         FROM outbound WHERE status IN ('queued', 'sending') AND ispb = $1
                         GROUP BY channel, priority ORDER BY channel, priority",
                        &[&self.ispb],
                    )
                    .await
                    .map_err(|e| pg_error(&e))
            })
            .await?;
        let lines = rows
            .iter()
            .map(|r| {
                let rank: i16 = get(r, 1)?;
                Ok(DepthLine {
                    channel: get::<String>(r, 0)?.parse().map_err(OutboundError::Fatal)?,
                    priority: Priority::from_rank(rank).unwrap_or(Priority::Low),
                    queued: u64::try_from(get::<i64>(r, 2)?).unwrap_or(0),
                    sending: u64::try_from(get::<i64>(r, 3)?).unwrap_or(0),
                    oldest_queued: get(r, 4)?,
                })
            })
            .collect::<Result<_, OutboundError>>()?;
        Ok(QueueDepth { lines, parked: 0 })
    }
}
