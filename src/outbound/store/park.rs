//! Parked requests (`outbound_parked`, V8): what the intake gave up on after
//! `outbound.max_deliver` deliveries, kept as it came off the bus — subject,
//! `Cabine-*` headers, body — until an operator reprocesses it by its ingress
//! ref. Only bytea and cleaned text are written, so parking cannot itself be
//! refused for its values.

use bytes::Bytes;
use cabine_actors::ports::outbound::{Inserted, OutboundError, Parked, ParkedPage, Unparked};
use cabine_actors::ports::outbound_bus::{Arrival, OutboundRequest};
use serde_json::Value;
use tokio_postgres::Row;

use super::PgOutboundStore;
use crate::outbound::fields;
use crate::outbound::rows::{get, pg_error};

const PARK_SQL: &str = "INSERT INTO outbound_parked (ispb, ingress_ref, subject, headers, raw, deliveries, reason)
    SELECT $1, p.ingress_ref, p.subject, p.headers, p.raw, p.deliveries, $7
    FROM unnest($2::text[], $3::text[], $4::jsonb[], $5::bytea[], $6::int4[])
         AS p(ingress_ref, subject, headers, raw, deliveries)
    ON CONFLICT (ingress_ref) DO NOTHING
    RETURNING id";

const PARKED_COLUMNS: &str =
    "id, ingress_ref, subject, headers, raw, deliveries, reason, status, parked_at, reprocessed_at, outbound_msg_id";

impl PgOutboundStore {
    pub(super) async fn park_arrivals(&self, arrivals: &[Arrival], reason: &str) -> Result<usize, OutboundError> {
        if arrivals.is_empty() {
            return Ok(0);
        }
        let refs: Vec<Option<String>> = arrivals.iter().map(|a| a.ingress_ref.as_deref().map(fields::text)).collect();
        let subjects: Vec<String> = arrivals.iter().map(|a| fields::text(&a.subject)).collect();
        let headers: Vec<Value> = arrivals.iter().map(|a| headers_json(&a.headers)).collect();
        let raws: Vec<&[u8]> = arrivals.iter().map(|a| a.raw.as_ref()).collect();
        let deliveries: Vec<i32> = arrivals.iter().map(|a| i32::try_from(a.deliveries).unwrap_or(i32::MAX)).collect();
        let reason = fields::text(reason);
        let parked = self
            .bounded(|client| async move {
                let stmt = client.prepare_cached(PARK_SQL).await.map_err(|e| pg_error(&e))?;
                let p: [&(dyn tokio_postgres::types::ToSql + Sync); 7] =
                    [&self.ispb, &refs, &subjects, &headers, &raws, &deliveries, &reason];
                client.query(&stmt, &p).await.map_err(|e| pg_error(&e))
            })
            .await?;
        metrics::counter!("cabine_outbound_parked_total").increment(parked.len() as u64);
        Ok(parked.len())
    }

    pub(super) async fn parked_page(&self, after: Option<i64>, limit: u32) -> Result<ParkedPage, OutboundError> {
        let limit = i64::from(limit.clamp(1, 500));
        let after = after.unwrap_or(0);
        let sql = format!(
            "SELECT {PARKED_COLUMNS} FROM outbound_parked WHERE status = 'parked' AND ispb = $1 AND id > $2
             ORDER BY id LIMIT $3"
        );
        let rows = self
            .bounded(|client| async move {
                client.query(&sql, &[&self.ispb, &after, &limit]).await.map_err(|e| pg_error(&e))
            })
            .await?;
        let rows: Vec<Parked> = rows.iter().map(parked_row).collect::<Result<_, _>>()?;
        let next_after = (rows.len() as i64 == limit).then(|| rows.last().map(|r| r.id)).flatten();
        Ok(ParkedPage { rows, next_after })
    }

    pub(super) async fn parked_one(&self, ingress_ref: &str) -> Result<Option<Parked>, OutboundError> {
        let sql = format!("SELECT {PARKED_COLUMNS} FROM outbound_parked WHERE ingress_ref = $1 AND ispb = $2");
        let row = self
            .bounded(|client| async move {
                client.query_opt(&sql, &[&ingress_ref, &self.ispb]).await.map_err(|e| pg_error(&e))
            })
            .await?;
        row.as_ref().map(parked_row).transpose()
    }

    /// Stores the request first, then marks the parked row: a crash between
    /// the two leaves it parked, and a second reprocess finds the row stored
    /// (a duplicate by MsgId or ingress ref) and marks it then.
    pub(super) async fn unpark_request(
        &self,
        ingress_ref: &str,
        request: &OutboundRequest,
    ) -> Result<Unparked, OutboundError> {
        match self.parked_one(ingress_ref).await? {
            None => return Ok(Unparked::NotFound),
            Some(p) if p.state != cabine_actors::ports::outbound::ParkedState::Parked => {
                return Ok(Unparked::AlreadyReprocessed);
            }
            Some(_) => {}
        }
        let mut stored = self.store_requests(std::slice::from_ref(request)).await?;
        let inserted = stored.pop().ok_or_else(|| OutboundError::Fatal("an insert without its answer".into()))?;
        let msg_id = match &inserted {
            Inserted::New { event } => event.msg_id.clone(),
            Inserted::Duplicate { row, .. } => row.msg_id.clone(),
        };
        self.bounded(|client| async move {
            client
                .execute(
                    "UPDATE outbound_parked SET status = 'reprocessed', reprocessed_at = now(), outbound_msg_id = $3
                     WHERE ingress_ref = $1 AND ispb = $2 AND status = 'parked'",
                    &[&ingress_ref, &self.ispb, &msg_id],
                )
                .await
                .map_err(|e| pg_error(&e))
        })
        .await?;
        Ok(Unparked::Stored(inserted))
    }

    pub(super) async fn parked_count(&self) -> Result<u64, OutboundError> {
        let row = self
            .bounded(|client| async move {
                client
                    .query_one(
                        "SELECT count(*) FROM outbound_parked WHERE status = 'parked' AND ispb = $1",
                        &[&self.ispb],
                    )
                    .await
                    .map_err(|e| pg_error(&e))
            })
            .await?;
        Ok(u64::try_from(get::<i64>(&row, 0)?).unwrap_or(0))
    }
}

/// `[[name, value], …]`, cleaned (jsonb refuses `\u0000`).
fn headers_json(headers: &[(String, String)]) -> Value {
    Value::Array(headers.iter().map(|(k, v)| Value::from(vec![fields::text(k), fields::text(v)])).collect())
}

fn headers_of(v: Value) -> Vec<(String, String)> {
    let pair = |p: &Value| Some((p.get(0)?.as_str()?.to_owned(), p.get(1)?.as_str()?.to_owned()));
    v.as_array().map(|a| a.iter().filter_map(pair).collect()).unwrap_or_default()
}

fn parked_row(r: &Row) -> Result<Parked, OutboundError> {
    Ok(Parked {
        id: get(r, 0)?,
        arrival: Arrival {
            ingress_ref: get(r, 1)?,
            subject: get(r, 2)?,
            headers: headers_of(get(r, 3)?),
            raw: Bytes::from(get::<Vec<u8>>(r, 4)?),
            deliveries: u32::try_from(get::<i32>(r, 5)?).unwrap_or(0),
        },
        reason: get(r, 6)?,
        state: get::<String>(r, 7)?.parse().map_err(OutboundError::Fatal)?,
        parked_at: get(r, 8)?,
        reprocessed_at: get(r, 9)?,
        outbound_msg_id: get(r, 10)?,
    })
}
