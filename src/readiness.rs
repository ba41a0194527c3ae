//! Readiness: a background probe of Redis, Postgres (and its migrations), NATS
//! (and the JetStream streams this deployment uses) whose latest result
//! `/health/ready` serves and `/metrics` exports. A missing stream is one
//! failing check naming it, not a warning per row the publisher cannot send.
//!
//! Probing in the background keeps the endpoint instant and gives the gauges a
//! steady cadence; a stopping pod reports not-ready at once, whatever the probe says.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::db::Db;
use fred::prelude::*;
use serde::Serialize;
use tokio::sync::watch;

use crate::db;

/// One dependency's last check.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub ok: bool,
    pub detail: String,
    pub checked_at_ms: u64,
}

/// What `/health/ready` answers.
#[derive(Clone, Debug, Serialize)]
pub struct ReadinessReport {
    pub ready: bool,
    pub stopping: bool,
    /// Names of the dependencies whose last check failed.
    pub failing: Vec<String>,
    pub checks: BTreeMap<String, Check>,
}

/// Shared handle: the probe writes, handlers read, shutdown flips `stopping`.
#[derive(Clone)]
pub struct Readiness {
    checks: Arc<watch::Sender<BTreeMap<String, Check>>>,
    stopping: Arc<AtomicBool>,
}

impl Default for Readiness {
    fn default() -> Self {
        Readiness { checks: Arc::new(watch::channel(BTreeMap::new()).0), stopping: Arc::new(AtomicBool::new(false)) }
    }
}

impl Readiness {
    pub fn report(&self) -> ReadinessReport {
        let checks = self.checks.borrow().clone();
        let stopping = self.stopping.load(Ordering::SeqCst);
        let failing: Vec<String> = checks.iter().filter(|(_, c)| !c.ok).map(|(n, _)| n.clone()).collect();
        let ready = !stopping && !checks.is_empty() && failing.is_empty();
        ReadinessReport { ready, stopping, failing, checks }
    }

    /// From now on the pod reports 503: it is draining.
    pub fn set_stopping(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        metrics::gauge!("cabine_ready").set(0.0);
    }

    fn publish(&self, checks: BTreeMap<String, Check>) {
        for (name, check) in &checks {
            metrics::gauge!("cabine_dependency_up", "dependency" => name.clone()).set(if check.ok { 1.0 } else { 0.0 });
        }
        self.checks.send_replace(checks);
        metrics::gauge!("cabine_ready").set(if self.report().ready { 1.0 } else { 0.0 });
    }

