//! `cabine bench outbound` end to end on a few hundred messages (figures are
//! not judged here — benchmarks print, tests check): both runs settle and the
//! report agrees with itself and with the simulator's audit; its time series
//! (`--series`) account for every message, and `bench report` draws them.

use std::path::PathBuf;

use cabine::bench::outbound::run;
use cabine::cli::OutboundBenchArgs;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn both_runs_settle_and_the_report_is_consistent() {
    let dir = tempfile::tempdir().expect("a report dir");
    let series = dir.path().join("outbound-series.json");
    let args = OutboundBenchArgs { pods: 2, messages: 200, rate: 100.0, series: Some(series.clone()) };
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

    let s: cabine::bench::series::Series = serde_json::from_slice(&std::fs::read(&series).unwrap()).unwrap();
    let names: Vec<&str> = s.rates.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["accepted", "sent", "confirmed"]);
    for (name, per_s) in &s.rates {
        // 250 ms buckets: a bucket's rate × 0.25 s is its count.
        let total: f64 = per_s.iter().map(|r| r * 0.25).sum();
        assert_eq!(total.round() as i64, 400, "{name}: {per_s:?}");
        assert_eq!(per_s.len(), s.t_s.len());
    }
    assert_eq!(s.cdf_ms.len(), s.cdf_quantiles.len());
    assert!(s.cdf_ms.windows(2).all(|w| w[0] <= w[1]), "a CDF: {:?}", s.cdf_ms);
    // By state over time: never more rows than published, every one confirmed at the end.
    let confirmed = s.states.iter().find(|(name, _)| name == "confirmed").expect("a confirmed line");
    assert_eq!(confirmed.1.last().copied(), Some(400.0), "{:?}", s.states);
    for b in 0..s.t_s.len() {
        let rows: f64 = s.states.iter().map(|(_, v)| v[b]).sum();
        assert!(rows <= 400.0, "bucket {b}: {rows} rows in some state");
    }
    std::fs::write(dir.path().join("benches.jsonl"), serde_json::to_string(&r).unwrap()).unwrap();
    let md = std::fs::read_to_string(cabine::bench::report::render(dir.path()).unwrap()).unwrap();
    assert!(md.contains("## bench outbound") && md.contains("outbound-throughput.svg"), "{md}");
    let svg = std::fs::read_to_string(dir.path().join("outbound-throughput.svg")).unwrap();
    assert!(svg.contains("<polyline") && svg.contains("confirmed"), "drawn with its legend");
    assert!(md.contains("outbound-states.svg") && dir.path().join("outbound-states.svg").exists(), "{md}");
}
