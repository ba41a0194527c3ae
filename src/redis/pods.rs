//! The Redis adapter of the cluster port: pod heartbeat keys
//! `{prefix}:{cluster}:pod:{pod_id}` (TTL 3 × heartbeat) plus a set of pod ids,
//! pruned of expired pods, so reading the live pods never scans the keyspace.

use std::time::Duration;

use cabine_actors::ports::{ClusterError, PodBeat, PodRegistry};
use fred::prelude::{Client, Value};
use fred::types::scripts::Script;

use super::keys::KeyLayout;
use super::scripts::{self, SCRIPTS, ScriptError};

/// Pod heartbeats in Redis; one round trip per call.
pub struct RedisPodRegistry {
    client: Client,
    keys: KeyLayout,
    ttl: Duration,
    timeout: Duration,
}

impl RedisPodRegistry {
    /// `heartbeat`: the beat period; keys live 3 × that.
    pub fn new(client: Client, keys: KeyLayout, heartbeat: Duration, timeout: Duration) -> RedisPodRegistry {
        RedisPodRegistry { client, keys, ttl: heartbeat * 3, timeout }
    }

    async fn call(
        &self,
        op: &'static str,
        script: &Script,
        keys: Vec<String>,
        args: Vec<Value>,
    ) -> Result<Value, ClusterError> {
        scripts::call(&self.client, op, script, keys, args, self.timeout).await.map_err(to_cluster_error)
    }
}

fn to_cluster_error(e: ScriptError) -> ClusterError {
    ClusterError::Unavailable(e.to_string())
}

#[async_trait::async_trait]
impl PodRegistry for RedisPodRegistry {
    async fn beat(&self, beat: &PodBeat) -> Result<(), ClusterError> {
        let json = serde_json::to_string(beat).map_err(|e| ClusterError::Unavailable(e.to_string()))?;
        let ttl_ms = i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX);
        let keys = vec![self.keys.pod(&beat.pod_id), self.keys.pods()];
        let args = vec![json.into(), ttl_ms.into(), beat.pod_id.clone().into(), self.keys.pod_prefix().into()];
        self.call("beat", &SCRIPTS.beat, keys, args).await.map(drop)
    }

    async fn live_pods(&self) -> Result<Vec<PodBeat>, ClusterError> {
        let reply = self
            .call("live_pods", &SCRIPTS.live_pods, vec![self.keys.pods()], vec![self.keys.pod_prefix().into()])
            .await?;
        let items = scripts::array("live_pods", reply).map_err(to_cluster_error)?;
        let mut pods = Vec::with_capacity(items.len());
        for item in &items {
            let text = scripts::text("live_pods", item).map_err(to_cluster_error)?;
            match serde_json::from_str::<PodBeat>(&text) {
                Ok(beat) => pods.push(beat),
                Err(e) => tracing::warn!(error = %e, "ignoring an unreadable pod heartbeat"),
            }
        }
        pods.sort_by(|a, b| a.pod_id.cmp(&b.pod_id));
        Ok(pods)
    }

    async fn leave(&self, pod_id: &str) -> Result<(), ClusterError> {
        let keys = vec![self.keys.pod(pod_id), self.keys.pods()];
        self.call("leave", &SCRIPTS.leave, keys, vec![pod_id.to_owned().into()]).await.map(drop)
    }
}
