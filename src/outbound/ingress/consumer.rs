//! The durable pull consumer shared by every pod on the outbound work-queue
//! stream: pull what is there (waiting only when nothing is), parse each request, and hand back the
//! acknowledgement, to be sent only once the request is stored.

use std::time::{Duration, SystemTime};

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::pull::{self, Batch};
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer};
use async_nats::jetstream::{self, Message, message::Acker};
use cabine_actors::ports::outbound_bus::{Arrival, IngressAck, IngressError, OutboundIngress, Pulled};
use futures::StreamExt;

use super::{IngressRules, RawRequest, channel_of_subject, parse_request};

/// Creates (or finds) the durable pull consumer `name` on `stream`. JetStream
/// itself redelivers without bound (`max_deliver: -1`): at its bound it would
/// stop delivering a request and leave it in the stream, unacknowledged and
/// unseen — when that last delivery met a store outage, nothing could have
/// kept it. The bound is the intake's (`outbound.max_deliver`, counted by
/// JetStream's delivery count): past it a request is parked in Postgres, which
/// only succeeds when Postgres answers; until then the bus keeps redelivering.
pub async fn ensure_consumer(
    js: &jetstream::Context,
    stream: &str,
    name: &str,
    ack_wait: Duration,
    max_ack_pending: i64,
) -> Result<PullConsumer, IngressError> {
    let stream = js.get_stream(stream).await.map_err(|e| IngressError::Fatal(format!("stream {stream}: {e}")))?;
    let config = pull::Config {
        durable_name: Some(name.to_owned()),
        ack_policy: AckPolicy::Explicit,
        ack_wait,
        max_deliver: -1,
        max_ack_pending,
        ..Default::default()
    };
    stream.get_or_create_consumer(name, config).await.map_err(|e| IngressError::Fatal(format!("consumer {name}: {e}")))
}

/// Up to `max` requests: what is there now, at once; only when nothing is,
/// waits at most `wait` for one, then takes what arrived with it. Every pull
/// request ends on the server when it returns (a no-wait fetch, or a pull of
/// one that got its message or expired), so none is left to swallow messages.
/// An error after the first message ends the batch early (the rest is
/// redelivered after `ack_wait`).
pub async fn pull_batch(
    consumer: &PullConsumer,
    max: usize,
    wait: Duration,
    rules: &IngressRules,
) -> Result<Vec<Pulled>, IngressError> {
    let mut pulled = Vec::new();
    take(consumer.fetch().max_messages(max).messages(), wait, rules, &mut pulled).await?;
    if pulled.is_empty() {
        take(consumer.batch().max_messages(1).expires(wait).messages(), wait, rules, &mut pulled).await?;
        if pulled.len() == 1 && max > 1 {
            take(consumer.fetch().max_messages(max - 1).messages(), wait, rules, &mut pulled).await?;
        }
    }
    metrics::counter!("cabine_outbound_pulled_total").increment(pulled.len() as u64);
    Ok(pulled)
}

/// Reads one pull request's messages into `pulled`; an error is one only while `pulled` is empty.
async fn take<F, E>(
    request: F,
    wait: Duration,
    rules: &IngressRules,
    pulled: &mut Vec<Pulled>,
) -> Result<(), IngressError>
where
    F: std::future::Future<Output = Result<Batch, E>>,
    E: std::fmt::Display,
{
    let bounded = wait + Duration::from_secs(2);
    let batch = match tokio::time::timeout(bounded, request).await {
        Ok(Ok(batch)) => batch,
        Ok(Err(e)) => return ended(pulled, &e),
        Err(e) => return ended(pulled, &e),
    };
    let mut batch = std::pin::pin!(batch);
    while let Ok(Some(next)) = tokio::time::timeout(bounded, batch.next()).await {
        match next {
            Ok(message) => pulled.push(parse(message, rules)),
            Err(e) => return ended(pulled, &e),
        }
    }
    Ok(())
}

