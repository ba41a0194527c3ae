//! An independent reader of the inbound JetStream stream (an ordered consumer,
//! nothing acknowledged, nothing taken from anyone): records when each
//! `Nats-Msg-Id` first arrived, and counts repeats. Tests and `bench inbound`
//! judge delivery with it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_nats::jetstream::consumer::{DeliverPolicy, pull::OrderedConfig};
use futures::StreamExt;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// What was read so far.
#[derive(Default)]
pub struct Arrivals {
    /// Nats-Msg-Id → first arrival.
    pub first: HashMap<String, Instant>,
    /// Messages read in all (repeats included).
    pub read: u64,
    /// Arrival of the latest new id.
    pub last_new: Option<Instant>,
}

/// A running reader; dropping it stops it.
pub struct BusReader {
    arrivals: Arc<Mutex<Arrivals>>,
    task: JoinHandle<()>,
}

impl BusReader {
    /// Reads every message of `stream` on subjects `filter` from its start.
    pub async fn start(client: async_nats::Client, stream: &str, filter: &str) -> Result<BusReader, String> {
        let bound = super::STARTUP_BOUND;
        tokio::time::timeout(bound, Self::open(client, stream, filter))
            .await
            .unwrap_or_else(|_| Err(format!("reader of {stream} not started within {bound:?}")))
    }

    async fn open(client: async_nats::Client, stream: &str, filter: &str) -> Result<BusReader, String> {
        let js = async_nats::jetstream::new(client);
        let stream = js.get_stream(stream).await.map_err(|e| format!("inbound stream: {e}"))?;
        let config = OrderedConfig {
            filter_subject: filter.to_owned(),
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        };
        let consumer = stream.create_consumer(config).await.map_err(|e| format!("ordered consumer: {e}"))?;
        let mut messages = consumer.messages().await.map_err(|e| format!("consumer messages: {e}"))?;
        let arrivals = Arc::new(Mutex::new(Arrivals::default()));
        let sink = arrivals.clone();
        let task = tokio::spawn(async move {
            while let Some(next) = messages.next().await {
                let Ok(m) = next else { continue };
                let now = Instant::now();
                let id = m.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id")).map(|v| v.as_str().to_owned());
                let mut a = sink.lock().unwrap_or_else(|p| p.into_inner());
                a.read += 1;
                if let Some(id) = id
                    && !a.first.contains_key(&id)
                {
                    a.first.insert(id, now);
                    a.last_new = Some(now);
                }
            }
        });
        Ok(BusReader { arrivals, task })
    }

    /// Distinct ids read so far.
    pub fn unique(&self) -> usize {
        self.with(|a| a.first.len())
    }

    pub fn with<T>(&self, f: impl FnOnce(&Arrivals) -> T) -> T {
        f(&self.arrivals.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Drop for BusReader {
    fn drop(&mut self) {
        self.task.abort();
    }
}
