//! What one chaos run stands on: a private redis-server (always: faults aimed at
//! Redis must not touch anyone else's), a private Postgres or NATS when the
//! scenario restarts one (else the shared ones on loopback, isolated by schema,
//! subjects and stream names), and a [`LocalCluster`] — the child simulator and
//! P pods — pointed at them with short timings. Torn down by [`World::cleanup`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::ChaosConfig;
use super::scenario::{Scenario, Timing};
use crate::harness::{
    ClusterError, ClusterSpec, LocalCluster, NatsServer, NatsServerError, PostgresServer, PostgresServerError,
    RedisServer, RedisServerError, cluster, unique_name,
};

#[derive(Debug, thiserror::Error)]
pub enum WorldError {
    /// The scenario cannot run on this machine (no PostgreSQL binaries, …): skipped, not failed.
    #[error("{0}")]
    Unavailable(String),
    #[error("private redis-server: {0}")]
    Redis(#[from] RedisServerError),
    #[error("private postgres: {0}")]
    Postgres(#[from] PostgresServerError),
    #[error("private nats-server: {0}")]
    Nats(#[from] NatsServerError),
    #[error("local cluster: {0}")]
    Cluster(#[from] ClusterError),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// The running world of one scenario.
pub struct World {
    pub cluster: LocalCluster,
    pub redis: RedisServer,
    pub postgres: Option<PostgresServer>,
    pub nats: Option<NatsServer>,
    pub timing: Timing,
    /// The simulator's caps, as it was started.
    pub max_in_flight: u64,
    pub max_streams: u64,
    /// Redis's snapshot directory.
    dir: PathBuf,
}

/// The simulator's caps (its defaults: the Central Bank's 6 and 6).
const SIM_MAX_IN_FLIGHT: u64 = 6;
const SIM_MAX_STREAMS: u64 = 6;

/// Outbound timings short enough for a run: janitor, confirmer and status every
/// 200 ms, a claim left by a dead sender back in the queue after 5 s.
const OUTBOUND_TIMINGS: &[(&str, &str)] = &[
    ("CABINE__OUTBOUND__JANITOR_INTERVAL", "200ms"),
    ("CABINE__OUTBOUND__CONFIRM_INTERVAL", "200ms"),
    ("CABINE__OUTBOUND__STATUS_INTERVAL", "200ms"),
    ("CABINE__OUTBOUND__IDLE_RELEASE", "500ms"),
    ("CABINE__OUTBOUND__IDLE_POLL", "50ms"),
    ("CABINE__OUTBOUND__PULL_WAIT", "200ms"),
    ("CABINE__OUTBOUND__ACK_WAIT", "10s"),
    ("CABINE__TIMING__BACKOFF_MAX", "1s"),
    ("CABINE__TIMING__PROCESSING_TIMEOUT", "5s"),
];

impl World {
    /// Private servers first (a scenario that cannot have its server is [`WorldError::Unavailable`]), then the cluster.
    pub async fn start(exe: &Path, cfg: &ChaosConfig, scenario: Scenario) -> Result<World, WorldError> {
        let postgres = if scenario.needs_private_postgres() {
            Some(PostgresServer::start().await.map_err(|e| match e {
                PostgresServerError::NotInstalled(why) => {
                    WorldError::Unavailable(format!("no private postgres: {why}"))
                }
                other => WorldError::Postgres(other),
            })?)
        } else {
            None
        };
        let nats = if scenario.needs_private_nats() {
            Some(NatsServer::start().await.map_err(|e| match e {
                NatsServerError::Spawn(io) => WorldError::Unavailable(format!("no nats-server to start: {io}")),
                other => WorldError::Nats(other),
            })?)
        } else {
            None
        };
        let dir = std::env::temp_dir().join(unique_name("cabine_chaos_redis"));
        std::fs::create_dir_all(&dir)?;
        let redis = RedisServer::start_in(&dir).await?;
        let env = pod_env(cfg, &redis, postgres.as_ref(), nats.as_ref());
        let spec = ClusterSpec { tag: "chaos".into(), pods: cfg.pods, env, sim_args: sim_args(cfg) };
        let cluster = match start_cluster(exe, spec, cfg.latency_ms).await {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let t = &cluster.settings.timing;
        let timing = Timing { lease: t.lease, lock_delay: t.lock_delay };
        Ok(World {
            cluster,
            redis,
            postgres,
            nats,
            timing,
            max_in_flight: SIM_MAX_IN_FLIGHT,
            max_streams: SIM_MAX_STREAMS,
            dir,
        })
    }

    /// Pods, simulator, schema, streams and keys, then the private servers and their files.
    pub async fn cleanup(self) {
        let World { cluster, redis, postgres, nats, dir, .. } = self;
        cluster.cleanup().await;
        drop((redis, postgres, nats));
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The cluster, with the simulator's latency set.
async fn start_cluster(exe: &Path, spec: ClusterSpec, latency_ms: u64) -> Result<LocalCluster, WorldError> {
    let cluster = LocalCluster::start(exe, spec).await?;
    let latency = serde_json::json!({ "latency_ms": latency_ms, "jitter_ms": latency_ms / 2 });
    if let Err(e) = cluster.sim.control.faults(latency).await {
        cluster.cleanup().await;
        return Err(ClusterError::Sim(e).into());
    }
    Ok(cluster)
}

/// Every pod's environment: test timings, outbound timings, quiet logs, the private servers.
fn pod_env(
    cfg: &ChaosConfig,
    redis: &RedisServer,
    postgres: Option<&PostgresServer>,
    nats: Option<&NatsServer>,
) -> Vec<(String, String)> {
    let mut env = cluster::test_timings();
    env.extend(cluster::pairs(OUTBOUND_TIMINGS));
    env.push(("CABINE__LOG__FILTER".into(), cfg.pod_log.clone()));
    env.push(("CABINE__OUTBOUND__ENABLED".into(), (cfg.outbound_rate > 0.0).to_string()));
    env.push(("CABINE__REDIS__URL".into(), redis.url()));
    env.push(("CABINE__ICOM__SERVER_HOLD".into(), format!("{}ms", cfg.hold.as_millis())));
    if let Some(pg) = postgres {
        env.push(("CABINE__POSTGRES__URL".into(), pg.url()));
    }
    if let Some(n) = nats {
        env.push(("CABINE__NATS__URL".into(), n.url()));
    }
    if cfg.reconcile {
        let window = format!("{}s", super::RECONCILE_WINDOW.as_secs());
        for (k, v) in [
            ("CABINE__RECONCILE__ENABLED", "true"),
            ("CABINE__RECONCILE__INTERVAL", window.as_str()),
            ("CABINE__RECONCILE__SETTLE_MARGIN", window.as_str()),
            ("CABINE__RECONCILE__LOOKBACK", window.as_str()),
            ("CABINE__RECONCILE__REPORT_TIMEOUT", "20s"),
            ("CABINE__RECONCILE__RETRY_AFTER", "1s"),
            ("CABINE__RECONCILE__MAX_WINDOWS", "100"),
        ] {
            env.push((k.into(), v.into()));
        }
    }
    env.extend(cfg.env.iter().cloned());
    env
}

/// `cabine sim` arguments: the run's hold, seed, an outbound log long enough for the run.
fn sim_args(cfg: &ChaosConfig) -> Vec<String> {
    let outbound = (cfg.outbound_rate * cfg.seconds.as_secs_f64() * 3.0) as usize + 10_000;
    let hold = format!("{}ms", cfg.hold.as_millis());
    let mut args: Vec<String> = vec!["--hold".into(), hold, "--stream-idle".into(), "60s".into()];
    args.extend(["--seed".to_owned(), cfg.seed.to_string(), "--outbound-cap".to_owned(), outbound.to_string()]);
    args.extend(["--max-in-flight".to_owned(), SIM_MAX_IN_FLIGHT.to_string()]);
    args.extend(["--max-streams".to_owned(), SIM_MAX_STREAMS.to_string()]);
    args
}

/// Bound on waiting for something the world must do (a pod to be ready, slots to be held).
pub const READY_WITHIN: Duration = Duration::from_secs(30);
