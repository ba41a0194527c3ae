//! In-memory publisher: records what was published (JetStream would dedupe
//! repeats by `Nats-Msg-Id`; here they are counted), can be "down" (rows stay
//! unpublished, as with NATS unreachable), and sweeps the fake inbox for rows
//! unpublished longer than the given age.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::inbox::FakeInbox;
use crate::ports::{CommittedRow, InboundPublisher, PublishError};

pub struct FakePublisher {
    inbox: Arc<FakeInbox>,
    published: Mutex<HashMap<i64, u32>>,
    down: AtomicBool,
}

impl FakePublisher {
    pub fn new(inbox: Arc<FakeInbox>) -> Arc<Self> {
        Arc::new(FakePublisher { inbox, published: Mutex::default(), down: AtomicBool::new(false) })
    }

    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    fn publish(&self, ids: impl IntoIterator<Item = i64>) -> usize {
        let mut published = self.published.lock().unwrap_or_else(|p| p.into_inner());
        ids.into_iter().map(|id| *published.entry(id).or_default() += 1).count()
    }

    /// Distinct inbox rows published.
    pub fn published(&self) -> usize {
        self.published.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Inbox rows not published yet.
    pub fn unpublished(&self) -> usize {
        let published = self.published.lock().unwrap_or_else(|p| p.into_inner());
        self.inbox.rows().iter().filter(|r| !published.contains_key(&r.id)).count()
    }
}

#[async_trait::async_trait]
impl InboundPublisher for FakePublisher {
    async fn committed(&self, rows: Vec<CommittedRow>) {
        if !self.down.load(Ordering::SeqCst) {
            self.publish(rows.into_iter().map(|r| r.id));
        }
    }

    async fn sweep(&self, older_than: Duration) -> Result<usize, PublishError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(PublishError::Unavailable("fake bus down".into()));
        }
        let stale: Vec<i64> = {
            let published = self.published.lock().unwrap_or_else(|p| p.into_inner());
            let rows = self.inbox.rows();
            rows.iter()
                .filter(|r| r.committed_at.elapsed() >= older_than && !published.contains_key(&r.id))
                .map(|r| r.id)
                .collect()
        };
        Ok(self.publish(stale))
    }

    async fn oldest_unpublished(&self) -> Result<Duration, PublishError> {
        let published = self.published.lock().unwrap_or_else(|p| p.into_inner());
        let rows = self.inbox.rows();
        let oldest = rows
            .iter()
            .filter(|r| r.message.malformed.is_none() && !published.contains_key(&r.id))
            .map(|r| r.committed_at.elapsed())
            .max();
        Ok(oldest.unwrap_or_default())
    }
}
