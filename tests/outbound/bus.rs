//! The outbound bus against real NATS JetStream: pulling requests from the
//! durable work-queue consumer (acknowledged only after they are stored) and
//! publishing result events once, through a NATS outage, from the outbox.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream::Stream};
use cabine::bus::Subjects;
use cabine::config::Settings;
use cabine::outbound::ingress::{DEADLINE_CLASS_HEADER, IngressRules, PRIORITY_HEADER, ensure_consumer, pull_batch};
use cabine::outbound::results::JetStreamResults;
use cabine_actors::ports::outbound::{Inserted, OutboundStore, Priority};
use cabine_actors::ports::outbound_bus::{OutboundRequest, Pulled, ResultEvent, ResultSink};

use crate::common::settings;
use crate::store::{Rig, msg};

struct Bus {
    s: Settings,
    js: jetstream::Context,
    subjects: Subjects,
}

impl Bus {
    async fn new(url: Option<&str>) -> Bus {
        let mut s = settings("obb", &[]);
        if let Some(url) = url {
            s.nats.url = url.to_owned();
        }
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .reconnect_delay_callback(|_| Duration::from_millis(50))
            .connect(&s.nats.url)
            .await
            .unwrap();
        let mut js = jetstream::new(client.clone());
        js.set_timeout(Duration::from_millis(700));
        let subjects = Subjects::new(&s.nats, &s.cluster.ispb);
        cabine::bus::ensure_streams(&client, &s.nats, &subjects, &["cpm"]).await.unwrap();
        Bus { s, js, subjects }
    }

    async fn stream(&self, name: &str) -> Stream {
        self.js.get_stream(name).await.unwrap()
    }

    async fn messages(&self, name: &str) -> u64 {
        self.stream(name).await.get_info().await.unwrap().state.messages
    }

    async fn publish(&self, headers: &[(&str, &str)], body: String) {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.insert(*k, *v);
        }
        let ack = self.js.publish_with_headers(self.subjects.outbound("cpm"), h, body.into()).await.unwrap();
        ack.await.unwrap();
    }

    async fn delete_streams(&self) {
        for name in [&self.s.nats.inbound_stream, &self.s.nats.outbound_stream, &self.s.nats.results_stream] {
            let _ = self.js.delete_stream(name).await;
        }
    }
}

fn body_of(n: u32) -> String {
    String::from_utf8(msg(n, Priority::Normal, Duration::from_secs(60)).raw.to_vec()).unwrap()
}

#[tokio::test]
async fn requests_are_pulled_parsed_stored_then_acknowledged() {
    let bus = Bus::new(None).await;
    let rig = Rig::new().await;
    let consumer =
        ensure_consumer(&bus.js, &bus.s.nats.outbound_stream, &bus.s.outbound.consumer, Duration::from_secs(1), 100)
            .await
            .unwrap();
    bus.publish(&[(PRIORITY_HEADER, "critical"), (DEADLINE_CLASS_HEADER, "saque_troco")], body_of(1)).await;
    bus.publish(&[], "<Envelope><AppHdr>".to_owned()).await;
    bus.publish(&[], body_of(1)).await;
    let rules = IngressRules::from_settings(&bus.s);
    let pulled = pull_batch(&consumer, 10, Duration::from_millis(500), &rules).await.unwrap();
    assert_eq!(pulled.len(), 3);
    let mut outcomes = Vec::new();
    for (i, Pulled { request, ack, .. }) in pulled.into_iter().enumerate() {
        let stored = match &request {
            OutboundRequest::Valid(m) => {
                assert_eq!(m.priority, if i == 0 { Priority::Critical } else { Priority::Normal });
                assert!(m.ingress_ref.as_deref().unwrap().starts_with(&format!("{}:", bus.s.nats.outbound_stream)));
                rig.store.insert(m).await.unwrap()
            }
            OutboundRequest::Invalid(bad) => {
                assert!(bad.reason.contains("body"), "{}", bad.reason);
                rig.store.insert_invalid(bad).await.unwrap()
            }
        };
        ack.ack().await.unwrap();
        outcomes.push(matches!(stored, Inserted::New { .. }));
    }
    assert_eq!(outcomes, [true, true, false], "the same MsgId published twice is stored once");
    let first = rig.store.get(&msg(1, Priority::Normal, Duration::ZERO).msg_id).await.unwrap().unwrap().row;
    assert_eq!(first.priority, Priority::Critical);
    let budget = first.deadline.duration_since(first.created_at).unwrap_or_default();
    assert!(budget <= Duration::from_secs(30), "saque_troco counts from publication: {budget:?}");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(bus.messages(&bus.s.nats.outbound_stream).await, 0, "acknowledged requests leave the work queue");
    assert!(pull_batch(&consumer, 10, Duration::from_millis(200), &rules).await.unwrap().is_empty());
    bus.delete_streams().await;
    rig.drop_schema().await;
}

