//! Work hints between pods over the real NATS: a hint published by one pod's
//! intake reaches another pod's senders' signal (and only on its channel); a
//! relay whose bus was not there yet subscribes once it is.

mod support;

use std::time::Duration;

use cabine::bus::Subjects;
use cabine::outbound::hints::{NatsWorkHints, relay};
use cabine_actors::domain::ChannelId;
use cabine_actors::outbound::OutboundSignal;
use cabine_actors::ports::outbound_bus::WorkHints;
use support::{PrivateNats, eventually, settings};
use tokio::sync::watch::Receiver;

/// Hints `channel` every 50 ms until `woken` sees it, for at most `secs` seconds.
async fn hinted_until_woken(hints: &NatsWorkHints, channel: ChannelId, woken: &Receiver<u64>, secs: u64) -> bool {
    eventually(Duration::from_secs(secs), || {
        hints.rows_stored(channel);
        let changed = woken.has_changed().unwrap_or(false);
        async move { changed }
    })
    .await
}

#[tokio::test]
async fn a_hint_from_one_pod_wakes_the_senders_of_another_on_its_channel() {
    let s = settings("work_hints", &[]);
    let subject = Subjects::new(&s.nats, &s.cluster.ispb).work_hints();
    let (a, b) = (async_nats::connect(&s.nats.url).await.unwrap(), async_nats::connect(&s.nats.url).await.unwrap());
    let signal = OutboundSignal::default();
    let (cpm, csm) = (signal.watch_work(ChannelId::Cpm), signal.watch_work(ChannelId::Csm));
    let relay = relay(b, subject.clone(), signal.clone());
    let hints = NatsWorkHints::new(a, subject);
    assert!(hinted_until_woken(&hints, ChannelId::Cpm, &cpm, 5).await, "the other pod's cpm senders were woken");
    assert!(!csm.has_changed().unwrap(), "a hint wakes only its channel's senders");
    relay.abort();
}

#[tokio::test]
async fn a_relay_started_while_its_bus_is_down_relays_once_the_bus_is_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut nats = PrivateNats::start(dir.path().to_path_buf());
    let url = nats.url();
    nats.kill();
    let connect = || async_nats::ConnectOptions::new().retry_on_initial_connect().connect(url.clone());
    let (a, b) = (connect().await.unwrap(), connect().await.unwrap());
    let signal = OutboundSignal::default();
    let csm = signal.watch_work(ChannelId::Csm);
    let relay = relay(b, "hint.test.out".into(), signal.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;
    nats.restart();
    let hints = NatsWorkHints::new(a, "hint.test.out".into());
    assert!(hinted_until_woken(&hints, ChannelId::Csm, &csm, 15).await, "hints flow once the bus is up");
    relay.abort();
}
