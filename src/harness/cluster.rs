//! A local cluster: a child simulator and P child `cabine run` pods with their
//! own Postgres schema, Redis prefix and NATS subjects/streams, migrated and
//! ready; torn down (schema, streams, keys) by [`LocalCluster::cleanup`].
//! The integration tests and `cabine bench inbound` run on it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::{Pod, PodError, SimProcess, SimProcessError, isolated_env, unique_name};
use crate::config::{DEFAULT_TOML, Settings};

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("simulator: {0}")]
    Sim(#[from] SimProcessError),
    #[error("pod: {0}")]
    Pod(#[from] PodError),
    #[error("setup: {0}")]
    Setup(String),
    /// A step of the rig did not end within its bound.
    #[error("{what} did not end within {within:?}")]
    TimedOut { what: String, within: Duration },
}

/// Bound on the rig's own store calls (migrations, a count, dropping the schema).
const STORE_BOUND: Duration = Duration::from_secs(30);

/// `f` within `within`, else [`ClusterError::TimedOut`] naming `what`.
pub async fn within<T>(what: &str, within: Duration, f: impl Future<Output = T>) -> Result<T, ClusterError> {
    tokio::time::timeout(within, f).await.map_err(|_| ClusterError::TimedOut { what: what.to_owned(), within })
}

/// What to start.
pub struct ClusterSpec {
    /// Prefix of the unique name (schema, prefix, subjects, streams).
    pub tag: String,
    pub pods: usize,
    /// `CABINE__…` overrides for every pod (on top of the isolation and the simulator's URL).
    pub env: Vec<(String, String)>,
    /// Arguments of `cabine sim` after the ISPB and the port-0 listeners.
    pub sim_args: Vec<String>,
}

/// Short timings for tests: lease 2 s, heartbeat 500 ms, long-poll bound 1 s
/// (the simulator holds 200 ms), acquire every 200 ms, drain 1 s.
pub fn test_timings() -> Vec<(String, String)> {
    pairs(&[
        ("CABINE__TIMING__LEASE", "2s"),
        ("CABINE__TIMING__HEARTBEAT", "500ms"),
        ("CABINE__TIMING__DRIFT_MARGIN", "100ms"),
        ("CABINE__TIMING__LONG_POLL_TIMEOUT", "1s"),
        ("CABINE__TIMING__SEND_TIMEOUT", "1s"),
        ("CABINE__TIMING__LOCK_DELAY", "1s"),
        ("CABINE__TIMING__REQUEST_MARGIN", "100ms"),
        ("CABINE__TIMING__GATE_MARGIN", "200ms"),
        ("CABINE__ICOM__SERVER_HOLD", "200ms"),
        ("CABINE__TIMING__ACQUIRE_INTERVAL", "200ms"),
        ("CABINE__TIMING__DRAIN_TIME", "1s"),
        ("CABINE__TIMING__STOP_TIMEOUT", "3s"),
        ("CABINE__TIMING__SWEEP_INTERVAL", "500ms"),
        ("CABINE__TIMING__REPUBLISH_AFTER", "2s"),
        ("CABINE__HTTP__PROBE_INTERVAL", "200ms"),
    ])
}

/// `cabine sim` arguments matching [`test_timings`]: 200 ms hold.
pub fn test_sim_args() -> Vec<String> {
    ["--hold", "200ms", "--seed", "7"].map(str::to_owned).to_vec()
}

pub fn pairs(kv: &[(&str, &str)]) -> Vec<(String, String)> {
    kv.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

/// A running local cluster.
pub struct LocalCluster {
    pub name: String,
    pub exe: PathBuf,
    /// The environment every pod gets (its pod id added per pod).
    pub env: Vec<(String, String)>,
    pub settings: Settings,
    pub sim: SimProcess,
    pub pods: Vec<Pod>,
    pub postgres: crate::db::Db,
    pub nats: async_nats::Client,
    spawned: usize,
}

impl LocalCluster {
    /// Simulator, migrations and streams, then `spec.pods` pods, all ready.
    pub async fn start(exe: &Path, spec: ClusterSpec) -> Result<LocalCluster, ClusterError> {
        let name = unique_name(&spec.tag);
        let sim = SimProcess::spawn(exe, "99999010", &spec.sim_args).await?;
        let mut env = isolated_env(&name);
        env.push(("CABINE__CLUSTER__ISPB".into(), "99999010".into()));
        env.push(("CABINE__ICOM__CHANNELS__CPM__BASE_URL".into(), format!("http://{}", sim.primary)));
        env.push(("CABINE__ICOM__CHANNELS__CSM__BASE_URL".into(), format!("http://{}", sim.secondary)));
        env.push(("CABINE__DICT__BASE_URL".into(), format!("http://{}/api/v1/", sim.dict)));
        env.extend(spec.env);
        let map: HashMap<String, String> = env.iter().cloned().collect();
        let settings =
            Settings::from_sources(DEFAULT_TOML, None, &map).map_err(|e| ClusterError::Setup(e.to_string()))?;
        within("cabine migrate", STORE_BOUND, crate::run::migrate(settings.clone()))
            .await?
            .map_err(|e| ClusterError::Setup(format!("migrate: {e:#}")))?;
        let postgres = crate::db::pool(&settings.postgres).map_err(|e| ClusterError::Setup(e.to_string()))?;
        let nats = within("connecting to NATS", STORE_BOUND, crate::bus::connect_now(&settings.nats))
            .await?
            .map_err(|e| ClusterError::Setup(e.to_string()))?;
        let mut cluster = LocalCluster {
            name,
            exe: exe.to_owned(),
            env,
            settings,
            sim,
            pods: Vec::new(),
            postgres,
            nats,
            spawned: 0,
        };
        for _ in 0..spec.pods {
            cluster.spawn_pod().await?;
        }
        for pod in &cluster.pods {
            pod.wait_ready(Duration::from_secs(20)).await?;
        }
        Ok(cluster)
    }

    /// One more pod (pod id `{name}-p{n}`); not waited for.
    pub async fn spawn_pod(&mut self) -> Result<&Pod, ClusterError> {
        self.spawned += 1;
        let mut env = self.env.clone();
        env.push(("CABINE__CLUSTER__POD_ID".into(), format!("{}-p{}", self.name, self.spawned)));
        let pod = Pod::spawn(&self.exe, &env).await?;
        self.pods.push(pod);
        Ok(self.pods.last().expect("just pushed"))
    }

    /// `SELECT count(*) FROM inbox WHERE {filter}`.
    pub async fn inbox_count(&self, filter: &str) -> Result<i64, ClusterError> {
        let query = format!("SELECT count(*) FROM inbox WHERE {filter}");
        let rows = self.query(&query).await?;
        Ok(rows.first().map_or(0, |r| r.get(0)))
    }

    /// Every resource id in the inbox.
    pub async fn inbox_ids(&self) -> Result<Vec<String>, ClusterError> {
        Ok(self.query("SELECT resource_id FROM inbox").await?.iter().map(|r| r.get(0)).collect())
    }

    /// One statement on the cluster's schema, pool wait included, within [`STORE_BOUND`].
    pub async fn query(&self, sql: &str) -> Result<Vec<tokio_postgres::Row>, ClusterError> {
        within(sql, STORE_BOUND, async {
            let conn = self.postgres.get().await.map_err(|e| ClusterError::Setup(e.to_string()))?;
            conn.query(sql, &[]).await.map_err(|e| ClusterError::Setup(e.to_string()))
        })
        .await?
    }

    /// `GET {path}` on pod `i`'s operator listener, as JSON (within [`super::REQUEST_BOUND`]).
    pub async fn pod_json(&self, i: usize, path: &str) -> Result<Value, ClusterError> {
        let url = format!("http://{}{path}", self.pods[i].operator);
        let r = super::http_client().get(&url).send().await.map_err(|e| ClusterError::Setup(format!("{url}: {e}")))?;
        r.json().await.map_err(|e| ClusterError::Setup(format!("{url}: {e}")))
    }

    /// The bus subject filter of every inbound message of this cluster.
    pub fn inbound_filter(&self) -> String {
        crate::bus::Subjects::new(&self.settings.nats, &self.settings.cluster.ispb).inbound_all()
    }

    /// Kills the pods and the simulator, drops the schema, the streams and the
    /// Redis keys; each step bounded (a store that does not answer leaves its
    /// leftovers, named on stderr, rather than hang the test).
    pub async fn cleanup(mut self) {
        for pod in &mut self.pods {
            let _ = pod.child.start_kill();
            let _ = pod.child.wait().await;
        }
        let _ = self.sim.child.start_kill();
        let schema = &self.settings.postgres.schema;
        let drop = format!("DROP SCHEMA IF EXISTS {schema} CASCADE");
        let dropped = self.query(&drop).await;
        let js = async_nats::jetstream::new(self.nats.clone());
        let n = &self.settings.nats;
        let mut left = vec![dropped.err().map(|e| e.to_string())];
        for stream in [&n.inbound_stream, &n.outbound_stream, &n.results_stream] {
            left.push(
                within(&format!("deleting stream {stream}"), STORE_BOUND, js.delete_stream(stream))
                    .await
                    .err()
                    .map(|e| e.to_string()),
            );
        }
        let keys = async {
            let redis = crate::redis::connect(&self.settings.redis).map_err(|e| e.to_string())?;
            fred::interfaces::ClientLike::wait_for_connect(&redis).await.map_err(|e| e.to_string())?;
            super::delete_keys_under(&redis, &self.settings.redis.prefix).await.map(|_| ()).map_err(|e| e.to_string())
        };
        left.push(match within("deleting the Redis keys", STORE_BOUND, keys).await {
            Ok(r) => r.err(),
            Err(e) => Some(e.to_string()),
        });
        for why in left.into_iter().flatten() {
            eprintln!("cleanup of {}: {why}", self.name);
        }
    }
}