#[tokio::test]
async fn an_unacknowledged_request_comes_back_with_the_same_ingress_ref() {
    let bus = Bus::new(None).await;
    let consumer = ensure_consumer(
        &bus.js,
        &bus.s.nats.outbound_stream,
        &bus.s.outbound.consumer,
        Duration::from_millis(500),
        100,
    )
    .await
    .unwrap();
    bus.publish(&[], "not xml".to_owned()).await;
    let rules = IngressRules::from_settings(&bus.s);
    let first = pull_batch(&consumer, 10, Duration::from_millis(300), &rules).await.unwrap();
    let ref_of = |p: &[Pulled]| match &p[0].request {
        OutboundRequest::Invalid(i) => i.ingress_ref.clone(),
        OutboundRequest::Valid(v) => v.ingress_ref.clone(),
    };
    let first_ref = ref_of(&first);
    drop(first); // crashed before storing: no acknowledgement
    tokio::time::sleep(Duration::from_millis(600)).await;
    let again = pull_batch(&consumer, 10, Duration::from_millis(500), &rules).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(ref_of(&again), first_ref, "a redelivery is recognisable");
    bus.delete_streams().await;
}

async fn events_of(rig: &Rig, n: u32) -> Vec<ResultEvent> {
    let mut events = Vec::new();
    for i in 0..n {
        if let Inserted::New { event, .. } =
            rig.store.insert(&msg(i, Priority::Normal, Duration::from_secs(60))).await.unwrap()
        {
            events.push(event);
        }
    }
    events
}

#[tokio::test]
async fn result_events_are_published_once_with_their_dedup_ids() {
    let bus = Bus::new(None).await;
    let rig = Rig::new().await;
    let results =
        JetStreamResults::new(bus.js.clone(), bus.subjects.results(), rig.pool.clone(), Duration::from_secs(2));
    let events = events_of(&rig, 3).await;
    assert_eq!(results.publish(&events).await.unwrap(), 3);
    assert_eq!(results.publish(&events).await.unwrap(), 3, "a republication is accepted...");
    assert_eq!(bus.messages(&bus.s.nats.results_stream).await, 3, "...and dropped as a duplicate");
    assert_eq!(results.sweep(Duration::ZERO, 100).await.unwrap(), 0, "all marked published");
    let stream = bus.stream(&bus.s.nats.results_stream).await;
    let first = stream.get_raw_message(1).await.unwrap();
    assert_eq!(first.subject.as_str(), bus.subjects.results());
    let id = first.headers.get(async_nats::header::NATS_MESSAGE_ID).unwrap().as_str().to_owned();
    assert_eq!(id, events[0].dedup_id());
    let body: serde_json::Value = serde_json::from_slice(&first.payload).unwrap();
    assert_eq!(body["status"], "accepted");
    assert_eq!(body["msg_id"], events[0].msg_id.clone().unwrap());
    assert_eq!((body["channel"].as_str(), body["attempt"].as_u64()), (Some("cpm"), Some(0)));
    assert!(body["at"].as_str().unwrap().ends_with('Z'));
    bus.delete_streams().await;
    rig.drop_schema().await;
}

