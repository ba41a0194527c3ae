//! In-memory rate bucket with the Lua script's arithmetic: milli-tokens, lazy
//! refill of `refill_per_s` milli-tokens per millisecond since the last draw,
//! capped at the capacity; a draw takes the whole cost or nothing and says how
//! long the refill of the missing part takes. Time follows tokio's clock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::domain::ChannelId;
use crate::ports::ratelimit::{BucketError, BucketLevel, Cost, Draw, RateBucket};

#[derive(Clone, Copy, Debug)]
pub struct FakeBucketSettings {
    pub capacity_milli: u64,
    /// Tokens per second (= milli-tokens per millisecond).
    pub refill_per_s: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BucketAudit {
    pub taken: u64,
    pub waits: u64,
    pub drawn_milli: u64,
}

struct Level {
    tokens: u64,
    at: Instant,
}

pub struct FakeBucket {
    settings: FakeBucketSettings,
    levels: Mutex<HashMap<ChannelId, Level>>,
    audit: Mutex<BucketAudit>,
    down: AtomicBool,
}

impl FakeBucket {
    pub fn new(settings: FakeBucketSettings) -> Arc<Self> {
        Arc::new(FakeBucket {
            settings,
            levels: Mutex::default(),
            audit: Mutex::default(),
            down: AtomicBool::new(false),
        })
    }

    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    pub fn audit(&self) -> BucketAudit {
        *self.audit.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Refills `channel`'s level up to now (whole milliseconds) and runs `f` on it.
    fn with_level<T>(&self, channel: ChannelId, f: impl FnOnce(&mut Level) -> T) -> T {
        let (cap, rate) = (self.settings.capacity_milli, self.settings.refill_per_s);
        let now = Instant::now();
        let mut levels = self.levels.lock().unwrap_or_else(|p| p.into_inner());
        let level = levels.entry(channel).or_insert(Level { tokens: cap, at: now });
        let ms = now.saturating_duration_since(level.at).as_millis() as u64;
        level.tokens = (level.tokens + ms * rate).min(cap);
        level.at += Duration::from_millis(ms);
        f(level)
    }

    fn check(&self) -> Result<(), BucketError> {
        if self.down.load(Ordering::SeqCst) { Err(BucketError::Unavailable("fake bucket down".into())) } else { Ok(()) }
    }
}

#[async_trait::async_trait]
impl RateBucket for FakeBucket {
    async fn try_take(&self, channel: ChannelId, cost: Cost) -> Result<Draw, BucketError> {
        self.check()?;
        let (cap, rate) = (self.settings.capacity_milli, self.settings.refill_per_s.max(1));
        if cost.0 > cap {
            return Err(BucketError::TooCostly { cost: cost.0, capacity: cap });
        }
        let draw = self.with_level(channel, |level| {
            if level.tokens < cost.0 {
                let wait = (cost.0 - level.tokens).div_ceil(rate);
                return Draw::Wait { retry_after: Duration::from_millis(wait.max(1)) };
            }
            level.tokens -= cost.0;
            Draw::Taken { left: level.tokens }
        });
        let mut audit = self.audit.lock().unwrap_or_else(|p| p.into_inner());
        match draw {
            Draw::Taken { .. } => {
                audit.taken += 1;
                audit.drawn_milli += cost.0;
            }
            Draw::Wait { .. } => audit.waits += 1,
        }
        Ok(draw)
    }

    async fn level(&self, channel: ChannelId) -> Result<BucketLevel, BucketError> {
        self.check()?;
        let tokens = self.with_level(channel, |level| level.tokens);
        let s = self.settings;
        Ok(BucketLevel {
            tokens_milli: tokens,
            capacity_milli: s.capacity_milli,
            refill_per_s: s.refill_per_s,
            night: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn draws_wait_for_exactly_the_missing_refill() {
        let bucket = FakeBucket::new(FakeBucketSettings { capacity_milli: 3_000, refill_per_s: 2 });
        let ch = ChannelId::Cpm;
        assert_eq!(bucket.try_take(ch, Cost(2_500)).await.unwrap(), Draw::Taken { left: 500 });
        assert_eq!(
            bucket.try_take(ch, Cost(1_000)).await.unwrap(),
            Draw::Wait { retry_after: Duration::from_millis(250) }
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(bucket.try_take(ch, Cost(1_000)).await.unwrap(), Draw::Taken { left: 0 });
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(bucket.level(ch).await.unwrap().tokens_milli, 3_000, "capped at the capacity");
        assert!(matches!(bucket.try_take(ch, Cost(3_001)).await, Err(BucketError::TooCostly { .. })));
    }
}
