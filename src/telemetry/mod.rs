//! Telemetry: the tracing subscriber (human or JSON lines, credentials masked)
//! and the process-wide Prometheus recorder that `/metrics` renders, every
//! metric with its HELP text.

mod help;
mod masked;

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, LogSettings};

/// Installs the global tracing subscriber. `RUST_LOG` wins over `log.filter`.
/// Calling it twice is harmless (the second call keeps the first subscriber).
pub fn init_tracing(log: &LogSettings) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&log.filter))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(|| masked::MaskedStderr);
    let _ = match log.format {
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).try_init(),
        LogFormat::Human => builder.try_init(),
    };
}

/// Finer below 10 ms than the default buckets: the per-cycle overhead goals
/// (p50 ≤ 2 ms, p99 ≤ 10 ms) must be readable off them.
const OVERHEAD_BUCKETS: [f64; 14] =
    [0.00025, 0.0005, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 1.0];

/// The process-wide Prometheus recorder, installed on first use. Tests that run
/// several servers in one process share it.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets(&[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0])
                .expect("static non-empty bucket list")
                .set_buckets_for_metric(Matcher::Full("cabine_slot_cycle_overhead_seconds".into()), &OVERHEAD_BUCKETS)
                .expect("static non-empty bucket list")
                .build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed by an embedding test; then ours only renders.
            let _ = metrics::set_global_recorder(recorder);
            describe_build_info();
            cabine_actors::metrics::describe();
            help::describe();
            handle
        })
        .clone()
}

/// Keeps histogram buckets bounded; runs for the life of the process.
pub fn spawn_metrics_upkeep(handle: PrometheusHandle) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            handle.run_upkeep();
        }
    })
}

fn describe_build_info() {
    metrics::describe_gauge!("cabine_build_info", "Always 1; labels carry the version and git commit.");
    metrics::gauge!("cabine_build_info", "version" => crate::VERSION, "commit" => crate::GIT_COMMIT).set(1.0);
}
