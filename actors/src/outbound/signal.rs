//! In-process hints between the outbound actors of one pod, never a source
//! of truth (Postgres is): "rows may be ready on this channel" (bumped by the
//! dispatcher on every insert and on every depth probe that finds queued rows),
//! the last queue depth read, and "status reports were committed" (poked by
//! the slots, no I/O) for the confirmer.

use std::sync::{Arc, RwLock};

use tokio::sync::{Notify, watch};

use crate::domain::ChannelId;
use crate::ports::outbound::QueueDepth;

struct Inner {
    /// One counter per channel (`ChannelId::ALL` order).
    work: [watch::Sender<u64>; 2],
    depth: RwLock<Option<QueueDepth>>,
    confirm: Notify,
}

#[derive(Clone)]
pub struct OutboundSignal {
    inner: Arc<Inner>,
}

impl Default for OutboundSignal {
    fn default() -> Self {
        let inner = Inner {
            work: [watch::Sender::new(0), watch::Sender::new(0)],
            depth: RwLock::new(None),
            confirm: Notify::new(),
        };
        OutboundSignal { inner: Arc::new(inner) }
    }
}

fn index(channel: ChannelId) -> usize {
    match channel {
        ChannelId::Cpm => 0,
        ChannelId::Csm => 1,
    }
}

impl OutboundSignal {
    /// Rows may be ready on `channel`: wakes its senders.
    pub fn work(&self, channel: ChannelId) {
        self.inner.work[index(channel)].send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A receiver that changes whenever [`OutboundSignal::work`] is called for `channel`.
    pub fn watch_work(&self, channel: ChannelId) -> watch::Receiver<u64> {
        self.inner.work[index(channel)].subscribe()
    }

    /// Records a depth probe and wakes the senders of every channel with queued rows.
    pub fn set_depth(&self, depth: QueueDepth) {
        for channel in ChannelId::ALL {
            if depth.lines.iter().any(|l| l.channel == channel && l.queued > 0) {
                self.work(channel);
            }
        }
        *self.inner.depth.write().unwrap_or_else(|p| p.into_inner()) = Some(depth);
    }

    /// The last depth probe, if any.
    pub fn depth(&self) -> Option<QueueDepth> {
        self.inner.depth.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Status reports were committed to the inbox: the confirmer should run. No I/O.
    pub fn status_reports_committed(&self) {
        self.inner.confirm.notify_one();
    }

    /// Resolves after [`OutboundSignal::status_reports_committed`] (a call made
    /// while nobody waited is remembered once).
    pub async fn reports_committed(&self) {
        self.inner.confirm.notified().await;
    }
}

/// True for the message types whose commit should wake the confirmer.
pub fn is_status_report(msg_type: &str) -> bool {
    matches!(msg_type, "pacs.002" | "admi.002")
}
