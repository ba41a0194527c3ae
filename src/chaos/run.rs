//! One scenario from start to verdict: the world up, every stream slot held,
//! traffic on, the planned faults applied one after the other, the quiet end
//! of the run, traffic off, settling, the evidence read, the world torn down.

use std::path::Path;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::faults;
use super::holder_series::{HolderSeries, sample_until, short};
use super::holders::{self, HoldersError};
use super::plan::Plan;
use super::reconciled;
use super::report::{ChaosReport, RunFacts};
use super::scenario::Scenario;
use super::settle::settle;
use super::traffic::Traffic;
use super::verdict::{self, EvidenceError};
use super::world::{READY_WITHIN, World, WorldError};
use super::{ChaosConfig, RECONCILE_WINDOW};

/// How one scenario ended.
#[derive(Debug)]
pub enum Outcome {
    Judged(Box<ChaosReport>),
    /// This machine cannot run it (why).
    Skipped(String),
    /// The run itself broke before a verdict (why).
    Broken(String),
}

#[derive(Debug, thiserror::Error)]
enum DriveError {
    #[error("{0}")]
    Holders(#[from] HoldersError),
    #[error("evidence: {0}")]
    Evidence(#[from] EvidenceError),
}

/// Extra time without progress, beyond a takeover (lease + lock_delay) and a recovered
/// outbound claim, before what is left open counts as stuck.
const SETTLE_MARGIN: Duration = Duration::from_secs(10);

/// Runs `scenario` in a world of its own and judges it.
pub async fn run_scenario(exe: &Path, cfg: &ChaosConfig, scenario: Scenario) -> Outcome {
    let started = Instant::now();
    eprintln!("chaos {scenario}: starting {} pods, private redis{}", cfg.pods, extras(scenario));
    let mut world = match World::start(exe, cfg, scenario).await {
        Ok(w) => w,
        Err(WorldError::Unavailable(why)) => return Outcome::Skipped(why),
        Err(e) => return Outcome::Broken(e.to_string()),
    };
    let outcome = drive(&mut world, cfg, scenario, started).await;
    world.cleanup().await;
    match outcome {
        Ok(report) => Outcome::Judged(Box::new(report)),
        Err(e) => Outcome::Broken(e.to_string()),
    }
}

fn extras(scenario: Scenario) -> &'static str {
    match (scenario.needs_private_postgres(), scenario.needs_private_nats()) {
        (true, _) => ", private postgres",
        (_, true) => ", private nats",
        _ => "",
    }
}

async fn drive(
    world: &mut World,
    cfg: &ChaosConfig,
    scenario: Scenario,
    t0: Instant,
) -> Result<ChaosReport, DriveError> {
    holders::wait_all_held(&world.cluster, READY_WITHIN).await?;
    let plan = Plan::new(scenario, cfg.seed, cfg.seconds, world.timing);
    eprintln!(
        "chaos {scenario}: all slots held after {:.1}s; {} faults planned over {}s, quiet from {:.1}s",
        t0.elapsed().as_secs_f64(),
        plan.faults.len(),
        cfg.seconds.as_secs(),
        plan.quiet_from.as_secs_f64()
    );
    let traffic = Traffic::start(&world.cluster, cfg.rate, cfg.outbound_rate);
    let (started, wall_start) = (Instant::now(), SystemTime::now());
    let mut facts =
        RunFacts { max_in_flight_cap: world.max_in_flight, max_streams_cap: world.max_streams, ..Default::default() };
    let slots = world.cluster.settings.pools.stream.get();
    let mut series = cfg.holders.then(|| HolderSeries::new(scenario.name(), slots));
    apply_plan(world, &plan, started, &mut facts, series.as_mut()).await;
    sample_until(&world.cluster, series.as_mut(), started, started + cfg.seconds).await;
    let (inbound, outbound) = traffic.stop().await;
    let wall_stop = SystemTime::now();
    let stall = world.timing.takeover() + world.cluster.settings.timing.processing_timeout + SETTLE_MARGIN;
    let settled = settle(&world.cluster, &outbound.published, stall).await;
    eprintln!("chaos {scenario}: traffic stopped; settled={} after {} ms", settled.done, settled.took.as_millis());
    let evidence = verdict::gather(&world.cluster, outbound.published).await?;
    facts.settled = settled.done;
    facts.settle_ms = settled.took.as_millis() as u64;
    facts.inject_errors = inbound.errors;
    facts.publish_errors = outbound.errors;
    facts.unpublished_at_stop = outbound.unpublished;
    facts.incidents = reconciled::incidents(&world.cluster, (wall_start, SystemTime::now())).await;
    if cfg.reconcile {
        // The window covering the end closes a window and a margin later; its statement comes on top.
        let within = RECONCILE_WINDOW * 3 + Duration::from_secs(30);
        facts.reconciled = Some(reconciled::windows(&world.cluster, (wall_start, wall_stop), within).await);
    }
    facts.elapsed_s = t0.elapsed().as_secs_f64();
    let mut report = ChaosReport::new(scenario, cfg, facts, verdict::judge(&evidence));
    report.holders = series;
    Ok(report)
}

/// Each planned fault at its time (or at once when the previous one ran late), one after the
/// other; the holders sampled meanwhile when `series` is asked for.
async fn apply_plan(
    world: &mut World,
    plan: &Plan,
    started: Instant,
    facts: &mut RunFacts,
    mut series: Option<&mut HolderSeries>,
) {
    let scenario = plan.scenario;
    for fault in &plan.faults {
        sample_until(&world.cluster, series.as_deref_mut(), started, started + fault.at).await;
        let at = started.elapsed().as_secs_f64();
        match faults::apply(world, scenario, fault).await {
            Ok(a) => {
                facts.faults += 1;
                if let Some(s) = series.as_deref_mut() {
                    s.fault(at, &a.target);
                }
                eprintln!("chaos {scenario}: t={at:.1}s {} slots {:?}: {}", short(&a.target), a.slots, a.note);
            }
            Err(e) => {
                eprintln!("chaos {scenario}: t={at:.1}s FAULT ERROR: {e}");
                facts.fault_errors.push(e.to_string());
            }
        }
    }
}
