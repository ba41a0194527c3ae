//! What became of each outbound request, as `bench outbound` reads it from the
//! cluster's outbound table: the row's status and the database's times of its
//! `sent` and `confirmed` transitions (`now()` of the recording transaction,
//! the same clock as the bench's on one machine); and the wait for the table
//! to settle, bounded.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use anyhow::bail;
use tokio::time::Instant;

use crate::harness::LocalCluster;

/// One row.
#[derive(Debug)]
pub struct Fate {
    pub status: String,
    /// µs since the epoch: stored by the dispatcher.
    pub created_us: i64,
    /// µs since the epoch: recorded sent, or confirmed when the confirmation was recorded first.
    pub sent_us: Option<i64>,
    pub confirmed_us: Option<i64>,
    /// µs since the epoch: the SPI's pacs.002 for it committed to the inbox.
    pub report_us: Option<i64>,
}

const FATES: &str = "SELECT o.msg_id, o.status, (extract(epoch FROM o.created_at) * 1000000)::int8,
        (extract(epoch FROM COALESCE(o.sent_at, o.confirmed_at)) * 1000000)::int8,
        (extract(epoch FROM o.confirmed_at) * 1000000)::int8,
        (extract(epoch FROM i.received_at) * 1000000)::int8
    FROM outbound o
    LEFT JOIN inbox i ON i.end_to_end_id = o.end_to_end_ids[1] AND i.msg_def LIKE 'pacs.002%'
    WHERE o.msg_id IS NOT NULL";

/// MsgId → its row.
pub async fn read(c: &LocalCluster) -> anyhow::Result<HashMap<String, Fate>> {
    let rows = c.query(FATES).await?;
    let fate = |r: &tokio_postgres::Row| Fate {
        status: r.get(1),
        created_us: r.get(2),
        sent_us: r.get(3),
        confirmed_us: r.get(4),
        report_us: r.get(5),
    };
    Ok(rows.iter().map(|r| (r.get(0), fate(r))).collect())
}

/// Waits until `rows` rows are stored and none is queued or being sent (with
/// `confirmed`, none is left `sent` either); past `within` it is an error naming the counts.
pub async fn wait_settled(c: &LocalCluster, rows: usize, confirmed: bool, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let by_status = c.outbound_by_status().await?;
        let n = |s: &str| by_status.get(s).copied().unwrap_or(0);
        let stored: i64 = by_status.values().sum();
        let open = n("queued") + n("sending") + if confirmed { n("sent") } else { 0 };
        if stored >= rows as i64 && open == 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let what = if confirmed { "confirmed" } else { "settled" };
            bail!("the cluster had not {what} {rows} messages within {within:?}: {}", show(&by_status));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn show(by_status: &BTreeMap<String, i64>) -> String {
    by_status.iter().map(|(s, n)| format!("{s}={n}")).collect::<Vec<_>>().join(" ")
}
