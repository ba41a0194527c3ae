//! `cabine bench outbound` end to end on a few hundred messages (figures are
//! not judged here — benchmarks print, tests check): both runs settle and the
//! report agrees with itself and with the simulator's audit.

use std::path::PathBuf;

use cabine::bench::outbound::run;
use cabine::cli::OutboundBenchArgs;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn both_runs_settle_and_the_report_is_consistent() {
    let args = OutboundBenchArgs { pods: 2, messages: 200, rate: 100.0 };
    let r = run(&args, &PathBuf::from(env!("CARGO_BIN_EXE_cabine"))).await.expect("the bench runs");
    eprintln!("{r:?}");
    assert_eq!((r.pods, r.messages, r.published), (2, 200, 400), "{r:?}");
    assert_eq!((r.accepted, r.sent, r.confirmed, r.lost), (400, 400, 400, 0), "{r:?}");
    assert_eq!((r.dead, r.timeout, r.duplicates_at_sim, r.sim_429), (0, 0, 0, 0), "{r:?}");
    assert!(r.msgs_per_s > 0.0 && r.msgs_per_s.is_finite(), "{r:?}");
    assert!(r.sim_max_in_flight >= 1, "{r:?}");
    assert!(0.0 < r.lat_sent_p50_ms && r.lat_sent_p50_ms <= r.lat_sent_p99_ms, "{r:?}");
    assert!(r.lat_sent_p99_ms <= r.lat_sent_max_ms && r.lat_sent_p99_ms <= r.lat_confirmed_p99_ms, "{r:?}");
    assert!(r.rss_mb_max > 0.0, "{r:?}");
}