/// A pull that failed: unavailable if nothing was taken yet, else the batch just ends early.
fn ended(pulled: &[Pulled], e: &dyn std::fmt::Display) -> Result<(), IngressError> {
    if pulled.is_empty() {
        return Err(IngressError::Unavailable(e.to_string()));
    }
    tracing::warn!(error = %e, "outbound pull ended early");
    Ok(())
}

fn parse(message: Message, rules: &IngressRules) -> Pulled {
    let (ingress_ref, published, deliveries) = match message.info() {
        Ok(i) => (
            Some(format!("{}:{}:{}", i.stream, i.stream_sequence, i.published.unix_timestamp_nanos())),
            i.published.into(),
            u32::try_from(i.delivered).unwrap_or(u32::MAX),
        ),
        Err(_) => (None, SystemTime::now(), 1),
    };
    let (message, acker) = message.split();
    let headers = message.headers.unwrap_or_default();
    let header = |name: &str| header_value(&headers, name);
    let channel = channel_of_subject(message.subject.as_str(), rules);
    let arrival = Arrival {
        ingress_ref: ingress_ref.clone(),
        subject: message.subject.to_string(),
        headers: kept_headers(&headers),
        raw: message.payload.clone(),
        deliveries,
    };
    let request =
        parse_request(RawRequest { channel, header: &header, body: message.payload, ingress_ref, published }, rules);
    Pulled { request, arrival, ack: Box::new(JetStreamAck(acker)) }
}

/// A header's first value, the name compared case-insensitively.
fn header_value(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .iter()
        .find(|(k, _)| AsRef::<str>::as_ref(*k).eq_ignore_ascii_case(name))
        .and_then(|(_, v)| v.first())
        .map(|v| v.as_str().to_owned())
}

/// The headers a parked copy keeps: `Cabine-*` (what a reprocess parses
/// again) and `Nats-Msg-Id`, first value each, at most 16.
fn kept_headers(headers: &HeaderMap) -> Vec<(String, String)> {
    let kept = |k: &str| {
        k.get(..7).is_some_and(|p| p.eq_ignore_ascii_case("cabine-")) || k.eq_ignore_ascii_case("nats-msg-id")
    };
    headers
        .iter()
        .filter(|(k, _)| kept(k.as_ref()))
        .filter_map(|(k, v)| Some((AsRef::<str>::as_ref(k).to_owned(), v.first()?.as_str().to_owned())))
        .take(16)
        .collect()
}

struct JetStreamAck(Acker);

#[async_trait::async_trait]
impl IngressAck for JetStreamAck {
    async fn ack(self: Box<Self>) -> Result<(), IngressError> {
        self.0.ack().await.map_err(|e| IngressError::Unavailable(e.to_string()))
    }
}

/// Where the durable consumer lives and how it acknowledges.
#[derive(Clone, Debug)]
pub struct ConsumerSpec {
    pub stream: String,
    pub name: String,
    pub ack_wait: Duration,
    pub max_ack_pending: i64,
}

/// [`OutboundIngress`] over the durable consumer, created (or found) on the
/// first pull that reaches JetStream: a bus that is down at start makes the
/// dispatcher retry, it does not stop the pod.
pub struct JetStreamIngress {
    js: jetstream::Context,
    spec: ConsumerSpec,
    consumer: tokio::sync::OnceCell<PullConsumer>,
    rules: IngressRules,
}

impl JetStreamIngress {
    pub fn new(js: jetstream::Context, spec: ConsumerSpec, rules: IngressRules) -> Self {
        JetStreamIngress { js, spec, consumer: tokio::sync::OnceCell::new(), rules }
    }

    async fn consumer(&self) -> Result<&PullConsumer, IngressError> {
        let s = &self.spec;
        self.consumer
            .get_or_try_init(|| async {
                ensure_consumer(&self.js, &s.stream, &s.name, s.ack_wait, s.max_ack_pending)
                    .await
                    .map_err(|e| IngressError::Unavailable(e.to_string()))
            })
            .await
    }
}

#[async_trait::async_trait]
impl OutboundIngress for JetStreamIngress {
    async fn pull(&self, max: usize, wait: Duration) -> Result<Vec<Pulled>, IngressError> {
        pull_batch(self.consumer().await?, max, wait, &self.rules).await
    }
}
