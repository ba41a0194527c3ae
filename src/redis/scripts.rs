//! The Lua scripts of the coordination adapter (files under `scripts/`) and how
//! they are called: EVALSHA, SCRIPT LOAD once and again on NOSCRIPT, one
//! deadline per call, a round-trip histogram, and errors split into
//! unavailable (fail closed, retry) and fatal (a bug or a broken server).

use std::sync::LazyLock;
use std::time::Duration;

use fred::error::ErrorKind;
use fred::prelude::{Client, Value};
use fred::types::scripts::Script;
use tokio::time::Instant;

/// Every script, compiled in; the grant/renew scripts start with the epoch prelude.
pub(crate) struct Scripts {
    pub acquire: Script,
    pub renew: Script,
    pub renew_many: Script,
    pub release: Script,
    pub quarantine: Script,
    pub holders: Script,
    pub beat: Script,
    pub live_pods: Script,
    pub leave: Script,
}

macro_rules! with_epoch {
    ($file:literal) => {
        Script::from_lua(concat!(include_str!("scripts/epoch.lua"), include_str!($file)))
    };
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    acquire: with_epoch!("scripts/acquire.lua"),
    renew: with_epoch!("scripts/renew.lua"),
    renew_many: with_epoch!("scripts/renew_many.lua"),
    release: Script::from_lua(include_str!("scripts/release.lua")),
    quarantine: Script::from_lua(include_str!("scripts/quarantine.lua")),
    holders: Script::from_lua(include_str!("scripts/holders.lua")),
    beat: Script::from_lua(include_str!("scripts/beat.lua")),
    live_pods: Script::from_lua(include_str!("scripts/live_pods.lua")),
    leave: Script::from_lua(include_str!("scripts/leave.lua")),
});

impl Scripts {
    fn all(&self) -> [&Script; 9] {
        [
            &self.acquire,
            &self.renew,
            &self.renew_many,
            &self.release,
            &self.quarantine,
            &self.holders,
            &self.beat,
            &self.live_pods,
            &self.leave,
        ]
    }
}

/// A script call that did not produce a usable reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScriptError {
    /// Redis unreachable, slow or temporarily refusing: nothing happened that we can rely on.
    #[error("redis unavailable during {op}: {reason}")]
    Unavailable { op: &'static str, reason: String },
    /// A script error or a reply of the wrong shape: a bug or a broken server.
    #[error("redis {op} failed: {reason}")]
    Fatal { op: &'static str, reason: String },
}

/// Loads every script into Redis's cache (SCRIPT LOAD); later calls use EVALSHA.
pub async fn load_all(client: &Client, deadline: Duration) -> Result<(), ScriptError> {
    for script in SCRIPTS.all() {
        match tokio::time::timeout(deadline, script.load(client)).await {
            Err(_) => return Err(unavailable("script load", format!("no reply within {deadline:?}"))),
            Ok(Err(e)) => return Err(classify("script load", e)),
            Ok(Ok(())) => {}
        }
    }
    Ok(())
}

/// EVALSHA (SCRIPT LOAD and retry on NOSCRIPT), all of it within `deadline`.
pub(crate) async fn call(
    client: &Client,
    op: &'static str,
    script: &Script,
    keys: Vec<String>,
    args: Vec<Value>,
    deadline: Duration,
) -> Result<Value, ScriptError> {
    let started = Instant::now();
    let reply = tokio::time::timeout(deadline, script.evalsha_with_reload::<Value, _, _>(client, keys, args)).await;
    let result = match reply {
        Err(_) => Err(unavailable(op, format!("no reply within {deadline:?}"))),
        Ok(Err(e)) => Err(classify(op, e)),
        Ok(Ok(v)) => {
            metrics::histogram!("cabine_redis_round_trip_seconds", "op" => op).record(started.elapsed().as_secs_f64());
            Ok(v)
        }
    };
    if let Err(e) = &result {
        let kind = if matches!(e, ScriptError::Fatal { .. }) { "fatal" } else { "unavailable" };
        metrics::counter!("cabine_redis_errors_total", "op" => op, "kind" => kind).increment(1);
    }
    result
}

fn unavailable(op: &'static str, reason: String) -> ScriptError {
    ScriptError::Unavailable { op, reason }
}

/// Server replies `ERR …` (a Lua error) and malformed frames are fatal; everything
/// about reaching Redis (I/O, timeouts, reconnecting, LOADING, BUSY, READONLY…) is transient.
fn classify(op: &'static str, e: fred::error::Error) -> ScriptError {
    let fatal = match e.kind() {
        ErrorKind::InvalidArgument
        | ErrorKind::InvalidCommand
        | ErrorKind::Parse
        | ErrorKind::Protocol
        | ErrorKind::Config
        | ErrorKind::Url
        | ErrorKind::Auth
        | ErrorKind::NotFound => true,
        ErrorKind::Unknown => e.details().starts_with("ERR"),
        _ => false,
    };
    let reason = format!("{:?}: {}", e.kind(), e.details());
    if fatal { ScriptError::Fatal { op, reason } } else { unavailable(op, reason) }
}

/// Reads a script's array reply.
pub(crate) fn array(op: &'static str, v: Value) -> Result<Vec<Value>, ScriptError> {
    match v {
        Value::Array(items) => Ok(items),
        Value::Null => Ok(Vec::new()),
        other => Err(bad_reply(op, &other)),
    }
}

pub(crate) fn text(op: &'static str, v: &Value) -> Result<String, ScriptError> {
    v.as_string().ok_or_else(|| bad_reply(op, v))
}

pub(crate) fn int(op: &'static str, v: &Value) -> Result<i64, ScriptError> {
    v.as_i64().ok_or_else(|| bad_reply(op, v))
}

pub(crate) fn bad_reply(op: &'static str, v: &Value) -> ScriptError {
    ScriptError::Fatal { op, reason: format!("unexpected reply {v:?}") }
}
