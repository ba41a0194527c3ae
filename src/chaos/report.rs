//! The JSON line of one scenario and what makes it fail. The checks are the
//! invariants (DESIGN §2), judged from the server side and the stores:
//! `over_cap` (429s for streams or in-flight requests, or a peak above the
//! simulator's caps), `concurrent_reads`, `lost`, `stuck`, `duplicate_rows`,
//! `duplicates_at_sim`, `outbound_lost`, `outbound_unstored`; and the run
//! itself: `fault_errors` (a fault that could not be applied or recovered from
//! — e.g. a pod that ignored SIGTERM past its stop budget, a replacement that
//! never got ready) and `no_faults` (nothing was tested); with `--reconcile`,
//! `reconcile_gaps` (a window over the run not reconciled) and
//! `reconcile_discrepancies` (anything above INFO found).

use std::collections::BTreeMap;

use serde::Serialize;

use super::ChaosConfig;
use super::holder_series::HolderSeries;
use super::reconciled::ReconcileFigures;
use super::scenario::Scenario;
use super::verdict::Verdict;

/// What the run did besides the traffic's figures.
#[derive(Debug, Default)]
pub struct RunFacts {
    pub faults: usize,
    pub fault_errors: Vec<String>,
    pub settled: bool,
    pub settle_ms: u64,
    pub elapsed_s: f64,
    pub inject_errors: u64,
    pub publish_errors: u64,
    pub unpublished_at_stop: usize,
    /// The simulator's caps.
    pub max_in_flight_cap: u64,
    pub max_streams_cap: u64,
    /// The incident report's counts over the traffic.
    pub incidents: BTreeMap<String, i64>,
    /// With `--reconcile`: the windows over the run.
    pub reconciled: Option<ReconcileFigures>,
}

/// One judged scenario: ONE JSON line.
#[derive(Debug, Serialize)]
pub struct ChaosReport {
    /// With `--holders`: stream slots held per pod over the run (written to its own file).
    #[serde(skip)]
    pub holders: Option<HolderSeries>,
    pub scenario: &'static str,
    pub ok: bool,
    /// The names of the failed checks (empty when ok).
    pub failed: Vec<&'static str>,
    pub seed: u64,
    pub seconds: u64,
    pub pods: usize,
    pub rate: f64,
    pub outbound_rate: f64,
    pub faults: usize,
    pub fault_kinds: BTreeMap<&'static str, usize>,
    pub fault_errors: usize,
    pub fault_error_sample: Vec<String>,
    // Inbound, from the simulator's audit and ledger and the inbox.
    pub injected: u64,
    pub replies: u64,
    pub acknowledged: u64,
    pub persisted: usize,
    pub lost: usize,
    pub lost_sample: Vec<String>,
    pub stuck: u64,
    pub duplicate_rows: i64,
    pub unpublished: i64,
    pub redelivered: u64,
    pub expired_streams: u64,
    // The cap, from the simulator's audit.
    pub over_cap: u64,
    pub rejected_streams: u64,
    pub rejected_in_flight: u64,
    pub rejected_rate: u64,
    pub concurrent_reads: u64,
    pub max_reads_per_stream: u64,
    pub max_in_flight: u64,
    pub max_open_streams: u64,
    // Outbound, from the bus's PubAcks, the outbound table and the simulator's log.
    pub outbound_published: usize,
    pub outbound_stored: usize,
    pub outbound_unstored: usize,
    pub outbound_accepted_at_sim: usize,
    pub duplicates_at_sim: usize,
    pub refused_resends: usize,
    pub outbound_lost: usize,
    pub outbound_lost_sample: Vec<String>,
    pub outbound_by_status: BTreeMap<String, usize>,
    // The run.
    pub settled: bool,
    pub settle_ms: u64,
    pub inject_errors: u64,
    pub publish_errors: u64,
    /// Outbound bodies never PubAcked by the end of the traffic (not counted as published).
    pub outbound_unacked: usize,
    /// The incident report over the traffic: count per section.
    pub incidents: BTreeMap<String, i64>,
    /// With `--reconcile`: the Reconciler's windows over the run and what they found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reconcile: Option<ReconcileFigures>,
    pub elapsed_s: f64,
}

