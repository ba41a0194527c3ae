//! The durable pull consumer shared by every pod on the outbound work-queue
//! stream: pull a bounded batch, parse each request, and hand back the
//! acknowledgement, to be sent only once the request is stored.

use std::time::{Duration, SystemTime};

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::{self, Message, message::Acker};
use cabine_actors::ports::outbound_bus::{IngressAck, IngressError, OutboundIngress, Pulled};
use futures::StreamExt;

use super::{IngressRules, RawRequest, channel_of_subject, parse_request};

/// Creates (or finds) the durable pull consumer `name` on `stream`.
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

/// Up to `max` requests, waiting at most `wait`; an error after the first
/// message ends the batch early (the rest is redelivered after `ack_wait`).
pub async fn pull_batch(
    consumer: &PullConsumer,
    max: usize,
    wait: Duration,
    rules: &IngressRules,
) -> Result<Vec<Pulled>, IngressError> {
    let unavailable = |e: &dyn std::fmt::Display| IngressError::Unavailable(e.to_string());
    let bounded = wait + Duration::from_secs(2);
    let fetch = consumer.batch().max_messages(max).expires(wait).messages();
    let mut batch =
        tokio::time::timeout(bounded, fetch).await.map_err(|e| unavailable(&e))?.map_err(|e| unavailable(&e))?;
    let mut pulled = Vec::new();
    while let Ok(Some(next)) = tokio::time::timeout(bounded, batch.next()).await {
        match next {
            Ok(message) => pulled.push(parse(message, rules)),
            Err(e) if pulled.is_empty() => return Err(unavailable(&e)),
            Err(e) => {
                tracing::warn!(error = %e, "outbound pull ended early");
                break;
            }
        }
    }
    metrics::counter!("cabine_outbound_pulled_total").increment(pulled.len() as u64);
    Ok(pulled)
}

fn parse(message: Message, rules: &IngressRules) -> Pulled {
    let (ingress_ref, published) = match message.info() {
        Ok(i) => (
            Some(format!("{}:{}:{}", i.stream, i.stream_sequence, i.published.unix_timestamp_nanos())),
            i.published.into(),
        ),
        Err(_) => (None, SystemTime::now()),
    };
    let (message, acker) = message.split();
    let headers = message.headers.unwrap_or_default();
    let header = |name: &str| header_value(&headers, name);
    let channel = channel_of_subject(message.subject.as_str(), rules);
    let request =
        parse_request(RawRequest { channel, header: &header, body: message.payload, ingress_ref, published }, rules);
    Pulled { request, ack: Box::new(JetStreamAck(acker)) }
}

/// A header's first value, the name compared case-insensitively.
fn header_value(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .iter()
        .find(|(k, _)| AsRef::<str>::as_ref(*k).eq_ignore_ascii_case(name))
        .and_then(|(_, v)| v.first())
        .map(|v| v.as_str().to_owned())
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
