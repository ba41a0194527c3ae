//! The republish sweep and the lag gauge: rows committed but not on the bus
//! (bus down, a lost PubAck, a crash between commit and publish) are found in
//! Postgres — the source of truth — and published again, page by page.

use std::time::{Duration, Instant};

use bytes::Bytes;
use cabine_actors::ports::PublishError;

use super::bus::{InboundBus, Outgoing};
use super::series::{self as m, Path};
use super::sql;

impl InboundBus {
    /// Republishes rows unpublished for longer than `older_than`, at most `page` per
    /// round, and only rows that existed when the sweep began. Returns how many
    /// JetStream acknowledged; `Unavailable` when the bus or Postgres failed.
    pub async fn sweep(&self, older_than: Duration, page: usize) -> Result<usize, PublishError> {
        if !self.is_connected() {
            self.refresh_lag().await.ok();
            return Err(PublishError::Unavailable("nats disconnected".into()));
        }
        let upto = self.max_id().await?;
        let (mut after, mut total) = (0_i64, 0_usize);
        loop {
            let rows = self.sweep_page(after, upto, older_than, page).await?;
            let Some(last) = rows.iter().map(|r| r.id).max() else { break };
            after = last;
            let fetched = rows.len();
            let round = self.publish(rows, Path::Sweep).await;
            total += round.published;
            if round.bus_failed {
                self.refresh_lag().await.ok();
                return Err(PublishError::Unavailable(format!("bus failed; {total} rows republished before")));
            }
            if fetched < page {
                break;
            }
        }
        self.refresh_lag().await?;
        Ok(total)
    }

    /// Reads the oldest unpublished row's age and sets the gauge.
    pub async fn refresh_lag(&self) -> Result<Duration, PublishError> {
        let read = async {
            let conn = self.pool.get().await.map_err(unavailable)?;
            let stmt = conn.prepare_cached(sql::OLDEST_UNPUBLISHED).await.map_err(unavailable)?;
            conn.query_one(&stmt, &[&self.ispb]).await.map(|r| r.get::<_, f64>(0)).map_err(unavailable)
        };
        let age = self.bounded(read).await?;
        metrics::gauge!(m::OLDEST_UNPUBLISHED, "ispb" => self.ispb.clone()).set(age);
        Ok(Duration::from_secs_f64(age.max(0.0)))
    }

    async fn max_id(&self) -> Result<i64, PublishError> {
        let read = async {
            let conn = self.pool.get().await.map_err(unavailable)?;
            let stmt = conn.prepare_cached(sql::MAX_ID).await.map_err(unavailable)?;
            conn.query_one(&stmt, &[]).await.map(|r| r.get::<_, i64>(0)).map_err(unavailable)
        };
        self.bounded(read).await
    }

    async fn sweep_page(
        &self,
        after: i64,
        upto: i64,
        older_than: Duration,
        page: usize,
    ) -> Result<Vec<Outgoing>, PublishError> {
        let read = async {
            let conn = self.pool.get().await.map_err(unavailable)?;
            let stmt = conn.prepare_cached(sql::SWEEP_PAGE).await.map_err(unavailable)?;
            let (secs, limit) = (older_than.as_secs_f64(), page as i64);
            conn.query(&stmt, &[&self.ispb, &after, &upto, &secs, &limit]).await.map_err(unavailable)
        };
        let now = Instant::now();
        let rows = self.bounded(read).await?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let age = Duration::from_secs_f64(r.get::<_, f64>("age_s").max(0.0));
                Outgoing {
                    id: r.get("id"),
                    channel: r.get("channel"),
                    resource_id: r.get("resource_id"),
                    msg_def: r.get("msg_def"),
                    raw: Bytes::from(r.get::<_, Vec<u8>>("raw")),
                    committed_at: now.checked_sub(age).unwrap_or(now),
                }
            })
            .collect())
    }

    async fn bounded<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, PublishError>>,
    ) -> Result<T, PublishError> {
        tokio::time::timeout(self.query_timeout, work).await.unwrap_or_else(|_| {
            Err(PublishError::Unavailable(format!("postgres: no answer within {:?}", self.query_timeout)))
        })
    }
}

fn unavailable(e: impl std::fmt::Display) -> PublishError {
    PublishError::Unavailable(format!("postgres: {e}"))
}
