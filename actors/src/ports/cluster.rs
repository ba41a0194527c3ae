//! The cluster port: pod heartbeat keys (TTL 3 × beat) from which every pod
//! learns which pods are alive, for fair share and `/cluster`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::domain::ChannelId;

/// What a pod says about itself on every beat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodBeat {
    pub pod_id: String,
    pub pid: u32,
    pub version: String,
    pub uptime_s: u64,
    /// Slots it holds, as `pool/slot` strings (`cpm:stream/3`).
    pub held: Vec<String>,
    /// Stream pool size per enabled channel: a draining pod closes a stream
    /// only when no other live pod runs that slot (alone, or the pool shrank).
    #[serde(default)]
    pub streams: BTreeMap<ChannelId, u8>,
    /// Stream slots this pod failed over and stays out of for now (`cpm:stream/3`):
    /// while one of a channel's cools, the pod takes no share of that channel.
    #[serde(default)]
    pub cooldown: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    /// Store unreachable: treat the view as unknown, retry.
    #[error("cluster store unavailable: {0}")]
    Unavailable(String),
}

#[async_trait::async_trait]
pub trait PodRegistry: Send + Sync + 'static {
    /// Writes this pod's heartbeat key with a TTL of 3 × heartbeat.
    async fn beat(&self, beat: &PodBeat) -> Result<(), ClusterError>;
    /// Every pod whose heartbeat key is alive (this one included).
    async fn live_pods(&self) -> Result<Vec<PodBeat>, ClusterError>;
    /// Removes this pod's key (graceful stop).
    async fn leave(&self, pod_id: &str) -> Result<(), ClusterError>;
}
