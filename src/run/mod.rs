//! `cabine run` and `cabine migrate`: connect the dependencies, build the
//! adapters and start the supervision tree, serve status and the operator
//! endpoints, and stop as [`stop`] describes.

mod adapters;
pub mod stop;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use backon::{ExponentialBuilder, Retryable};
use cabine_actors::Tree;
use tokio::sync::watch;

pub use adapters::{Adapters, OutboundAdapters};
pub use stop::shutdown_signal;

use crate::config::Settings;
use crate::readiness::{DependencyProbe, Readiness};
use crate::{bus, db, http, readiness, redis, telemetry};

/// Bound on one statement of an operator's report (a window of up to 7 days).
const REPORT_QUERY_TIMEOUT: Duration = Duration::from_secs(60);

/// The connected (or connecting) dependencies of one pod.
pub struct Dependencies {
    pub redis: fred::clients::Client,
    pub postgres: db::Db,
    pub nats: async_nats::Client,
}

impl Dependencies {
    /// Builds every client without waiting for its server: unreachable services
    /// make the pod not-ready, they do not stop it.
    pub async fn connect(settings: &Settings) -> anyhow::Result<Self> {
        let redis = redis::connect(&settings.redis).context("redis client")?;
        let postgres = db::pool(&settings.postgres).context("postgres pool")?;
        let nats = bus::connect(&settings.nats).await.context("nats client")?;
        Ok(Dependencies { redis, postgres, nats })
    }
}

/// `cabine migrate`: Postgres migrations, then the JetStream streams.
pub async fn migrate(settings: Settings) -> anyhow::Result<()> {
    let pool = db::pool(&settings.postgres)?;
    let version = db::migrate(&pool, &settings.postgres.schema).await.context("postgres migrations")?;
    tracing::info!(schema = %settings.postgres.schema, ?version, "postgres migrations applied");
    let nats = connect_nats_now(&settings).await?;
    create_streams(&settings, &nats).await?;
    Ok(())
}

/// The deployment's JetStream streams, created or updated (idempotent).
async fn create_streams(settings: &Settings, nats: &async_nats::Client) -> anyhow::Result<()> {
    let subjects = bus::Subjects::new(&settings.nats, &settings.cluster.ispb);
    let channels: Vec<&str> = settings.enabled_channels().map(|(id, _)| id.as_str()).collect();
    bus::ensure_streams(nats, &settings.nats, &subjects, &channels).await.context("jetstream streams")?;
    tracing::info!(streams = ?bus::stream_names(settings), "jetstream streams ready");
    Ok(())
}

/// `postgres.migrate_on_start`, the streams' half: created in the background,
/// retried with backoff while NATS is unreachable (readiness names them missing meanwhile).
fn spawn_stream_creation(settings: Arc<Settings>, nats: async_nats::Client) {
    tokio::spawn(async move {
        let attempt = || async { create_streams(&settings, &nats).await };
        let backoff = ExponentialBuilder::default()
            .with_jitter()
            .with_max_delay(std::time::Duration::from_secs(5))
            .without_max_times();
        let _ = attempt
            .retry(backoff)
            .notify(|e, after| tracing::warn!(error = format!("{e:#}"), ?after, "streams not created yet; retrying"))
            .await;
    });
}

async fn connect_nats_now(settings: &Settings) -> anyhow::Result<async_nats::Client> {
    let url = crate::config::mask_credentials(&settings.nats.url);
    bus::connect_now(&settings.nats).await.with_context(|| format!("connecting to NATS at {url}"))
}

