//! `cabine chaos`: the invariants (DESIGN §2) under faults, judged from the
//! server side. Each scenario gets a world of its own — the ICOM simulator (50 ms
//! latency on every request), a private redis-server, P `cabine run` pods (4; own
//! Postgres schema, Redis prefix, NATS subjects and streams; short test timings:
//! lease 2 s, lock_delay 1 s, heartbeat 500 ms, simulator hold 200 ms), a private
//! Postgres or NATS when the scenario restarts one — and a trickle of traffic
//! (inbound injected into the simulator, ~100/s; outbound pacs.008 published on
//! the bus like the bank's core, ~50/s). A seeded plan applies one kind of fault
//! at roughly regular intervals and leaves the last quarter of the run (5–15 s)
//! fault-free; then the traffic stops, the cluster settles (as long as anything
//! moves, bounded), and the verdict is read.
//!
//! Decisions:
//! - One world per scenario, so that a verdict belongs to one kind of fault and
//!   `all` is just each scenario in turn: ONE JSON line per scenario on stdout,
//!   progress on stderr. Exit 0 when every line is ok, 1 when any verdict failed
//!   or a run broke, 2 when nothing failed but a scenario was skipped (this
//!   machine cannot start its private server).
//! - Pod faults aim at a pod holding stream slots at that moment (`GET /cluster`
//!   of the first pod that answers); the seed picks which, by pod id. A killed or
//!   terminated pod is replaced by a new pod (new pod id), as a Deployment would.
//! - The verdict reads the simulator (audit, ledger of acknowledged ResourceIds,
//!   log of received messages) and the stores (`inbox`, `outbound`), never the
//!   pods' own status. `over_cap` counts only the 429s the caps cause (streams,
//!   in-flight requests): a token-bucket 429 is the rate limit doing its job,
//!   reported as `rejected_rate`. A refused resend (admi.002 AM05 after a crash
//!   between the SPI's 201 and the pod's commit) is not a duplicate payment:
//!   `duplicates_at_sim` counts MsgIds the SPI ACCEPTED more than once.
//! - The audit is read as JSON with every field defaulted: `concurrent_reads`
//!   and `max_reads_per_stream` read 0 from a simulator that does not report them.
//! - NATS restarts are graceful (SIGTERM: JetStream flushes its store). A SIGKILL
//!   would test JetStream's own loss window (DESIGN §5), which Postgres covers
//!   for inbound and which no client can cover for a publication already acked.
//! - Postgres restarts are crashes (`pg_ctl stop -m immediate`), with `fsync=off`:
//!   no machine crash is simulated, so the kernel keeps every write.
//! - The defaults make overlap possible without overloading anything: 4 pods for
//!   4 stream slots, all of them competing for the 2 send slots (pools fill the
//!   simulator's 6), and a request latency that keeps requests in flight long
//!   enough for a second holder to meet them. `stuck` means nothing moved for
//!   lease + lock_delay + processing_timeout + 10 s, not "a backlog was draining".
//! - `--reconcile`: the pods reconcile windows of 10 s (settle margin 10 s) while
//!   the faults go on; after the verdict the run waits for the window covering
//!   its end, and fails unless the windows over it follow one another and found
//!   nothing above INFO (a send the statement settled is INFO). Every run reports
//!   the incident report's counts for its traffic (`incidents`).

mod faults;
mod holder_series;
mod holders;
mod plan;
mod reconciled;
mod report;
mod run;
mod scenario;
mod settle;
mod traffic;
mod verdict;
mod world;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};

pub use holder_series::HolderSeries;
pub use plan::{Plan, PlannedFault};
pub use reconciled::ReconcileFigures;
pub use report::{ChaosReport, Unjudged};
pub use run::{Outcome, run_scenario};
pub use scenario::{Choice, Scenario, Timing};
pub use verdict::{LaneFigures, Verdict};

use crate::cli::ChaosArgs;

/// Exit code when nothing failed but some scenario could not run here.
pub const EXIT_SKIPPED: u8 = 2;

/// What one run is made of (the command line, validated).
#[derive(Clone, Debug)]
pub struct ChaosConfig {
    pub seed: u64,
    /// Traffic and faults; settling comes on top.
    pub seconds: Duration,
    pub pods: usize,
    /// Inbound messages injected per second.
    pub rate: f64,
    /// Outbound pacs.008 published per second; 0: none (and the pods' outbound side off).
    pub outbound_rate: f64,
    /// Latency the simulator adds to every ICOM request (plus up to half as much jitter): the
    /// RSFN is not loopback, and a request that takes time is a request that can overlap.
    pub latency_ms: u64,
    /// How long the simulator holds an empty GET (the pods are told, `icom.server_hold`): an
    /// abandoned GET lives on at the server that long, able to be handed a batch.
    pub hold: Duration,
    /// The pods' log filter (their logs go to stderr).
    pub pod_log: String,
    /// Extra `CABINE__…` overrides for every pod (and the run's own view of the settings).
    pub env: Vec<(String, String)>,
    /// The pods reconcile windows of [`RECONCILE_WINDOW`] while the run goes on, judged after it.
    pub reconcile: bool,
    /// Sample the stream slots held per pod over the run (`ChaosReport::holders`).
    pub holders: bool,
}

