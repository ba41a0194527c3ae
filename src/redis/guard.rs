//! What the Redis rate bucket and circuit breaker share: their Lua scripts run
//! by EVALSHA (loaded again on NOSCRIPT) in one round trip, the clock the
//! scripts read (Redis `TIME`, one clock for every pod; tests pin it), the
//! split of fred errors into transient and fatal, and their key names.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use fred::prelude::*;
use fred::types::scripts::Script;

use crate::config::{ChannelId, Ispb};

/// Which clock a guard script reads.
#[derive(Clone, Debug, Default)]
pub enum ScriptClock {
    /// Redis `TIME` inside the script: one clock for the whole cluster.
    #[default]
    Server,
    /// Milliseconds since the UNIX epoch, set by the caller (tests).
    Pinned(Arc<AtomicU64>),
}

impl ScriptClock {
    /// A pinned clock starting at `ms`, and the handle that moves it.
    pub fn pinned(ms: u64) -> (ScriptClock, Arc<AtomicU64>) {
        let at = Arc::new(AtomicU64::new(ms));
        (ScriptClock::Pinned(at.clone()), at)
    }

    /// The script's `now` argument: 0 means "read Redis TIME".
    pub(crate) fn arg(&self) -> u64 {
        match self {
            ScriptClock::Server => 0,
            ScriptClock::Pinned(at) => at.load(Ordering::SeqCst),
        }
    }
}

/// A failed script call, split by what the caller does.
#[derive(Debug)]
pub(crate) enum ScriptFailure {
    /// Unreachable, timed out, loading, busy: fail closed and retry later.
    Transient(String),
    /// Script error, bad reply: a bug, escalate.
    Fatal(String),
}

/// One Lua script of a guard.
pub(crate) struct GuardScript {
    script: Script,
}

impl GuardScript {
    pub(crate) fn new(lua: &'static str) -> Self {
        GuardScript { script: Script::from_lua(lua) }
    }

    /// EVALSHA, reloading the script once on NOSCRIPT; integers back.
    pub(crate) async fn run(
        &self,
        client: &Client,
        keys: Vec<String>,
        args: Vec<Value>,
    ) -> Result<Vec<i64>, ScriptFailure> {
        let reply: Value = self.script.evalsha_with_reload(client, keys, args).await.map_err(|e| classify(&e))?;
        match reply {
            Value::Array(items) => items
                .into_iter()
                .map(|v| v.as_i64().ok_or_else(|| ScriptFailure::Fatal(format!("non-integer in reply: {v:?}"))))
                .collect(),
            other => Err(ScriptFailure::Fatal(format!("unexpected reply {other:?}"))),
        }
    }
}

/// Transient: the connection or the server's momentary state. Fatal: everything else.
pub(crate) fn classify(e: &fred::error::Error) -> ScriptFailure {
    use fred::error::ErrorKind as K;
    let transient_reply = ["LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "READONLY", "CLUSTERDOWN"];
    let msg = e.to_string();
    match e.kind() {
        K::IO | K::Timeout | K::Canceled | K::Backpressure | K::Routing | K::Cluster => ScriptFailure::Transient(msg),
        _ if transient_reply.iter().any(|p| e.details().starts_with(p)) => ScriptFailure::Transient(msg),
        _ => ScriptFailure::Fatal(msg),
    }
}

/// `{prefix}:{cluster}:{ispb}:{channel}:{what}`: the keys of one channel's guards.
#[derive(Clone, Debug)]
pub struct GuardKeys {
    base: String,
}

impl GuardKeys {
    pub fn new(prefix: &str, cluster: &str, ispb: &Ispb) -> Self {
        GuardKeys { base: format!("{prefix}:{cluster}:{ispb}") }
    }

    pub fn of(&self, channel: ChannelId, what: &str) -> String {
        format!("{}:{channel}:{what}", self.base)
    }
}
