//! A pod's own link to ICOM, which a test can cut: while down, every request
//! of the pod's streams fails with a transport error without reaching the
//! fake server (its network or its certificate is broken); the other pods are
//! not affected. Up again, requests pass through.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::domain::ChannelId;
use crate::ports::{CloseOutcome, IcomConnector, IcomStream, PollOutcome};

/// The switch of one pod's link; clones share it.
#[derive(Clone, Default)]
pub struct LinkFault {
    down: Arc<AtomicBool>,
}

impl LinkFault {
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    fn is_down(&self) -> bool {
        self.down.load(Ordering::SeqCst)
    }

    /// `inner` seen through this link.
    pub fn wrap(&self, inner: Arc<dyn IcomConnector>) -> Arc<dyn IcomConnector> {
        Arc::new(LinkedConnector { inner, link: self.clone() })
    }
}

struct LinkedConnector {
    inner: Arc<dyn IcomConnector>,
    link: LinkFault,
}

impl IcomConnector for LinkedConnector {
    fn stream(&self, channel: ChannelId) -> Box<dyn IcomStream> {
        Box::new(LinkedStream { inner: self.inner.stream(channel), link: self.link.clone() })
    }
}

struct LinkedStream {
    inner: Box<dyn IcomStream>,
    link: LinkFault,
}

const REFUSED: &str = "connection refused (the pod's link is down)";

#[async_trait::async_trait]
impl IcomStream for LinkedStream {
    async fn start(&mut self) -> PollOutcome {
        if self.link.is_down() { PollOutcome::Transport(REFUSED.into()) } else { self.inner.start().await }
    }

    async fn next(&mut self, pull_next: &str) -> PollOutcome {
        if self.link.is_down() { PollOutcome::Transport(REFUSED.into()) } else { self.inner.next(pull_next).await }
    }

    async fn close(&mut self, pull_next: &str) -> CloseOutcome {
        if self.link.is_down() { CloseOutcome::Failed(REFUSED.into()) } else { self.inner.close(pull_next).await }
    }
}