/// `cabine run`: one pod, until a signal (exit 0 after a clean drain) or until
/// its tree gives up (exit 70).
pub async fn run(settings: Settings) -> anyhow::Result<ExitCode> {
    let settings = Arc::new(settings);
    let pod_id = settings.pod_id();
    let metrics = telemetry::metrics_handle();
    telemetry::spawn_metrics_upkeep(metrics.clone());
    let deps = Dependencies::connect(&settings).await?;
    if let Err(refusal) = check_eviction_policy(&settings, &deps.redis).await {
        eprintln!("{}", crate::config::mask_credentials(&refusal));
        return Ok(ExitCode::from(crate::EXIT_CONFIG));
    }
    if settings.postgres.migrate_on_start {
        migrate_with_retry(&deps.postgres, &settings.postgres.schema).await;
        spawn_stream_creation(settings.clone(), deps.nats.clone());
    }
    let readiness = Readiness::default();
    let probe =
        DependencyProbe::new(deps.redis.clone(), deps.postgres.clone(), deps.nats.clone(), settings.http.probe_timeout)
            .with_streams(bus::stream_names(&settings));
    readiness::spawn_probe_loop(probe, readiness.clone(), settings.http.probe_interval);

    let adapters = match Adapters::build(&settings, &deps, &pod_id) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{}", crate::config::mask_credentials(&e.to_string()));
            return Ok(ExitCode::from(crate::EXIT_CONFIG));
        }
    };
    let dict = match crate::dict::from_settings(&settings, deps.redis.clone()) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("{}", crate::config::mask_credentials(&e.to_string()));
            return Ok(ExitCode::from(crate::EXIT_CONFIG));
        }
    };
    let ports = adapters.ports(dict.clone());
    let tree = Tree::start(settings.tree_config(&pod_id), ports).await.context("starting the actor tree")?;
    let tree = Arc::new(tree);
    let hints = adapters.outbound.is_some().then(|| {
        let subject = crate::bus::Subjects::new(&settings.nats, &settings.cluster.ispb).work_hints();
        crate::outbound::hints::relay(deps.nats.clone(), subject, tree.outbound_signal())
    });
    let operator = http::Operator {
        tree: tree.clone(),
        cluster: Arc::new(adapters.cluster_source(&settings)),
        outbound: adapters.outbound.as_ref().map(|o| o.operator(&settings, &deps)),
        reconciler: adapters.reconciler.clone(),
        incidents: Arc::new(crate::incident::IncidentReports {
            db: deps.postgres.clone(),
            ispb: settings.cluster.ispb.to_string(),
            timeout: settings.postgres.wait_timeout + settings.postgres.query_timeout,
        }),
        timings: Arc::new(crate::timings::TimingReports {
            db: deps.postgres.clone(),
            ispb: settings.cluster.ispb.to_string(),
            // A report reads a whole window: the query timeout of the hot path is too short for it.
            timeout: settings.postgres.wait_timeout + REPORT_QUERY_TIMEOUT,
        }),
        dict,
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let access = http::Access::from_settings(&settings.http);
    let state = http::AppState { readiness: readiness.clone(), metrics, access, operator: Some(operator) };
    let listeners = Listeners::open(&settings.http, state, &stop_rx).await?;
    // First stdout line: where this pod listens (scripts and tests read it).
    println!(
        "{}",
        serde_json::json!({
            "event": "listening", "http": listeners.http.to_string(), "operator": listeners.operator.to_string(),
            "pod_id": pod_id,
        })
    );
    tracing::info!(
        addr = %listeners.http, operator = %listeners.operator, %pod_id, version = crate::VERSION,
        commit = crate::GIT_COMMIT, "cabine pod started"
    );

    let cause = stop::wait_for_stop(&tree).await;
    let code = stop::stop(cause, &tree, &adapters.publisher, &readiness, settings.timing.stop_timeout).await;
    let _ = stop_tx.send(true);
    if let Some(relay) = &hints {
        relay.abort();
    }
    listeners.closed(std::time::Duration::from_millis(500)).await;
    Ok(code)
}

type Server = tokio::task::JoinHandle<std::io::Result<()>>;

/// The pod's HTTP listeners: `http.bind`, and `http.operator_bind` when set.
struct Listeners {
    http: std::net::SocketAddr,
    /// Where the operator endpoints answer (`http` when they share it).
    operator: std::net::SocketAddr,
    servers: Vec<Server>,
}

impl Listeners {
    async fn open(
        http: &crate::config::HttpSettings,
        state: http::AppState,
        stop: &watch::Receiver<bool>,
    ) -> anyhow::Result<Listeners> {
        let Some(operator_bind) = http.operator_bind else {
            let (addr, server) =
                http::serve(http.bind, state, wait_for(stop.clone())).await.context("binding http.bind")?;
            return Ok(Listeners { http: addr, operator: addr, servers: vec![server] });
        };
        let public = http::routes(state.clone(), http::Routes::Public);
        let (addr, server) =
            http::serve_routes(http.bind, public, wait_for(stop.clone())).await.context("binding http.bind")?;
        let operator = http::routes(state, http::Routes::Operator);
        let (operator, operator_server) = http::serve_routes(operator_bind, operator, wait_for(stop.clone()))
            .await
            .context("binding http.operator_bind")?;
        Ok(Listeners { http: addr, operator, servers: vec![server, operator_server] })
    }

    /// Waits up to `within` for the servers to finish their graceful shutdown.
    async fn closed(self, within: std::time::Duration) {
        let _ = tokio::time::timeout(within, futures::future::join_all(self.servers)).await;
    }
}

/// Refuses a Redis whose eviction policy can evict the lease epoch (`allkeys-*`);
/// warns on `volatile-*` and when the policy cannot be read.
async fn check_eviction_policy(settings: &Settings, client: &fred::clients::Client) -> Result<(), String> {
    use crate::redis::policy::{self, PolicyVerdict};
    match policy::read(client, settings.redis.connect_timeout).await {
        PolicyVerdict::Safe => Ok(()),
        PolicyVerdict::EvictsLeases(p) => {
            tracing::warn!(
                policy = %p,
                "redis maxmemory-policy may evict lease keys: detected as partial amnesia (quarantine); noeviction is best"
            );
            Ok(())
        }
        PolicyVerdict::EvictsEverything(p) => Err(format!(
            "redis.url: the server's maxmemory-policy is {p}: it can evict the lease epoch and hide Redis amnesia; \
             set maxmemory-policy noeviction (or volatile-*)"
        )),
        PolicyVerdict::Unknown(why) => {
            tracing::warn!(%why, "redis maxmemory-policy not checked: make sure it is noeviction (or volatile-*)");
            Ok(())
        }
    }
}

/// Applies migrations at start, retrying with backoff while Postgres is unreachable.
async fn migrate_with_retry(pool: &deadpool_postgres::Pool, schema: &str) {
    let attempt = || async { db::migrate(pool, schema).await };
    let outcome = attempt
        .retry(
            ExponentialBuilder::default()
                .with_jitter()
                .with_max_delay(std::time::Duration::from_secs(5))
                .without_max_times(),
        )
        .notify(|e, after| tracing::warn!(error = %e, ?after, "migrations not applied yet; retrying"))
        .await;
    if let Ok(version) = outcome {
        tracing::info!(?version, "migrations applied at start");
    }
}

async fn wait_for(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