/// A private `nats-server -js` on a fixed port and store directory, restartable.
struct PrivateNats {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl PrivateNats {
    async fn start() -> PrivateNats {
        let mut n =
            PrivateNats { port: cabine::harness::free_port().unwrap(), dir: tempfile::tempdir().unwrap(), child: None };
        n.restart().await;
        n
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    async fn restart(&mut self) {
        let child = Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string(), "-js", "-sd"])
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server on PATH");
        self.child = Some(child);
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("private nats did not start");
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for PrivateNats {
    fn drop(&mut self) {
        self.stop();
    }
}

#[tokio::test]
async fn a_nats_outage_loses_no_event_the_sweep_republishes_them_once() {
    let mut nats = PrivateNats::start().await;
    let bus = Bus::new(Some(&nats.url())).await;
    let rig = Rig::new().await;
    let results =
        JetStreamResults::new(bus.js.clone(), bus.subjects.results(), rig.pool.clone(), Duration::from_secs(2));
    let early = events_of(&rig, 2).await;
    results.publish(&early).await.unwrap();
    nats.stop();
    let during = rig.store.insert(&msg(50, Priority::High, Duration::from_secs(60))).await.unwrap();
    let Inserted::New { event, .. } = during else { panic!("new") };
    assert!(results.publish(std::slice::from_ref(&event)).await.is_err(), "NATS is down");
    nats.restart().await;
    let mut republished = 0;
    for _ in 0..100 {
        match results.sweep(Duration::ZERO, 100).await {
            Ok(n) if n > 0 => {
                republished = n;
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert_eq!(republished, 1, "exactly the unpublished event");
    assert_eq!(results.sweep(Duration::ZERO, 100).await.unwrap(), 0);
    assert_eq!(bus.messages(&bus.s.nats.results_stream).await, 3, "each event once on the stream");
    let last = bus.stream(&bus.s.nats.results_stream).await.get_raw_message(3).await.unwrap();
    assert_eq!(last.headers.get(async_nats::header::NATS_MESSAGE_ID).unwrap().as_str(), event.dedup_id());
    rig.drop_schema().await;
}

#[tokio::test]
async fn the_sweep_leaves_fresh_events_to_their_publisher() {
    let bus = Bus::new(None).await;
    let rig = Rig::new().await;
    let results =
        JetStreamResults::new(bus.js.clone(), bus.subjects.results(), rig.pool.clone(), Duration::from_secs(2));
    events_of(&rig, 2).await;
    assert_eq!(results.sweep(Duration::from_secs(30), 100).await.unwrap(), 0, "younger than republish_after");
    assert_eq!(results.sweep(Duration::ZERO, 1).await.unwrap(), 1, "bounded");
    assert_eq!(results.sweep(Duration::ZERO, 100).await.unwrap(), 1);
    bus.delete_streams().await;
    rig.drop_schema().await;
}

#[tokio::test]
async fn a_pull_hands_over_what_is_there_at_once_and_waits_only_when_nothing_is() {
    let bus = Bus::new(None).await;
    let consumer =
        ensure_consumer(&bus.js, &bus.s.nats.outbound_stream, &bus.s.outbound.consumer, Duration::from_secs(30), 100)
            .await
            .unwrap();
    let rules = IngressRules::from_settings(&bus.s);
    let wait = Duration::from_secs(5);
    for n in 0..3 {
        bus.publish(&[], body_of(n)).await;
    }
    let started = tokio::time::Instant::now();
    let pulled = pull_batch(&consumer, 100, wait, &rules).await.unwrap();
    assert_eq!(pulled.len(), 3);
    assert!(started.elapsed() < Duration::from_secs(1), "3 of 100 without waiting: {:?}", started.elapsed());
    let started = tokio::time::Instant::now();
    assert!(pull_batch(&consumer, 100, Duration::from_millis(300), &rules).await.unwrap().is_empty());
    assert!(started.elapsed() >= Duration::from_millis(250), "an empty queue waits: {:?}", started.elapsed());
    // Nothing outstanding on the server swallows what comes next (ack_wait is 30 s).
    let late = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        bus.publish(&[], body_of(10)).await;
        bus.publish(&[], body_of(11)).await;
    };
    let started = tokio::time::Instant::now();
    let (pulled, ()) = tokio::join!(pull_batch(&consumer, 100, wait, &rules), late);
    let pulled = pulled.unwrap();
    assert!(started.elapsed() < Duration::from_secs(2), "the first arrival ends the wait: {:?}", started.elapsed());
    let mut got = pulled.len();
    if got < 2 {
        got += pull_batch(&consumer, 100, Duration::from_millis(500), &rules).await.unwrap().len();
    }
    assert_eq!(got, 2, "both late requests are delivered at once, none held by a stale pull");
    bus.delete_streams().await;
}
