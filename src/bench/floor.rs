//! The Postgres commit floor of `bench inbound`, measured in the same run: as
//! many concurrent writers as the cluster has stream slots, each committing
//! batches of 10 real messages with the pods' own statement (`PgInbox::commit`:
//! fenced cursor update + multi-row insert) into the same table and indexes.
//! What they move per second is what Postgres on this machine allows the
//! inbound path at best, whatever cabine does around it; the mean commit is
//! what each stream's cycle must add to its GET (DESIGN §2.2: the next GET
//! acknowledges, so it waits for the commit).

use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use cabine_actors::domain::{ChannelId, SlotId};
use cabine_actors::ports::InboxStore;
use tokio::time::Instant;

use crate::db::Db;
use crate::inbox::PgInbox;

/// Another participant's rows: the pods (ISPB 99999010) never read or publish them.
const FLOOR_ISPB: &str = "99999098";
/// Batches per writer.
const BATCHES: usize = 100;

/// What the floor writers measured.
#[derive(Clone, Copy, Debug)]
pub struct Floor {
    /// Messages per second, all writers together.
    pub msgs_per_s: f64,
    /// Mean time of one 10-message commit.
    pub commit_mean_ms: f64,
}

/// `writers` concurrent writers of 10-message batches of `raw`.
pub async fn commit_floor(pool: &Db, writers: u8, raw: Bytes) -> anyhow::Result<Floor> {
    let inbox = PgInbox::new(pool.clone(), &FLOOR_ISPB.parse().map_err(anyhow::Error::msg)?, Duration::from_secs(10));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for n in 1..=writers {
        let (inbox, raw) = (inbox.clone(), raw.clone());
        tasks.spawn(async move { write_batches(&inbox, SlotId { channel: ChannelId::Cpm, n }, raw).await });
    }
    let mut committing = Duration::ZERO;
    while let Some(done) = tasks.join_next().await {
        committing += done.context("a floor writer panicked")??;
    }
    let took = started.elapsed().as_secs_f64();
    let conn = pool.get().await?;
    conn.execute("DELETE FROM inbox WHERE ispb = $1", &[&FLOOR_ISPB]).await?;
    conn.execute("DELETE FROM slot_cursor WHERE ispb = $1", &[&FLOOR_ISPB]).await?;
    let commits = usize::from(writers) * BATCHES;
    Ok(Floor {
        msgs_per_s: (commits * 10) as f64 / took.max(1e-9),
        commit_mean_ms: committing.as_secs_f64() * 1000.0 / commits.max(1) as f64,
    })
}

/// One writer's batches; returns the time spent committing.
async fn write_batches(inbox: &PgInbox, slot: SlotId, raw: Bytes) -> anyhow::Result<Duration> {
    let claim = inbox.claim(slot, "bench-floor", Duration::ZERO).await?;
    let mut committing = Duration::ZERO;
    for b in 0..BATCHES {
        let batch: Vec<_> =
            (0..10).map(|i| crate::icom::inbound::message(format!("F{}-{b}-{i}", slot.n), raw.clone())).collect();
        let pull_next = format!("/api/v1/out/{FLOOR_ISPB}/stream/floor{}-{b}", slot.n);
        let started = Instant::now();
        inbox.commit(slot, claim.fence, &batch, &pull_next, Duration::from_secs(1)).await?;
        committing += started.elapsed();
    }
    Ok(committing)
}
