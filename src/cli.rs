//! The command line (clap): `run`, `migrate`, `check-config`, `health`, and the
//! subcommands later capabilities add (`sim`, `bench …`, `chaos`, the
//! operator's `outbound …` and `breaker reset`).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

const LONG_VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("CABINE_GIT_COMMIT"), ")");

#[derive(Debug, Parser)]
#[command(name = "cabine", version = LONG_VERSION, about = "PIX ICOM connectivity under the Central Bank's connection cap")]
pub struct Cli {
    /// Directory holding `{CABINE_ENV}.toml` overlays (the defaults are compiled in).
    #[arg(long, env = "CABINE_CONFIG_DIR", default_value = "config", global = true)]
    pub config_dir: PathBuf,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one pod: status server, coordination and the actor tree, until SIGTERM / Ctrl-C.
    Run,
    /// Apply the Postgres migrations and create the JetStream streams, then exit.
    Migrate,
    /// Print the effective configuration (secrets redacted); exit 64 if it is unusable.
    CheckConfig,
    /// Run the ICOM simulator (the Central Bank) until SIGTERM / Ctrl-C.
    Sim(Box<crate::sim::SimArgs>),
    /// The outbound side of a running pod, through its HTTP endpoints (JSON answer; exit 1 unless 2xx).
    Outbound(crate::outbound_cli::OutboundArgs),
    /// DICT key lookups through a pod (`dict get KEY --payer-id ID`): JSON answer; exit 1 unless 2xx.
    Dict(crate::outbound_cli::DictArgs),
    /// The circuit breakers shared by the pods, through a pod's HTTP endpoint.
    Breaker(crate::outbound_cli::BreakerArgs),
    /// Reconciliations against the Central Bank's statement: run one now (`--from --to`), list, show.
    Reconcile(crate::outbound_cli::ReconcileArgs),
    /// Reports of a running pod: `report incident --from --to` (what a window's faults touched).
    Report(crate::outbound_cli::ReportArgs),
    /// The pod's own probe (`/health/live`, `--ready`: `/health/ready`) on `http.bind`: exit 0 on 200, 1 otherwise.
    Health(crate::health_cli::HealthArgs),
    /// The cluster at a glance from one pod: slot map, pods, alerts, actors not well (`--watch`, `--json`).
    Status(crate::status_cli::StatusArgs),
    /// Faults under traffic (simulator, private Redis, P pods), judged from the server side and the stores:
    /// one JSON line per scenario; exit 1 on a failed verdict.
    Chaos(ChaosArgs),
    /// Benchmarks: each prints ONE JSON line on stdout.
    Bench {
        #[command(subcommand)]
        bench: BenchCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Leased slots of one pool of 6 under contention, judged by a server counting concurrent requests.
    Lease(LeaseBenchArgs),
    /// End to end: simulator + P child pods; M messages as fast as possible, then M at R/s.
    Inbound(InboundBenchArgs),
    /// Outbound end to end: simulator + P child pods; M pacs.008 published as fast as possible, then M at R/s.
    Outbound(OutboundBenchArgs),
    /// DICT lookups through P pods against the simulated DICT: the homologation capacity test
    /// (`--full`: 20,000 distinct keys in 10 minutes; default a 1-minute, 2,000-key run).
    Dict(crate::bench::dict::DictBenchArgs),
    /// The Markdown report (with SVG plots) of the runs in DIR (`benches.jsonl`, `*-series.json`): `ops/bench` writes them.
    Report {
        #[arg(long)]
        dir: std::path::PathBuf,
    },
    /// One worker process of `bench lease` (started by it).
    #[command(hide = true)]
    LeaseWorker(LeaseWorkerArgs),
    /// The ICOM simulator's read and send throughput through the real client (in-process, loopback).
    Sim(SimBenchArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct ChaosArgs {
    /// kill, pause, term, redis-restart, redis-evict, redis-rollback, pg-restart, nats-restart, or all (each in turn).
    #[arg(long)]
    pub scenario: crate::chaos::Choice,
    /// Seed of the fault plan (times, lengths, victims) and of the simulator's messages.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Length of the traffic and faults per scenario (settling comes on top).
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// `cabine run` child processes (4: one per stream slot, and all of them competing for the 2 send slots).
    #[arg(long, default_value_t = 4)]
    pub pods: usize,
    /// Inbound messages injected per second.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// Outbound pacs.008 published per second on the bus.
    #[arg(long, default_value_t = 50.0)]
    pub outbound_rate: f64,
    /// No outbound traffic (and the pods' outbound side off).
    #[arg(long)]
    pub no_outbound: bool,
    /// Latency the simulator adds to every ICOM request, ms (plus up to half as much jitter).
    #[arg(long, default_value_t = 50)]
    pub latency_ms: u64,
    /// How long the simulator holds an empty GET, ms (below the pods' 1 s long-poll timeout): the
    /// window in which an abandoned GET still holds at the server and can be handed a batch.
    #[arg(long, default_value_t = 700)]
    pub hold_ms: u64,
    /// Log filter of the pods (their logs go to stderr).
    #[arg(long, default_value = "error")]
    pub pod_log: String,
    /// Extra configuration for every pod, e.g. `CABINE__POOLS__STREAM=4` (repeatable).
    #[arg(long, value_name = "KEY=VALUE")]
    pub pod_env: Vec<String>,
    /// Reconcile while it runs (windows of 10 s against the simulator's settlement record) and
    /// fail the run unless every window over it is reconciled without a discrepancy above INFO.
    #[arg(long)]
    pub reconcile: bool,
    /// Also write the stream slots held per pod over the run (sampled every 250 ms from `/cluster`,
    /// the faults marked) to this file, for `bench report` (`*-holders.json`). One scenario only.
    #[arg(long, value_name = "FILE")]
    pub holders: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct SimBenchArgs {
    /// Messages per phase (read 1 stream, read 6 streams, send 1 client, send 6 clients).
    #[arg(long, default_value_t = 100_000)]
    pub messages: usize,
}

#[derive(Debug, Clone, clap::Args)]
pub struct LeaseBenchArgs {
    /// Worker processes.
    #[arg(long, default_value_t = 3)]
    pub processes: u32,
    /// Tasks per process, each looping acquire, requests while the lease is valid, release.
    #[arg(long, default_value_t = 20)]
    pub tasks: u32,
    /// Length of the run.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// SIGSTOP one worker for 2 x lease, then SIGCONT, over and over.
    #[arg(long)]
    pub pause_holder: bool,
    /// Run against a private redis-server and restart it (every key gone) during the run.
    #[arg(long)]
    pub restart_redis: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct InboundBenchArgs {
    /// `cabine run` child processes.
    #[arg(long, default_value_t = 3)]
    pub pods: usize,
    /// Messages per run (the fast run, then the fixed-rate run).
    #[arg(long, default_value_t = 20_000)]
    pub messages: usize,
    /// Injection rate of the fixed-rate run, messages per second.
    #[arg(long, default_value_t = 1_000.0)]
    pub rate: f64,
    /// Also write the run's time series (messages per second over time, latency CDF) to this file.
    #[arg(long)]
    pub series: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct OutboundBenchArgs {
    /// `cabine run` child processes.
    #[arg(long, default_value_t = 3)]
    pub pods: usize,
    /// Messages per run (the fast run, then the fixed-rate run).
    #[arg(long, default_value_t = 10_000)]
    pub messages: usize,
    /// Publication rate of the fixed-rate run, messages per second.
    #[arg(long, default_value_t = 500.0)]
    pub rate: f64,
    /// Also write the run's time series (messages per second over time, latency CDF) to this file.
    #[arg(long)]
    pub series: Option<std::path::PathBuf>,
}

/// What one worker process of `bench lease` runs (the parent passes all of it).
#[derive(Debug, Clone, clap::Args)]
pub struct LeaseWorkerArgs {
    #[arg(long)]
    pub redis_url: String,
    /// Redis key prefix of this run.
    #[arg(long)]
    pub prefix: String,
    /// The judge server's address.
    #[arg(long)]
    pub judge: SocketAddr,
    #[arg(long)]
    pub tasks: u32,
    #[arg(long)]
    pub run_ms: u64,
    /// Slots in the pool.
    #[arg(long)]
    pub cap: u8,
    #[arg(long)]
    pub lease_ms: u64,
    #[arg(long)]
    pub lock_delay_ms: u64,
    #[arg(long)]
    pub drift_ms: u64,
    /// Client-side bound of one judged request; a request starts only if the lease outlives it.
    #[arg(long)]
    pub request_timeout_ms: u64,
}
