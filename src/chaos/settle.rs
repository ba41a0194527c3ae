//! After the traffic stops: wait, within a bound, until nothing is left to
//! move — the simulator holds no queued or unacknowledged message, and every
//! published outbound MsgId is stored and no longer queued or being sent. What
//! is still open at the bound is what the verdict calls `stuck` (inbound) or
//! `outbound_lost`.

use std::collections::HashSet;
use std::time::Duration;

use tokio::time::Instant;

use super::verdict;
use crate::harness::LocalCluster;

/// How long the settling took and whether everything settled.
#[derive(Clone, Copy, Debug)]
pub struct Settled {
    pub done: bool,
    pub took: Duration,
}

const OPEN_OUTBOUND: &str = "SELECT count(*) FILTER (WHERE status IN ('queued', 'sending')), count(*) \
     FROM outbound WHERE msg_id = ANY($1)";

/// Polls every 200 ms until settled or `within` passed.
pub async fn settle(c: &LocalCluster, published: &HashSet<String>, within: Duration) -> Settled {
    let started = Instant::now();
    let ids: Vec<String> = published.iter().cloned().collect();
    loop {
        let done = inbound_settled(c).await && outbound_settled(c, &ids).await;
        if done || started.elapsed() >= within {
            return Settled { done, took: started.elapsed() };
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn inbound_settled(c: &LocalCluster) -> bool {
    match verdict::audit(&c.sim.control).await {
        Ok(lanes) => lanes.iter().all(|l| l.pending + l.unacknowledged == 0),
        Err(_) => false,
    }
}

async fn outbound_settled(c: &LocalCluster, ids: &[String]) -> bool {
    if ids.is_empty() {
        return true;
    }
    let read = async {
        let conn = c.postgres.get().await.ok()?;
        let row = conn.query_one(OPEN_OUTBOUND, &[&ids]).await.ok()?;
        Some((row.get::<_, i64>(0), row.get::<_, i64>(1)))
    };
    matches!(read.await, Some((0, stored)) if stored == ids.len() as i64)
}
