//! In-memory result-event publisher over the fake outbound store's outbox:
//! counts every publication by `Nats-Msg-Id` (JetStream would drop repeats
//! within its window; here they are visible), marks events published in the
//! store, can be "down" (events stay unpublished) or slow (a PubAck's round
//! trip), and sweeps the outbox.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::outbound::FakeOutboundStore;
use crate::ports::outbound_bus::{ResultEvent, ResultSink, ResultStatus, ResultsError};

pub struct FakeResults {
    store: Arc<FakeOutboundStore>,
    published: Mutex<HashMap<String, (ResultEvent, u32)>>,
    /// MsgIds of first publications, in the order they were published.
    order: Mutex<Vec<(ResultStatus, String)>>,
    down: AtomicBool,
    latency: Mutex<Duration>,
}

impl FakeResults {
    pub fn new(store: Arc<FakeOutboundStore>) -> Arc<Self> {
        Arc::new(FakeResults {
            store,
            published: Mutex::default(),
            order: Mutex::default(),
            down: AtomicBool::new(false),
            latency: Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (ResultEvent, u32)>> {
        self.published.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// Every publish answers after `latency` (the events count once it answers).
    pub fn set_latency(&self, latency: Duration) {
        *self.latency.lock().unwrap_or_else(|p| p.into_inner()) = latency;
    }

    /// Distinct events published with `status`.
    pub fn count(&self, status: ResultStatus) -> usize {
        self.lock().values().filter(|(e, _)| e.status == status).count()
    }

    /// MsgIds whose `status` event was published, in publication order.
    pub fn published_order(&self, status: ResultStatus) -> Vec<String> {
        let order = self.order.lock().unwrap_or_else(|p| p.into_inner());
        order.iter().filter(|(s, _)| *s == status).map(|(_, m)| m.clone()).collect()
    }

    /// Statuses published for `msg_id`, in event order.
    pub fn statuses(&self, msg_id: &str) -> Vec<ResultStatus> {
        let mut events: Vec<ResultEvent> =
            self.lock().values().filter(|(e, _)| e.msg_id.as_deref() == Some(msg_id)).map(|(e, _)| e.clone()).collect();
        events.sort_by_key(|e| e.id);
        events.into_iter().map(|e| e.status).collect()
    }
}

#[async_trait::async_trait]
impl ResultSink for FakeResults {
    async fn publish(&self, events: &[ResultEvent]) -> Result<usize, ResultsError> {
        let latency = *self.latency.lock().unwrap_or_else(|p| p.into_inner());
        tokio::time::sleep(latency).await;
        if self.down.load(Ordering::SeqCst) {
            return Err(ResultsError::Unavailable("fake bus down".into()));
        }
        {
            let mut published = self.lock();
            let mut order = self.order.lock().unwrap_or_else(|p| p.into_inner());
            for e in events {
                let seen = published.entry(e.dedup_id()).or_insert_with(|| (e.clone(), 0));
                seen.1 += 1;
                if seen.1 == 1 {
                    order.push((e.status, e.msg_id.clone().unwrap_or_default()));
                }
            }
        }
        let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
        self.store.mark_published(&ids);
        Ok(events.len())
    }

    async fn sweep(&self, older_than: Duration, max: u32) -> Result<usize, ResultsError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(ResultsError::Unavailable("fake bus down".into()));
        }
        let events = self.store.unpublished(older_than, max);
        self.publish(&events).await
    }
}
