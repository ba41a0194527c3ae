//! `cabine bench sim` end to end on a few hundred messages (figures are not
//! judged here — benchmarks print, tests check): every phase completes and the
//! simulator's audit agrees with what the real client read and sent.

use std::collections::HashMap;

use cabine::bench::sim::{BATCH, run};
use cabine::cli::SimBenchArgs;
use cabine::config::{DEFAULT_TOML, Settings};
use cabine::harness::outbound::pacs008_bodies;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_phase_runs_and_the_audit_agrees() {
    cabine::install_crypto_provider();
    let settings = Settings::from_sources(DEFAULT_TOML, None, &HashMap::new()).unwrap();
    let report = run(&SimBenchArgs { messages: 300 }, &settings).await.expect("the bench runs");
    assert_eq!((report.messages, report.batch, report.bucket), (300, BATCH, "lifted"));
    for figure in [
        report.read_1_stream_msgs_per_s,
        report.read_6_streams_msgs_per_s,
        report.send_1_client_msgs_per_s,
        report.send_6_clients_msgs_per_s,
    ] {
        assert!(figure.is_finite() && figure > 0.0, "{report:?}");
    }
    assert!(report.read_1_stream_p50_us > 0 && report.send_1_client_p50_us > 0);
}

#[test]
fn the_bench_sends_well_formed_pacs008_from_the_participant_with_unique_ids() {
    let ispb = "99999010".parse().unwrap();
    let bodies = pacs008_bodies(&ispb, 3);
    let envelopes: Vec<_> = bodies.iter().map(|b| cabine::icom::envelope::read(b).unwrap()).collect();
    for e in &envelopes {
        assert_eq!(e.msg_def, "pacs.008.spi.1.16");
        assert_eq!((e.from.as_deref(), e.to.as_deref()), (Some("99999010"), Some("00038166")));
        assert_eq!(e.msg_id.as_deref(), Some(e.biz_msg_id.as_str()));
        assert!(e.biz_msg_id.len() == 32 && e.biz_msg_id.starts_with("M99999010"), "{}", e.biz_msg_id);
        assert!(e.end_to_end_ids[0].len() == 32 && e.end_to_end_ids[0].starts_with("E99999010"));
    }
    assert_ne!(envelopes[0].biz_msg_id, envelopes[1].biz_msg_id);
    assert_ne!(envelopes[1].end_to_end_ids, envelopes[2].end_to_end_ids);
}