impl ChaosReport {
    pub fn new(scenario: Scenario, cfg: &ChaosConfig, facts: RunFacts, v: Verdict) -> ChaosReport {
        let failed = failures(&facts, &v);
        ChaosReport {
            holders: None,
            scenario: scenario.name(),
            ok: failed.is_empty(),
            failed,
            seed: cfg.seed,
            seconds: cfg.seconds.as_secs(),
            pods: cfg.pods,
            rate: cfg.rate,
            outbound_rate: cfg.outbound_rate,
            faults: facts.faults,
            fault_kinds: BTreeMap::from([(scenario.name(), facts.faults)]),
            fault_errors: facts.fault_errors.len(),
            fault_error_sample: facts.fault_errors.iter().take(3).cloned().collect(),
            injected: v.injected,
            replies: v.replies,
            acknowledged: v.acknowledged,
            persisted: v.persisted,
            lost: v.lost,
            lost_sample: v.lost_sample,
            stuck: v.stuck,
            duplicate_rows: v.duplicate_rows,
            unpublished: v.unpublished,
            redelivered: v.redelivered,
            expired_streams: v.expired_streams,
            over_cap: v.over_cap,
            rejected_streams: v.rejected_streams,
            rejected_in_flight: v.rejected_in_flight,
            rejected_rate: v.rejected_rate,
            concurrent_reads: v.concurrent_reads,
            max_reads_per_stream: v.max_reads_per_stream,
            max_in_flight: v.max_in_flight,
            max_open_streams: v.max_open_streams,
            outbound_published: v.outbound_published,
            outbound_stored: v.outbound_stored,
            outbound_unstored: v.outbound_unstored,
            outbound_accepted_at_sim: v.outbound_accepted_at_sim,
            duplicates_at_sim: v.duplicates_at_sim,
            refused_resends: v.refused_resends,
            outbound_lost: v.outbound_lost,
            outbound_lost_sample: v.outbound_lost_sample,
            outbound_by_status: v.outbound_by_status,
            settled: facts.settled,
            settle_ms: facts.settle_ms,
            inject_errors: facts.inject_errors,
            publish_errors: facts.publish_errors,
            outbound_unacked: facts.unpublished_at_stop,
            incidents: facts.incidents,
            reconcile: facts.reconciled,
            elapsed_s: (facts.elapsed_s * 10.0).round() / 10.0,
        }
    }
}

/// The failed checks, in a fixed order.
pub fn failures(f: &RunFacts, v: &Verdict) -> Vec<&'static str> {
    let over_cap = v.over_cap > 0 || v.max_in_flight > f.max_in_flight_cap || v.max_open_streams > f.max_streams_cap;
    [
        ("over_cap", over_cap),
        ("concurrent_reads", v.concurrent_reads > 0),
        ("lost", v.lost > 0),
        ("stuck", v.stuck > 0),
        ("duplicate_rows", v.duplicate_rows > 0),
        ("duplicates_at_sim", v.duplicates_at_sim > 0),
        ("outbound_lost", v.outbound_lost > 0),
        ("outbound_unstored", v.outbound_unstored > 0),
        ("fault_errors", !f.fault_errors.is_empty()),
        ("reconcile_gaps", f.reconciled.as_ref().is_some_and(|r| !r.covered)),
        ("reconcile_discrepancies", f.reconciled.as_ref().is_some_and(|r| r.unexplained > 0)),
        ("no_faults", f.faults == 0),
    ]
    .into_iter()
    .filter_map(|(name, failed)| failed.then_some(name))
    .collect()
}

/// A scenario that could not be judged: skipped (this machine cannot run it) or broken (the run itself failed).
#[derive(Debug, Serialize)]
pub struct Unjudged {
    pub scenario: &'static str,
    pub ok: bool,
    pub seed: u64,
    pub seconds: u64,
    pub pods: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> RunFacts {
        RunFacts { faults: 3, max_in_flight_cap: 6, max_streams_cap: 6, settled: true, ..Default::default() }
    }

    #[test]
    fn a_clean_run_passes_and_each_breach_names_its_check() {
        assert!(
            failures(&facts(), &Verdict { max_in_flight: 6, max_open_streams: 4, ..Default::default() }).is_empty()
        );
        let v = Verdict { max_in_flight: 7, lost: 2, stuck: 1, ..Default::default() };
        assert_eq!(failures(&facts(), &v), vec!["over_cap", "lost", "stuck"]);
        let v = Verdict { concurrent_reads: 1, outbound_lost: 1, ..Default::default() };
        assert_eq!(failures(&facts(), &v), vec!["concurrent_reads", "outbound_lost"]);
    }

    #[test]
    fn a_run_without_faults_or_with_broken_ones_fails() {
        let none = RunFacts { faults: 0, ..facts() };
        assert_eq!(failures(&none, &Verdict::default()), vec!["no_faults"]);
        let broken = RunFacts { fault_errors: vec!["pod p1 still running".into()], ..facts() };
        assert_eq!(failures(&broken, &Verdict::default()), vec!["fault_errors"]);
    }

    #[test]
    fn rate_limit_429s_alone_do_not_fail() {
        assert!(failures(&facts(), &Verdict { rejected_rate: 5, ..Default::default() }).is_empty());
    }
}
