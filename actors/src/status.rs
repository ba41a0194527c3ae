//! What `/actors` shows: a tree of actor status nodes. Each actor reports its
//! own node; supervisors assemble their children's.

use serde::{Deserialize, Serialize};

/// One actor as an operator sees it at 3 a.m.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ActorStatus {
    /// Stable path-like id, e.g. `slot/cpm/3`; what `POST /actors/{id}/restart` takes.
    pub id: String,
    /// `root`, `channel`, `slot`, `lease-heartbeat`, ...
    pub kind: String,
    /// The actor's state-machine state (`standby`, `holding`, `polling`, ...).
    pub state: String,
    /// Milliseconds since the UNIX epoch when `state` was entered.
    pub since_ms: u64,
    /// Restarts by its supervisor since the process started.
    pub restarts: u32,
    pub last_error: Option<String>,
    /// Kind-specific figures (fence, lease remaining, cursor age, ...).
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub details: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    pub children: Vec<ActorStatus>,
}

impl ActorStatus {
    /// The root node of a pod whose tree has not been started (or has stopped).
    pub fn empty_root() -> Self {
        ActorStatus { id: "root".into(), kind: "root".into(), state: "idle".into(), ..Default::default() }
    }
}