/// Window and settle margin of `--reconcile`.
pub const RECONCILE_WINDOW: Duration = Duration::from_secs(10);

impl Default for ChaosConfig {
    fn default() -> Self {
        ChaosConfig {
            seed: 1,
            seconds: Duration::from_secs(60),
            pods: 4,
            rate: 100.0,
            outbound_rate: 50.0,
            latency_ms: 50,
            hold: Duration::from_millis(700),
            pod_log: "error".into(),
            env: Vec::new(),
            reconcile: false,
            holders: false,
        }
    }
}

impl ChaosConfig {
    pub fn from_args(a: &ChaosArgs) -> anyhow::Result<ChaosConfig> {
        if !(1..=8).contains(&a.pods) {
            bail!("--pods must be within 1..=8");
        }
        if a.seconds < 5 {
            bail!("--seconds must be at least 5");
        }
        if a.hold_ms + a.latency_ms * 3 / 2 >= 1000 {
            bail!("--hold-ms + 1.5 × --latency-ms must stay below the pods' 1 s long-poll timeout");
        }
        let outbound_rate = if a.no_outbound { 0.0 } else { a.outbound_rate };
        if a.reconcile && outbound_rate == 0.0 {
            bail!("--reconcile sends its statement requests through the outbound side: not with --no-outbound");
        }
        if !(a.rate.is_finite() && a.rate > 0.0 && outbound_rate.is_finite() && outbound_rate >= 0.0) {
            bail!("--rate must be > 0 and --outbound-rate >= 0");
        }
        if a.holders.is_some() && a.scenario.scenarios().len() != 1 {
            bail!("--holders writes one scenario's series: name one scenario");
        }
        let env = a
            .pod_env
            .iter()
            .map(|kv| kv.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
            .collect::<Option<Vec<_>>>()
            .context("--pod-env takes KEY=VALUE")?;
        Ok(ChaosConfig {
            seed: a.seed,
            seconds: Duration::from_secs(a.seconds),
            pods: a.pods,
            rate: a.rate,
            outbound_rate,
            latency_ms: a.latency_ms,
            hold: Duration::from_millis(a.hold_ms),
            pod_log: a.pod_log.clone(),
            env,
            reconcile: a.reconcile,
            holders: a.holders.is_some(),
        })
    }
}

/// `cabine chaos`: every chosen scenario in turn, one JSON line each.
pub async fn run(args: ChaosArgs) -> anyhow::Result<ExitCode> {
    let cfg = ChaosConfig::from_args(&args)?;
    let exe = std::env::current_exe().context("locating the cabine binary")?;
    crate::install_crypto_provider();
    let (mut failed, mut skipped) = (false, false);
    for scenario in args.scenario.scenarios() {
        let line = match run_scenario(&exe, &cfg, scenario).await {
            Outcome::Judged(report) => {
                failed |= !report.ok;
                if let (Some(path), Some(series)) = (&args.holders, &report.holders) {
                    std::fs::write(path, serde_json::to_vec(series)?)
                        .with_context(|| format!("writing {}", path.display()))?;
                }
                serde_json::to_string(&report)?
            }
            Outcome::Skipped(why) => {
                eprintln!("chaos {scenario}: SKIPPED: {why}");
                skipped = true;
                serde_json::to_string(&unjudged(scenario, &cfg, Some(why), None))?
            }
            Outcome::Broken(why) => {
                eprintln!("chaos {scenario}: BROKEN: {why}");
                failed = true;
                serde_json::to_string(&unjudged(scenario, &cfg, None, Some(why)))?
            }
        };
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}")?;
        out.flush()?;
    }
    Ok(match (failed, skipped) {
        (true, _) => ExitCode::FAILURE,
        (false, true) => ExitCode::from(EXIT_SKIPPED),
        (false, false) => ExitCode::SUCCESS,
    })
}

fn unjudged(scenario: Scenario, cfg: &ChaosConfig, skipped: Option<String>, error: Option<String>) -> Unjudged {
    Unjudged {
        scenario: scenario.name(),
        ok: false,
        seed: cfg.seed,
        seconds: cfg.seconds.as_secs(),
        pods: cfg.pods,
        skipped,
        error,
    }
}
