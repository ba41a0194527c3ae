//! Conformance, mTLS: the simulator under `--tls` (its generated PKI) and the
//! REAL client configured from `Settings` with those PEM files — admitted with
//! the participant's certificate (a whole send → pacs.002 → read round trip,
//! Host without port under strict checks), refused with 403 (Rejected) when
//! the certificate's CN is another ISPB, and at the handshake (Transport)
//! without a certificate.

mod conformance_support;
mod sim_support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cabine::icom::{EndpointSettings, IcomChannels, IcomEndpoint, SendOutcome, WireLimits, tls};
use cabine::sim::{ServerKeyKind, TlsFiles, TlsOptions};
use cabine_actors::domain::ChannelId;
use cabine_actors::ports::{CloseOutcome, PollOutcome};
use conformance_support::{channel_overrides, empty, end_to_end_id, messages, pacs008, settings};
use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use sim_support::{ISPB, OTHER, TestSim, msg_id};

async fn tls_sim(dir: &Path) -> TestSim {
    let dir = dir.to_owned();
    sim_support::start(move |c| {
        c.ispbs = vec![ISPB.parse().unwrap(), OTHER.parse().unwrap()];
        c.tls = Some(TlsOptions { dir, server_key: ServerKeyKind::Auto });
        c.hold = Duration::ZERO;
    })
    .await
}

/// The client of participant `ispb` presenting the certificate issued to `cert_of`.
fn channels(t: &TestSim, files: &TlsFiles, ispb: &str, cert_of: &str) -> IcomChannels {
    let client = files.client(cert_of).expect("client files");
    let path = |p: &Path| p.to_str().unwrap().to_owned();
    let base = format!("https://localhost:{}", t.sim.primary.port());
    let mut overrides = channel_overrides(&base, ispb, conformance_support::CLIENT_TIMEOUT);
    overrides.extend([
        ("CABINE__ICOM__CHANNELS__CPM__CA_FILE", path(&files.ca_cert)),
        ("CABINE__ICOM__CHANNELS__CPM__CERT_FILE", path(&client.cert)),
        ("CABINE__ICOM__CHANNELS__CPM__KEY_FILE", path(&client.key)),
    ]);
    IcomChannels::from_settings(&settings(&overrides)).expect("mTLS client from the simulator's files")
}

#[tokio::test]
async fn the_participants_certificate_is_admitted_for_a_whole_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let t = tls_sim(dir.path()).await;
    let files = t.sim.tls.clone().expect("TLS files");
    let channels = channels(&t, &files, ISPB, ISPB);
    let mut client = channels.client(ChannelId::Cpm).unwrap();

    let (id, e2e) = (msg_id(700), end_to_end_id(700));
    let SendOutcome::Accepted { resource_ids } = client.send(&[pacs008(&id, &[&e2e])]).await.unwrap() else {
        panic!("the right certificate is admitted")
    };
    assert_eq!(resource_ids.len(), 1);
    let (answers, pull_next) = messages(client.start().await);
    assert_eq!(answers[0].meta.msg_type(), "pacs.002");
    assert_eq!(answers[0].meta.end_to_end_id.as_deref(), Some(e2e.as_str()));
    assert_eq!(client.close(&pull_next).await, CloseOutcome::Closed);
    let audit = t.audit_of(ISPB, "cpm").await;
    assert_eq!((audit["acknowledged"].as_u64(), audit["max_tcp_connections"].as_u64()), (Some(1), Some(1)));
}

#[tokio::test]
async fn another_participants_certificate_is_rejected_with_403() {
    let dir = tempfile::tempdir().unwrap();
    let t = tls_sim(dir.path()).await;
    let files = t.sim.tls.clone().unwrap();
    let mut client = channels(&t, &files, ISPB, OTHER).client(ChannelId::Cpm).unwrap();
    let PollOutcome::Rejected { status: 403, problem: Some(problem) } = client.start().await else {
        panic!("a CN that is not the path's ISPB is a 403")
    };
    assert!(problem.contains("/error/forbidden"), "{problem}");
    let sent = client.send(&[pacs008(&msg_id(701), &[&end_to_end_id(701)])]).await.unwrap();
    assert!(matches!(sent, SendOutcome::Rejected { status: 403, problem: Some(_) }), "{sent:?}");
    let audit = t.audit_of(ISPB, "cpm").await;
    assert_eq!((audit["open_streams"].as_u64(), audit["received_outbound"].as_u64()), (Some(0), Some(0)));

    // The same certificate on its own ISPB's path is fine.
    let mut right = channels(&t, &files, OTHER, OTHER).client(ChannelId::Cpm).unwrap();
    empty(right.start().await);
}

#[tokio::test]
async fn no_client_certificate_is_a_transport_failure() {
    let dir = tempfile::tempdir().unwrap();
    let t = tls_sim(dir.path()).await;
    let files = t.sim.tls.clone().unwrap();
    let mut roots = RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(&files.ca_cert).unwrap()).unwrap();
    let anonymous = tls::builder().unwrap().with_root_certificates(roots).with_no_client_auth();
    let settings = EndpointSettings {
        channel: ChannelId::Cpm,
        ispb: ISPB.parse().unwrap(),
        base_url: format!("https://localhost:{}", t.sim.primary.port()),
        limits: WireLimits::ICOM,
        long_poll_timeout: Duration::from_secs(2),
        send_timeout: Duration::from_secs(2),
        host_without_port: true,
    };
    let endpoint = Arc::new(IcomEndpoint::new(settings, anonymous).unwrap());
    let mut client = endpoint.connect().unwrap();
    assert!(matches!(client.start().await, PollOutcome::Transport(_)));
    let sent = client.send(&[pacs008(&msg_id(702), &[&end_to_end_id(702)])]).await.unwrap();
    assert!(matches!(sent, SendOutcome::Transport(_)), "{sent:?}");
    assert_eq!(t.audit_of(ISPB, "cpm").await["max_in_flight"], 0, "no request reached ICOM");
}
