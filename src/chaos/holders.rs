//! Who holds the primary channel's stream slots, as the pods' `GET /cluster`
//! shows it (read from the lease store): the faults aim at those pods. The
//! first pod that answers within a bound is asked; a paused or dead pod is
//! simply skipped.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

use crate::harness::LocalCluster;

/// Bound on one pod's answer.
const ASK_WITHIN: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum HoldersError {
    #[error("no pod answered GET /cluster: {0}")]
    NoAnswer(String),
    #[error("only {held} of {slots} stream slots held after {within:?}")]
    NotHeld { held: usize, slots: usize, within: Duration },
}

#[derive(Debug, Deserialize)]
struct ClusterView {
    #[serde(default)]
    holders: Vec<PoolHolders>,
}

#[derive(Debug, Deserialize)]
struct PoolHolders {
    channel: String,
    pool: String,
    #[serde(default)]
    holders: Vec<HolderView>,
}

#[derive(Debug, Deserialize)]
struct HolderView {
    slot: u8,
    pod: String,
}

/// Stream slot → pod id, for the `cpm` channel.
pub async fn stream_holders(c: &LocalCluster) -> Result<BTreeMap<u8, String>, HoldersError> {
    let http =
        reqwest::Client::builder().timeout(ASK_WITHIN).build().map_err(|e| HoldersError::NoAnswer(e.to_string()))?;
    let mut last = String::from("no pod");
    for pod in &c.pods {
        let view = async { http.get(format!("http://{}/cluster", pod.http)).send().await?.json::<ClusterView>().await };
        match view.await {
            Ok(v) => return Ok(stream_pool(v)),
            Err(e) => last = format!("{}: {e}", pod.pod_id),
        }
    }
    Err(HoldersError::NoAnswer(last))
}

fn stream_pool(view: ClusterView) -> BTreeMap<u8, String> {
    view.holders
        .into_iter()
        .filter(|p| p.channel == "cpm" && p.pool == "stream")
        .flat_map(|p| p.holders)
        .map(|h| (h.slot, h.pod))
        .collect()
}

/// Waits until every stream slot is held (a fresh cluster waits out its quarantine first).
pub async fn wait_all_held(c: &LocalCluster, within: Duration) -> Result<(), HoldersError> {
    let deadline = Instant::now() + within;
    let slots = usize::from(c.settings.pools.stream.get());
    loop {
        let held = stream_holders(c).await.map(|h| h.len()).unwrap_or(0);
        if held == slots {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(HoldersError::NotHeld { held, slots, within });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Pods holding at least one stream slot (index into `c.pods`, pod id, slots held), by pod id.
pub fn holding_pods(c: &LocalCluster, holders: &BTreeMap<u8, String>) -> Vec<(usize, Vec<u8>)> {
    let mut out: Vec<(usize, Vec<u8>)> = c
        .pods
        .iter()
        .enumerate()
        .map(|(i, pod)| (i, holders.iter().filter(|(_, p)| **p == pod.pod_id).map(|(s, _)| *s).collect::<Vec<u8>>()))
        .filter(|(_, slots)| !slots.is_empty())
        .collect();
    out.sort_by(|a, b| c.pods[a.0].pod_id.cmp(&c.pods[b.0].pod_id));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_primary_stream_pool_counts() {
        let json = r#"{"holders":[
            {"channel":"cpm","pool":"stream","holders":[{"slot":1,"pod":"a","grant":"g","ttl_ms":5},{"slot":3,"pod":"b"}]},
            {"channel":"cpm","pool":"send","holders":[{"slot":1,"pod":"c"}]},
            {"channel":"csm","pool":"stream","holders":[{"slot":2,"pod":"d"}]}]}"#;
        let view: ClusterView = serde_json::from_str(json).unwrap();
        let got = stream_pool(view);
        assert_eq!(got, BTreeMap::from([(1, "a".to_owned()), (3, "b".to_owned())]));
    }
}
