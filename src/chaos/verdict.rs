//! The verdict of a run, from the server side and the stores only — never from
//! what the pods say about themselves: the simulator's audit (its caps, 429s by
//! cause, concurrent reads, what is still queued or unacknowledged), its ledger
//! of acknowledged ResourceIds and its log of received messages, against the
//! pods' Postgres schema (`inbox`, `outbound`). [`judge`] is pure.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::harness::{LocalCluster, SimControl, SimProcessError};

#[derive(Debug, thiserror::Error)]
pub enum EvidenceError {
    #[error("simulator: {0}")]
    Sim(#[from] SimProcessError),
    #[error("simulator answer unreadable: {0}")]
    Shape(#[from] serde_json::Error),
    #[error("the simulator's {0} dropped its oldest entries (raise its cap): the verdict would be incomplete")]
    Truncated(&'static str),
    #[error("postgres: {0}")]
    Postgres(String),
}

/// One lane of `GET /sim/audit`: only what the verdict reads. Fields the
/// simulator does not (yet) report read as 0 (`concurrent_reads` and
/// `max_reads_per_stream` arrive with the simulator that keeps aborted reads in flight).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct LaneFigures {
    pub ispb: String,
    pub channel: String,
    pub max_open_streams: u64,
    pub max_in_flight: u64,
    pub rejected_429: u64,
    pub rejected_streams: u64,
    pub rejected_in_flight: u64,
    pub rejected_rate: u64,
    pub injected: u64,
    pub replies: u64,
    pub redelivered: u64,
    pub acknowledged: u64,
    pub pending: u64,
    pub unacknowledged: u64,
    pub expired_streams: u64,
    pub concurrent_reads: u64,
    pub max_reads_per_stream: u64,
}

#[derive(Debug, Deserialize)]
struct Audit {
    lanes: Vec<LaneFigures>,
}

#[derive(Debug, Deserialize)]
struct Page<T> {
    entries: Vec<T>,
    next_since: u64,
    oldest_seq: u64,
}

#[derive(Debug, Deserialize)]
struct LedgerEntry {
    channel: String,
    resource_id: String,
}

/// One message the simulator received on the send endpoint.
#[derive(Clone, Debug, Deserialize)]
pub struct SimOutbound {
    pub msg_id: Option<String>,
    /// `accepted`, `duplicate` (refused with admi.002 AM05), `malformed`.
    pub outcome: String,
}

/// Everything the verdict is judged from.
#[derive(Debug, Default)]
pub struct Evidence {
    pub lanes: Vec<LaneFigures>,
    /// Acknowledged at the simulator: (channel, ResourceId).
    pub ledger: Vec<(String, String)>,
    /// Inbox rows: (channel, ResourceId).
    pub inbox: Vec<(String, String)>,
    /// Rows beyond one per message (BizMsgIdr, else ResourceId).
    pub duplicate_rows: i64,
    /// Inbox rows not yet published on the bus (information: the sweep republishes them).
    pub unpublished: i64,
    pub sim_outbound: Vec<SimOutbound>,
    /// Outbound table: MsgId → status.
    pub outbound_rows: HashMap<String, String>,
    /// MsgIds the traffic saw PubAcked.
    pub published: HashSet<String>,
}

/// The figures of the verdict.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Verdict {
    pub injected: u64,
    pub replies: u64,
    pub acknowledged: u64,
    pub persisted: usize,
    pub lost: usize,
    pub lost_sample: Vec<String>,
    pub stuck: u64,
    pub duplicate_rows: i64,
    pub unpublished: i64,
    pub redelivered: u64,
    pub expired_streams: u64,
    pub over_cap: u64,
    pub rejected_streams: u64,
    pub rejected_in_flight: u64,
    pub rejected_rate: u64,
    pub concurrent_reads: u64,
    pub max_reads_per_stream: u64,
    pub max_in_flight: u64,
    pub max_open_streams: u64,
    pub outbound_published: usize,
    pub outbound_stored: usize,
    pub outbound_unstored: usize,
    pub outbound_accepted_at_sim: usize,
    pub duplicates_at_sim: usize,
    pub refused_resends: usize,
    pub outbound_lost: usize,
    pub outbound_lost_sample: Vec<String>,
    /// Rows of published MsgIds by status.
    pub outbound_by_status: BTreeMap<String, usize>,
}

/// How many ids a sample shows.
const SAMPLE: usize = 5;

/// The verdict's figures from the evidence.
pub fn judge(e: &Evidence) -> Verdict {
    let sum = |f: fn(&LaneFigures) -> u64| e.lanes.iter().map(f).sum::<u64>();
    let peak = |f: fn(&LaneFigures) -> u64| e.lanes.iter().map(f).max().unwrap_or(0);
    let inbox: HashSet<&(String, String)> = e.inbox.iter().collect();
    let mut lost: Vec<String> =
        e.ledger.iter().filter(|k| !inbox.contains(k)).map(|(ch, id)| format!("{ch}:{id}")).collect();
    lost.sort();
    lost.dedup();
    let (rejected_streams, rejected_in_flight) = (sum(|l| l.rejected_streams), sum(|l| l.rejected_in_flight));
    let mut v = Verdict {
        injected: sum(|l| l.injected),
        replies: sum(|l| l.replies),
        acknowledged: sum(|l| l.acknowledged),
        persisted: e.inbox.len(),
        lost: lost.len(),
        lost_sample: lost.into_iter().take(SAMPLE).collect(),
        stuck: sum(|l| l.pending + l.unacknowledged),
        duplicate_rows: e.duplicate_rows,
        unpublished: e.unpublished,
        redelivered: sum(|l| l.redelivered),
        expired_streams: sum(|l| l.expired_streams),
        over_cap: rejected_streams + rejected_in_flight,
        rejected_streams,
        rejected_in_flight,
        rejected_rate: sum(|l| l.rejected_rate),
        concurrent_reads: sum(|l| l.concurrent_reads),
        max_reads_per_stream: peak(|l| l.max_reads_per_stream),
        max_in_flight: peak(|l| l.max_in_flight),
        max_open_streams: peak(|l| l.max_open_streams),
        ..Verdict::default()
    };
    judge_outbound(e, &mut v);
    v
}

fn judge_outbound(e: &Evidence, v: &mut Verdict) {
    let mut accepted: HashMap<&str, usize> = HashMap::new();
    for r in &e.sim_outbound {
        match (r.outcome.as_str(), r.msg_id.as_deref()) {
            ("accepted", Some(id)) => *accepted.entry(id).or_default() += 1,
            ("duplicate", _) => v.refused_resends += 1,
            _ => {}
        }
    }
    let stored: Vec<&String> = e.published.iter().filter(|id| e.outbound_rows.contains_key(*id)).collect();
    let mut lost: Vec<String> =
        stored.iter().filter(|id| !accepted.contains_key(id.as_str())).map(|id| (*id).clone()).collect();
    lost.sort();
    for id in &stored {
        *v.outbound_by_status.entry(e.outbound_rows[*id].clone()).or_default() += 1;
    }
    v.outbound_published = e.published.len();
    v.outbound_stored = stored.len();
    v.outbound_unstored = e.published.len() - stored.len();
    v.outbound_accepted_at_sim = accepted.len();
    v.duplicates_at_sim = accepted.values().filter(|n| **n > 1).count();
    v.outbound_lost = lost.len();
    v.outbound_lost_sample = lost.into_iter().take(SAMPLE).collect();
}

/// The simulator's audit, every lane.
pub async fn audit(control: &SimControl) -> Result<Vec<LaneFigures>, EvidenceError> {
    Ok(serde_json::from_value::<Audit>(control.get("/sim/audit").await?)?.lanes)
}

/// Reads every piece of evidence (`published`: what the traffic saw acknowledged by the bus).
pub async fn gather(c: &LocalCluster, published: HashSet<String>) -> Result<Evidence, EvidenceError> {
    let control = &c.sim.control;
    let ispb = c.settings.cluster.ispb.to_string();
    let ledger: Vec<LedgerEntry> = pages(control, "/sim/ledger", &ispb, "ledger").await?;
    let sim_outbound: Vec<SimOutbound> = pages(control, "/sim/outbound", &ispb, "outbound log").await?;
    let store = Store { c, ispb: &ispb };
    Ok(Evidence {
        lanes: audit(control).await?.into_iter().filter(|l| l.ispb == ispb).collect(),
        ledger: ledger.into_iter().map(|e| (e.channel, e.resource_id)).collect(),
        inbox: store.pairs(INBOX).await?,
        duplicate_rows: store.count(DUPLICATE_ROWS).await?,
        unpublished: store.count(UNPUBLISHED).await?,
        sim_outbound,
        outbound_rows: store.pairs(OUTBOUND).await?.into_iter().collect(),
        published,
    })
}

/// Every entry of a paged simulator log for `ispb`; an error if its ring dropped any.
async fn pages<T: DeserializeOwned>(
    control: &SimControl,
    path: &str,
    ispb: &str,
    what: &'static str,
) -> Result<Vec<T>, EvidenceError> {
    let mut all = Vec::new();
    let mut since = 0;
    loop {
        let url = format!("{path}?ispb={ispb}&since={since}&limit=100000");
        let page: Page<T> = serde_json::from_value(control.get(&url).await?)?;
        if page.oldest_seq > 1 {
            return Err(EvidenceError::Truncated(what));
        }
        let done = page.next_since == since;
        all.extend(page.entries);
        if done {
            return Ok(all);
        }
        since = page.next_since;
    }
}

const INBOX: &str = "SELECT channel, resource_id FROM inbox WHERE ispb = $1";
const DUPLICATE_ROWS: &str =
    "SELECT count(*) - count(DISTINCT COALESCE(biz_msg_id, resource_id)) FROM inbox WHERE ispb = $1";
const UNPUBLISHED: &str = "SELECT count(*) FROM inbox WHERE ispb = $1 AND published_at IS NULL";
const OUTBOUND: &str = "SELECT msg_id, status FROM outbound WHERE ispb = $1 AND msg_id IS NOT NULL";

/// Bound on one read of the pods' schema.
const READ_WITHIN: Duration = Duration::from_secs(10);

/// The pods' schema, read with a few retries (a Postgres just restarted may refuse the first connection).
struct Store<'a> {
    c: &'a LocalCluster,
    ispb: &'a str,
}

