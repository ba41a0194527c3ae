//! In-memory send gates with the Postgres design's rules (DESIGN §2.5): one
//! row per (channel, send slot), claims take the next fence and say what is
//! left of the previous holder's busy window (and open their own), writes are
//! fenced and only ever extend `busy_until`; tokio's clock stands for Postgres's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::domain::ChannelId;
use crate::ports::{GateClaim, GateError, SendGates};

#[derive(Clone, Debug, Default)]
pub struct GateRow {
    pub fence: i64,
    pub holder: String,
    pub busy_until: Option<Instant>,
}

#[derive(Default)]
pub struct FakeSendGates {
    rows: Mutex<HashMap<(ChannelId, u8), GateRow>>,
    /// How long an arm takes to answer (applied at once, answered after it).
    arm_latency: Mutex<Duration>,
}

impl FakeSendGates {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    pub fn row(&self, channel: ChannelId, slot: u8) -> Option<GateRow> {
        self.lock().get(&(channel, slot)).cloned()
    }

    /// Every arm answers after `latency` (its write applies at once).
    pub fn set_arm_latency(&self, latency: Duration) {
        *self.arm_latency.lock().unwrap_or_else(|p| p.into_inner()) = latency;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(ChannelId, u8), GateRow>> {
        self.rows.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn fenced(
    rows: &mut HashMap<(ChannelId, u8), GateRow>,
    key: (ChannelId, u8),
    fence: i64,
) -> Result<&mut GateRow, GateError> {
    match rows.get_mut(&key) {
        Some(row) if row.fence == fence => Ok(row),
        other => Err(GateError::FenceLost { ours: fence, current: other.map_or(0, |r| r.fence) }),
    }
}

#[async_trait::async_trait]
impl SendGates for FakeSendGates {
    async fn claim(
        &self,
        channel: ChannelId,
        slot: u8,
        holder: &str,
        busy_for: Duration,
    ) -> Result<GateClaim, GateError> {
        let mut rows = self.lock();
        let row = rows.entry((channel, slot)).or_default();
        let now = Instant::now();
        let wait = row.busy_until.map_or(Duration::ZERO, |b| b.saturating_duration_since(now));
        row.fence += 1;
        row.holder = holder.to_owned();
        let until = now + busy_for;
        row.busy_until = Some(row.busy_until.map_or(until, |b| b.max(until)));
        Ok(GateClaim { fence: row.fence, wait })
    }

    async fn arm(&self, channel: ChannelId, slot: u8, fence: i64, busy_for: Duration) -> Result<(), GateError> {
        {
            let mut rows = self.lock();
            let row = fenced(&mut rows, (channel, slot), fence)?;
            let until = Instant::now() + busy_for;
            row.busy_until = Some(row.busy_until.map_or(until, |b| b.max(until)));
        }
        let latency = *self.arm_latency.lock().unwrap_or_else(|p| p.into_inner());
        tokio::time::sleep(latency).await;
        Ok(())
    }

    async fn release(&self, channel: ChannelId, slot: u8, fence: i64) -> Result<(), GateError> {
        fenced(&mut self.lock(), (channel, slot), fence)?.busy_until = None;
        Ok(())
    }
}
