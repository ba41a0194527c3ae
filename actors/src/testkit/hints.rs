//! In-memory [`WorkHints`]: remembers every hint, in order, so a test can
//! check the intake hints each channel with new rows once per round.

use std::sync::{Arc, Mutex};

use crate::domain::ChannelId;
use crate::ports::outbound_bus::WorkHints;

#[derive(Default)]
pub struct FakeHints {
    sent: Mutex<Vec<ChannelId>>,
}

impl FakeHints {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Every hint so far, in order.
    pub fn sent(&self) -> Vec<ChannelId> {
        self.sent.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl WorkHints for FakeHints {
    fn rows_stored(&self, channel: ChannelId) {
        self.sent.lock().unwrap_or_else(|p| p.into_inner()).push(channel);
    }
}
