//! After the traffic stops: wait until nothing is left to move — the simulator
//! holds no queued or unacknowledged message, and every published outbound
//! MsgId is stored and no longer queued or being sent. A backlog that drains
//! slowly is not stuck: the wait goes on while anything moves (acknowledgements
//! at the simulator, outbound rows leaving the queue) and gives up only after
//! `stall` without progress, or at an overall bound. What is still open then is
//! what the verdict calls `stuck` (inbound) or `outbound_lost`.

use std::collections::HashSet;
use std::time::Duration;

use tokio::time::Instant;

use super::verdict;
use crate::harness::LocalCluster;

/// Longest settling, however steadily a backlog drains.
const OVERALL: Duration = Duration::from_secs(300);

/// How long the settling took and whether everything settled.
#[derive(Clone, Copy, Debug)]
pub struct Settled {
    pub done: bool,
    pub took: Duration,
}

/// What is still open, and a measure that grows with progress.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Open {
    inbound: u64,
    outbound: i64,
    acknowledged: u64,
}

impl Open {
    fn done(&self) -> bool {
        self.inbound == 0 && self.outbound == 0
    }
}

/// Counts the published MsgIds not stored yet, or stored and still queued or being sent.
const OPEN_OUTBOUND: &str = "SELECT count(*) FILTER (WHERE status IN ('queued', 'sending')), count(*) \
     FROM outbound WHERE msg_id = ANY($1)";

/// Polls every 200 ms until settled, `stall` without progress, or [`OVERALL`].
pub async fn settle(c: &LocalCluster, published: &HashSet<String>, stall: Duration) -> Settled {
    let started = Instant::now();
    let ids: Vec<String> = published.iter().cloned().collect();
    let (mut last, mut moved) = (None, Instant::now());
    loop {
        let open = read(c, &ids).await;
        let done = open.is_some_and(|o| o.done());
        if open.is_some() && open != last {
            (last, moved) = (open, Instant::now());
        }
        if done || moved.elapsed() >= stall || started.elapsed() >= OVERALL {
            return Settled { done, took: started.elapsed() };
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// None when the simulator or Postgres could not be read.
async fn read(c: &LocalCluster, ids: &[String]) -> Option<Open> {
    let lanes = verdict::audit(&c.sim.control).await.ok()?;
    let inbound = lanes.iter().map(|l| l.pending + l.unacknowledged).sum();
    let acknowledged = lanes.iter().map(|l| l.acknowledged).sum();
    let outbound = if ids.is_empty() { 0 } else { open_outbound(c, ids).await? };
    Some(Open { inbound, outbound, acknowledged })
}

async fn open_outbound(c: &LocalCluster, ids: &[String]) -> Option<i64> {
    let read = async {
        let conn = c.postgres.get().await.ok()?;
        conn.query_one(OPEN_OUTBOUND, &[&ids]).await.ok()
    };
    let row = tokio::time::timeout(Duration::from_secs(5), read).await.ok()??;
    let (busy, stored): (i64, i64) = (row.get(0), row.get(1));
    Some(busy + (ids.len() as i64 - stored))
}