    /// Resolves once a probe has found every dependency up.
    pub async fn wait_ready(&self) {
        let mut rx = self.checks.subscribe();
        loop {
            if self.report().ready {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }
}

/// The things readiness depends on.
#[derive(Clone)]
pub struct DependencyProbe {
    redis: fred::clients::Client,
    postgres: Db,
    nats: async_nats::Client,
    /// Bound on each single check.
    timeout: Duration,
    /// Why Redis could not be reached last (a refused certificate, a refused
    /// connection): a failed PING says only that it timed out.
    redis_refusal: Arc<Mutex<Option<String>>>,
    /// The JetStream streams that must exist (`jetstream` check); none: no such check.
    streams: Vec<String>,
    /// The last `jetstream` check that found every stream, and when: streams are
    /// not deleted in the normal course of things, so it is re-asked only every
    /// [`STREAMS_RECHECK`] (a failing check is re-asked every probe).
    streams_seen: Arc<Mutex<Option<(tokio::time::Instant, Check)>>>,
}

/// How long a `jetstream` check that found every stream is reused.
const STREAMS_RECHECK: Duration = Duration::from_secs(10);

impl DependencyProbe {
    /// Starts listening for the Redis client's connection errors.
    pub fn new(redis: fred::clients::Client, postgres: Db, nats: async_nats::Client, timeout: Duration) -> Self {
        let redis_refusal: Arc<Mutex<Option<String>>> = Arc::default();
        let (failed, connected) = (redis_refusal.clone(), redis_refusal.clone());
        redis.on_error(move |(e, _)| {
            *lock(&failed) = Some(e.to_string());
            async { Ok(()) }
        });
        redis.on_reconnect(move |_| {
            *lock(&connected) = None;
            async { Ok(()) }
        });
        DependencyProbe {
            redis,
            postgres,
            nats,
            timeout,
            redis_refusal,
            streams: Vec::new(),
            streams_seen: Arc::default(),
        }
    }

    /// Also checks that these JetStream streams exist (check `jetstream`).
    pub fn with_streams(mut self, streams: Vec<String>) -> Self {
        self.streams = streams;
        self
    }

    pub async fn check_all(&self) -> BTreeMap<String, Check> {
        let (redis, pg, nats) = tokio::join!(self.check_redis(), self.check_postgres(), self.check_nats());
        let mut checks = BTreeMap::new();
        checks.insert("redis".to_owned(), redis);
        let (postgres, migrations) = pg;
        checks.insert("postgres".to_owned(), postgres);
        checks.insert("migrations".to_owned(), migrations);
        if !self.streams.is_empty() {
            let streams = match nats.ok {
                true => self.streams_check().await,
                false => check(false, "unknown: nats unreachable"),
            };
            checks.insert("jetstream".to_owned(), streams);
        }
        checks.insert("nats".to_owned(), nats);
        checks
    }

    /// The last good `jetstream` check while it is recent, else a fresh one.
    async fn streams_check(&self) -> Check {
        let recent = lock(&self.streams_seen).clone().filter(|(at, _)| at.elapsed() < STREAMS_RECHECK);
        if let Some((_, check)) = recent {
            return check;
        }
        let fresh = self.check_streams().await;
        *lock(&self.streams_seen) = fresh.ok.then(|| (tokio::time::Instant::now(), fresh.clone()));
        fresh
    }

    /// Every stream of [`DependencyProbe::with_streams`] exists; else one failure naming the missing ones.
    async fn check_streams(&self) -> Check {
        let js = async_nats::jetstream::new(self.nats.clone());
        let mut missing = Vec::new();
        for name in &self.streams {
            match tokio::time::timeout(self.timeout, js.get_stream(name)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) if stream_not_found(&e) => missing.push(name.as_str()),
                Ok(Err(e)) => return check(false, format!("stream {name}: {e}")),
                Err(_) => return check(false, format!("stream {name}: no answer within {:?}", self.timeout)),
            }
        }
        if missing.is_empty() {
            return check(true, format!("streams {}", self.streams.join(", ")));
        }
        check(
            false,
            format!(
                "missing stream(s) {}: nothing can be published to or pulled from them; \
                 run `cabine migrate` or set postgres.migrate_on_start = true",
                missing.join(", ")
            ),
        )
    }

    async fn check_redis(&self) -> Check {
        let ping = tokio::time::timeout(self.timeout, self.redis.ping::<String>(None)).await;
        let failure = match ping {
            Ok(Ok(_)) => return check(true, "PONG"),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {:?}", self.timeout),
        };
        match lock(&self.redis_refusal).as_deref() {
            Some(why) => check(false, format!("{failure}; last connection attempt: {why}")),
            None => check(false, failure),
        }
    }

    async fn check_postgres(&self) -> (Check, Check) {
        let applied = tokio::time::timeout(self.timeout, db::applied_version(&self.postgres)).await;
        let latest = db::latest_version();
        match applied {
            Err(_) => {
                let c = check(false, format!("no answer within {:?}", self.timeout));
                (c.clone(), check(false, "unknown: postgres unreachable"))
            }
            Ok(Err(e)) => (check(false, error_chain(&e)), check(false, "unknown: postgres unreachable")),
            Ok(Ok(v)) => {
                let applied = v.unwrap_or(0);
                let m = if applied >= latest {
                    check(true, format!("version {applied}"))
                } else {
                    check(false, format!("version {applied} applied, {latest} embedded: run `cabine migrate`"))
                };
                (check(true, "SELECT ok"), m)
            }
        }
    }

    async fn check_nats(&self) -> Check {
        use async_nats::connection::State;
        match self.nats.connection_state() {
            State::Connected => match tokio::time::timeout(self.timeout, self.nats.flush()).await {
                Ok(Ok(())) => check(true, "connected"),
                Ok(Err(e)) => check(false, e.to_string()),
                Err(_) => check(false, format!("no flush within {:?}", self.timeout)),
            },
            other => check(false, format!("{other:?}")),
        }
    }
}

/// JetStream answered that the stream does not exist (error 10059).
fn stream_not_found(e: &async_nats::jetstream::context::GetStreamError) -> bool {
    use async_nats::jetstream::ErrorCode;
    use async_nats::jetstream::context::GetStreamErrorKind;
    matches!(e.kind(), GetStreamErrorKind::JetStream(js) if js.error_code() == ErrorCode::STREAM_NOT_FOUND)
}

/// Probes every `interval` for the life of the process.
pub fn spawn_probe_loop(
    probe: DependencyProbe,
    readiness: Readiness,
    interval: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            readiness.publish(probe.check_all().await);
        }
    })
}

/// An error and its sources, `: `-joined, each source shown once: tokio-postgres
/// keeps the reason of a failure (a refused certificate, the server's message)
/// in its source, not in its own text.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = cause.source();
    }
    text
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A check; its detail (often a client's error text) shows no credential.
fn check(ok: bool, detail: impl Into<String>) -> Check {
    let checked_at_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    Check { ok, detail: crate::config::mask_credentials(&detail.into()), checked_at_ms }
}
