//! The Redis [`RateBucket`]: the Central Bank's token bucket per (ispb,
//! channel), one Lua call per draw (`scripts/bucket.lua`), refilled lazily from
//! Redis `TIME`, with the secondary channel's day/night schedule. Unreachable
//! Redis → `Unavailable`: the caller draws nothing and its rows wait.

use std::collections::BTreeMap;
use std::time::Duration;

use cabine_actors::ports::ratelimit::{BucketError, BucketLevel, Cost, CostTable, Draw, RateBucket};
use fred::prelude::*;

use super::guard::{GuardKeys, GuardScript, ScriptClock, ScriptFailure};
use crate::config::{BucketChannelSettings, BucketSettings, ChannelId, minutes_of_day};

const BUCKET_LUA: &str = include_str!("scripts/bucket.lua");

/// The shared token buckets of the configured channels.
pub struct RedisBucket {
    client: Client,
    keys: GuardKeys,
    clock: ScriptClock,
    schedule: Schedule,
    channels: BTreeMap<ChannelId, BucketChannelSettings>,
    /// Refill of this long is kept in hand (`outbound.bucket.reserve`).
    reserve_ms: i64,
    script: GuardScript,
}

/// The night window and UTC offset, as the script takes them.
#[derive(Clone, Copy, Debug)]
struct Schedule {
    night_from: u32,
    night_until: u32,
    utc_offset_minutes: i32,
}

impl RedisBucket {
    /// `settings` was validated at boot (HH:MM times, non-zero refills).
    pub fn new(client: Client, keys: GuardKeys, settings: &BucketSettings, clock: ScriptClock) -> Self {
        let schedule = Schedule {
            night_from: minutes_of_day(&settings.night_from).unwrap_or(0),
            night_until: minutes_of_day(&settings.night_until).unwrap_or(0),
            utc_offset_minutes: settings.utc_offset_minutes,
        };
        RedisBucket {
            client,
            keys,
            clock,
            schedule,
            channels: settings.channels.clone(),
            reserve_ms: i64::try_from(settings.reserve.as_millis()).unwrap_or(i64::MAX),
            script: GuardScript::new(BUCKET_LUA),
        }
    }

    /// The cost table of these settings.
    pub fn costs(settings: &BucketSettings) -> CostTable {
        CostTable {
            pacs008_milli: settings.cost_pacs008_milli,
            pacs002_milli: settings.cost_pacs002_milli,
            other_milli: settings.cost_other_milli,
        }
    }

    async fn call(&self, channel: ChannelId, cost: Cost, mode: &str) -> Result<Reply, BucketError> {
        let c = self.channels.get(&channel).ok_or_else(|| BucketError::Fatal(format!("no bucket for {channel}")))?;
        let args: Vec<Value> = vec![
            Value::from(cost.0 as i64),
            Value::from(mode),
            Value::from(self.clock.arg() as i64),
            Value::from((c.capacity * 1000) as i64),
            Value::from(c.refill_per_s as i64),
            Value::from((c.night_capacity * 1000) as i64),
            Value::from(c.night_refill_per_s as i64),
            Value::from(i64::from(self.schedule.night_from)),
            Value::from(i64::from(self.schedule.night_until)),
            Value::from(i64::from(self.schedule.utc_offset_minutes)),
            Value::from(self.reserve_ms),
        ];
        let keys = vec![self.keys.of(channel, "bucket")];
        let r = self.script.run(&self.client, keys, args).await.map_err(|f| match f {
            ScriptFailure::Transient(e) => BucketError::Unavailable(e),
            ScriptFailure::Fatal(e) => BucketError::Fatal(e),
        })?;
        Reply::parse(&r)
    }
}

/// The script's reply: {granted, tokens, wait_ms, capacity, refill, night}.
struct Reply {
    granted: i64,
    level: BucketLevel,
    wait_ms: u64,
}

impl Reply {
    fn parse(r: &[i64]) -> Result<Reply, BucketError> {
        let [granted, tokens, wait, cap, rate, night] = r else {
            return Err(BucketError::Fatal(format!("bucket reply has {} fields, want 6", r.len())));
        };
        let n = |v: &i64| u64::try_from(*v).unwrap_or(0);
        let level =
            BucketLevel { tokens_milli: n(tokens), capacity_milli: n(cap), refill_per_s: n(rate), night: *night == 1 };
        Ok(Reply { granted: *granted, level, wait_ms: n(wait) })
    }
}

#[async_trait::async_trait]
impl RateBucket for RedisBucket {
    async fn try_take(&self, channel: ChannelId, cost: Cost) -> Result<Draw, BucketError> {
        let reply = self.call(channel, cost, "take").await.inspect_err(|e| {
            metrics::counter!("cabine_outbound_bucket_errors_total", "channel" => channel.as_str(), "kind" => kind(e))
                .increment(1);
        })?;
        metrics::gauge!("cabine_outbound_bucket_tokens", "channel" => channel.as_str())
            .set(reply.level.tokens_milli as f64 / 1000.0);
        match reply.granted {
            1 => Ok(Draw::Taken { left: reply.level.tokens_milli }),
            0 => {
                metrics::counter!("cabine_outbound_bucket_waits_total", "channel" => channel.as_str()).increment(1);
                Ok(Draw::Wait { retry_after: Duration::from_millis(reply.wait_ms.max(1)) })
            }
            _ => Err(BucketError::TooCostly { cost: cost.0, capacity: reply.level.capacity_milli }),
        }
    }

    async fn level(&self, channel: ChannelId) -> Result<BucketLevel, BucketError> {
        Ok(self.call(channel, Cost(0), "peek").await?.level)
    }
}

fn kind(e: &BucketError) -> &'static str {
    match e {
        BucketError::Unavailable(_) => "unavailable",
        BucketError::TooCostly { .. } => "too_costly",
        BucketError::Fatal(_) => "fatal",
    }
}