impl Store<'_> {
    async fn rows(&self, sql: &str) -> Result<Vec<tokio_postgres::Row>, EvidenceError> {
        let mut last = String::new();
        for _ in 0..5 {
            let attempt = async {
                let conn = self.c.postgres.get().await.map_err(|e| e.to_string())?;
                conn.query(sql, &[&self.ispb]).await.map_err(|e| e.to_string())
            };
            match tokio::time::timeout(READ_WITHIN, attempt).await {
                Ok(Ok(rows)) => return Ok(rows),
                Ok(Err(e)) => last = e,
                Err(_) => last = format!("no answer within {READ_WITHIN:?}"),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        Err(EvidenceError::Postgres(last))
    }

    async fn pairs(&self, sql: &str) -> Result<Vec<(String, String)>, EvidenceError> {
        Ok(self.rows(sql).await?.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    async fn count(&self, sql: &str) -> Result<i64, EvidenceError> {
        Ok(self.rows(sql).await?.first().map_or(0, |r| r.get(0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(ch: &str, id: &str) -> (String, String) {
        (ch.to_owned(), id.to_owned())
    }

    fn sent(id: &str, outcome: &str) -> SimOutbound {
        SimOutbound { msg_id: Some(id.to_owned()), outcome: outcome.to_owned() }
    }

    #[test]
    fn an_audit_without_the_new_counters_reads_them_as_zero() {
        let lane: LaneFigures =
            serde_json::from_str(r#"{"ispb":"99999010","channel":"cpm","max_in_flight":6,"extra":1}"#).unwrap();
        assert_eq!((lane.max_in_flight, lane.concurrent_reads, lane.max_reads_per_stream), (6, 0, 0));
    }

    #[test]
    fn acknowledged_but_not_in_the_inbox_is_lost_and_queued_is_stuck() {
        let lane =
            LaneFigures { pending: 2, unacknowledged: 1, rejected_streams: 1, rejected_rate: 4, ..Default::default() };
        let e = Evidence {
            lanes: vec![lane],
            ledger: vec![pair("cpm", "a"), pair("cpm", "b"), pair("cpm", "c")],
            inbox: vec![pair("cpm", "a"), pair("cpm", "c"), pair("csm", "b")],
            ..Default::default()
        };
        let v = judge(&e);
        assert_eq!((v.lost, v.lost_sample.clone()), (1, vec!["cpm:b".to_owned()]));
        assert_eq!((v.stuck, v.persisted), (3, 3));
        assert_eq!((v.over_cap, v.rejected_rate), (1, 4), "rate-limit 429s are not over the cap");
    }

    #[test]
    fn a_refused_resend_is_no_duplicate_and_an_unaccepted_stored_row_is_lost() {
        let e = Evidence {
            sim_outbound: vec![
                sent("m1", "accepted"),
                sent("m1", "duplicate"),
                sent("m2", "accepted"),
                sent("m2", "accepted"),
            ],
            outbound_rows: HashMap::from([
                ("m1".to_owned(), "confirmed".to_owned()),
                ("m2".to_owned(), "sent".to_owned()),
                ("m3".to_owned(), "sending".to_owned()),
            ]),
            published: ["m1", "m2", "m3", "m4"].map(str::to_owned).into_iter().collect(),
            ..Default::default()
        };
        let v = judge(&e);
        assert_eq!((v.refused_resends, v.duplicates_at_sim), (1, 1));
        assert_eq!((v.outbound_stored, v.outbound_unstored), (3, 1));
        assert_eq!((v.outbound_lost, v.outbound_lost_sample.clone()), (1, vec!["m3".to_owned()]));
        assert_eq!(v.outbound_by_status.get("sending"), Some(&1));
    }
}
