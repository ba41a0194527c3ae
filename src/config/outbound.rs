//! `[outbound]`: ingress from the bus, back-pressure, deadlines, the rate
//! bucket mirroring the Central Bank's and the shared circuit breaker — and
//! the boot checks that name the key at fault.

use std::collections::BTreeMap;
use std::time::Duration;

use cabine_actors::OutboundConfig;
use cabine_actors::ports::outbound::BatchSize;
use cabine_actors::ports::ratelimit::CostTable;
use serde::{Deserialize, Serialize};

use super::{ChannelId, ConfigError, PoolSize, Settings};

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboundSettings {
    /// Run the outbound actors on this pod (false: an inbound-only pod).
    pub enabled: bool,
    /// Durable pull consumer shared by every pod on the outbound work-queue stream.
    pub consumer: String,
    /// Requests per pull.
    pub pull_batch: usize,
    #[serde(with = "humantime_serde")]
    pub pull_wait: Duration,
    /// JetStream redelivers a request not acknowledged (not stored) within this.
    #[serde(with = "humantime_serde")]
    pub ack_wait: Duration,
    /// A request delivered more often than this without being stored is parked
    /// (kept raw in `outbound_parked`, acknowledged) instead of tried again.
    pub max_deliver: u32,
    /// Back-pressure: above this many queued rows the dispatcher stops pulling.
    pub max_queued: u64,
    /// Messages per POST (ICOM: at most 10).
    pub batch_size: usize,
    pub max_message_bytes: usize,
    /// How long a 429 without `Retry-After` waits.
    #[serde(with = "humantime_serde")]
    pub retry_after_default: Duration,
    /// A `sent` message without pacs.002/admi.002 after this is flagged.
    #[serde(with = "humantime_serde")]
    pub unconfirmed_after: Duration,
    /// Sender slots per enabled channel on each pod (each with its own send lease and connection).
    pub senders_per_channel: PoolSize,
    /// A sender gives its send lease back after this long without work...
    #[serde(with = "humantime_serde")]
    pub idle_release: Duration,
    /// ...looking for ready rows this often meanwhile.
    #[serde(with = "humantime_serde")]
    pub idle_poll: Duration,
    /// Queue depth, breaker and bucket are read this often (status, metrics, back-pressure).
    #[serde(with = "humantime_serde")]
    pub status_interval: Duration,
    /// An empty bucket refilling within this is waited for with the batch in hand.
    #[serde(with = "humantime_serde")]
    pub bucket_wait_max: Duration,
    /// The leader's janitor (expiry, stale claims, unconfirmed, republish) runs this often...
    #[serde(with = "humantime_serde")]
    pub janitor_interval: Duration,
    /// ...each step on at most this many rows.
    pub janitor_batch: u32,
    /// The confirmer runs after every commit of status reports, and at least this often...
    #[serde(with = "humantime_serde")]
    pub confirm_interval: Duration,
    /// ...correlating at most this many inbox rows per pass.
    pub confirm_batch: u32,
    pub deadlines: DeadlineSettings,
    pub bucket: BucketSettings,
    pub breaker: BreakerSettings,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadlineSettings {
    #[serde(with = "humantime_serde")]
    pub standard: Duration,
    #[serde(with = "humantime_serde")]
    pub saque_troco: Duration,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BucketSettings {
    /// Brasília is UTC−3 (no daylight saving since 2019): -180.
    pub utc_offset_minutes: i32,
    /// Local `HH:MM` window of the night schedule (`night_*` keys), `from` included, `until` excluded.
    pub night_from: String,
    pub night_until: String,
    /// A draw leaves this much refill in hand: the margin for POSTs that reach the
    /// SPI after their draw (the SPI's full bucket loses refill meanwhile).
    #[serde(with = "humantime_serde")]
    pub reserve: Duration,
    pub cost_pacs008_milli: u64,
    pub cost_pacs002_milli: u64,
    pub cost_other_milli: u64,
    pub channels: BTreeMap<ChannelId, BucketChannelSettings>,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BucketChannelSettings {
    /// Tokens.
    pub capacity: u64,
    /// Tokens per second.
    pub refill_per_s: u64,
    pub night_capacity: u64,
    pub night_refill_per_s: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerSettings {
    /// Sliding window of the failure and slow-call rates, in `window_buckets` slices.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    pub window_buckets: u32,
    /// OPEN when failures ≥ `open_failure_rate` % of ≥ `min_calls` calls in the window...
    pub min_calls: u32,
    pub open_failure_rate: u32,
    /// ...or after this many failures in a row.
    pub consecutive_failures: u32,
    /// DEGRADED when, over ≥ `degraded_min_calls`, failures ≥ `degraded_failure_rate` %
    /// or slow calls ≥ `degraded_slow_rate` %.
    pub degraded_min_calls: u32,
    pub degraded_failure_rate: u32,
    pub degraded_slow_rate: u32,
    /// A successful call slower than this counts as slow.
    #[serde(with = "humantime_serde")]
    pub slow_call: Duration,
    /// OPEN lasts this long, then the next admit half-opens it.
    #[serde(with = "humantime_serde")]
    pub break_time: Duration,
    /// Probes admitted at once while HALF_OPEN.
    pub probes: u32,
    /// A probe admission expires after this (a probe that never reports cannot wedge HALF_OPEN).
    #[serde(with = "humantime_serde")]
    pub probe_timeout: Duration,
}

/// Minutes after midnight of a `HH:MM` string.
pub fn minutes_of_day(hhmm: &str) -> Option<u32> {
    let (h, m) = hhmm.split_once(':')?;
    let (h, m): (u32, u32) = (h.parse().ok()?, m.parse().ok()?);
    (h < 24 && m < 60 && hhmm.len() == 5).then_some(h * 60 + m)
}

fn fail(key: &str, rule: impl Into<String>) -> Result<(), ConfigError> {
    Err(ConfigError::invalid(key, rule))
}

/// The `[outbound]` boot checks.
pub fn check_outbound(s: &Settings) -> Result<(), ConfigError> {
    check_ingress(s)?;
    check_bucket(s)?;
    check_breaker(s)
}

fn check_ingress(s: &Settings) -> Result<(), ConfigError> {
    let o = &s.outbound;
    if o.consumer.is_empty() || !o.consumer.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return fail("outbound.consumer", "a JetStream consumer name: [A-Za-z0-9_-]+");
    }
    if !(1..=1000).contains(&o.pull_batch) {
        return fail("outbound.pull_batch", format!("must be in 1..=1000, got {}", o.pull_batch));
    }
    if !(1..=1000).contains(&o.max_deliver) {
        return fail("outbound.max_deliver", format!("must be in 1..=1000, got {}", o.max_deliver));
    }
    if o.pull_wait.is_zero() || o.pull_wait >= o.ack_wait {
        return fail("outbound.pull_wait, outbound.ack_wait", "0 < pull_wait < ack_wait");
    }
    if o.ack_wait <= s.postgres.wait_timeout * 2 {
        return fail(
            "outbound.ack_wait, postgres.wait_timeout",
            "ack_wait must exceed 2 x postgres.wait_timeout (a request is stored before it is acknowledged)",
        );
    }
    if o.max_queued == 0 {
        return fail("outbound.max_queued", "must be at least 1");
    }
    if !(1..=10).contains(&o.batch_size) {
        return fail("outbound.batch_size", format!("must be in 1..=10 (ICOM's batch), got {}", o.batch_size));
    }
    if o.max_message_bytes == 0 {
        return fail("outbound.max_message_bytes", "must be greater than zero");
    }
    check_actors(o)?;
    let durations = [
        ("outbound.retry_after_default", o.retry_after_default),
        ("outbound.unconfirmed_after", o.unconfirmed_after),
        ("outbound.deadlines.standard", o.deadlines.standard),
        ("outbound.deadlines.saque_troco", o.deadlines.saque_troco),
    ];
    for (key, d) in durations {
        if d.is_zero() {
            return fail(key, "must be greater than zero");
        }
    }
    Ok(())
}

fn check_actors(o: &OutboundSettings) -> Result<(), ConfigError> {
    let durations = [
        ("outbound.idle_release", o.idle_release),
        ("outbound.idle_poll", o.idle_poll),
        ("outbound.status_interval", o.status_interval),
        ("outbound.janitor_interval", o.janitor_interval),
        ("outbound.confirm_interval", o.confirm_interval),
    ];
    for (key, d) in durations {
        if d.is_zero() {
            return fail(key, "must be greater than zero");
        }
    }
    if o.idle_poll > o.idle_release {
        return fail("outbound.idle_poll, outbound.idle_release", "idle_poll must be <= idle_release");
    }
    for (key, n) in [("outbound.janitor_batch", o.janitor_batch), ("outbound.confirm_batch", o.confirm_batch)] {
        if !(1..=10_000).contains(&n) {
            return fail(key, format!("must be in 1..=10000, got {n}"));
        }
    }
    Ok(())
}

impl Settings {
    /// The outbound actors' configuration (`[outbound]`, `[timing]`, `icom.limits`).
    pub fn outbound_actors(&self) -> OutboundConfig {
        let o = &self.outbound;
        let batch_size = BatchSize::new(o.batch_size).unwrap_or(BatchSize::MAX);
        // Room for the multipart framing (delimiters and part headers) of a whole batch.
        let framing = batch_size.get() * 256 + 1024;
        OutboundConfig {
            senders_per_channel: o.senders_per_channel,
            batch_size,
            max_batch_bytes: self.icom.limits.max_body_bytes.saturating_sub(framing).max(1),
            pull_batch: o.pull_batch,
            pull_wait: o.pull_wait,
            max_deliver: o.max_deliver,
            max_queued: o.max_queued,
            status_interval: o.status_interval,
            costs: CostTable {
                pacs008_milli: o.bucket.cost_pacs008_milli,
                pacs002_milli: o.bucket.cost_pacs002_milli,
                other_milli: o.bucket.cost_other_milli,
            },
            send_timeout: self.timing.send_timeout,
            slow_call: o.breaker.slow_call,
            idle_release: o.idle_release,
            idle_poll: o.idle_poll,
            bucket_wait_max: o.bucket_wait_max,
            retry_after_default: o.retry_after_default,
            // Gives up recording before the claim could be recovered (and the message resent).
            record_patience: self.timing.processing_timeout / 2,
            janitor_interval: o.janitor_interval,
            janitor_batch: o.janitor_batch,
            confirm_interval: o.confirm_interval,
            confirm_batch: o.confirm_batch,
        }
    }
}

fn check_bucket(s: &Settings) -> Result<(), ConfigError> {
    let b = &s.outbound.bucket;
    if !(-720..=840).contains(&b.utc_offset_minutes) {
        return fail("outbound.bucket.utc_offset_minutes", "must be in -720..=840");
    }
    for (key, v) in [("outbound.bucket.night_from", &b.night_from), ("outbound.bucket.night_until", &b.night_until)] {
        if minutes_of_day(v).is_none() {
            return fail(key, format!("a local time HH:MM, got {v:?}"));
        }
    }
    let costs = [b.cost_pacs008_milli, b.cost_pacs002_milli, b.cost_other_milli];
    if costs.contains(&0) {
        return fail("outbound.bucket.cost_pacs008_milli, cost_pacs002_milli, cost_other_milli", "must be > 0");
    }
    let batch_cost = costs.iter().max().copied().unwrap_or(0) * s.outbound.batch_size as u64;
    for (id, _) in s.enabled_channels() {
        let key = |k: &str| format!("outbound.bucket.channels.{id}.{k}");
        let Some(c) = b.channels.get(&id) else {
            return fail(&format!("outbound.bucket.channels.{id}"), "an enabled channel needs its bucket");
        };
        for (k, v) in [("refill_per_s", c.refill_per_s), ("night_refill_per_s", c.night_refill_per_s)] {
            if v == 0 {
                return fail(&key(k), "must be greater than zero");
            }
        }
        let reserve_ms = u64::try_from(b.reserve.as_millis()).unwrap_or(u64::MAX);
        for (k, cap, refill) in
            [("capacity", c.capacity, c.refill_per_s), ("night_capacity", c.night_capacity, c.night_refill_per_s)]
        {
            let need = batch_cost.saturating_add(refill.saturating_mul(reserve_ms));
            if cap * 1000 < need {
                return fail(
                    &key(k),
                    format!("must hold a whole batch plus the reserve (outbound.bucket.reserve): {need} milli-tokens"),
                );
            }
        }
    }
    Ok(())
}

fn check_breaker(s: &Settings) -> Result<(), ConfigError> {
    let b = &s.outbound.breaker;
    let k = |name: &str| format!("outbound.breaker.{name}");
    if !(1..=60).contains(&b.window_buckets) || b.window < Duration::from_millis(u64::from(b.window_buckets)) {
        return fail(&k("window_buckets"), "must be in 1..=60 and at most window in milliseconds");
    }
    for (name, v) in [("min_calls", b.min_calls), ("consecutive_failures", b.consecutive_failures)] {
        if v == 0 {
            return fail(&k(name), "must be at least 1");
        }
    }
    for (name, v) in [
        ("open_failure_rate", b.open_failure_rate),
        ("degraded_failure_rate", b.degraded_failure_rate),
        ("degraded_slow_rate", b.degraded_slow_rate),
    ] {
        if !(1..=100).contains(&v) {
            return fail(&k(name), format!("a percentage in 1..=100, got {v}"));
        }
    }
    if b.degraded_failure_rate >= b.open_failure_rate {
        return fail("outbound.breaker.degraded_failure_rate, outbound.breaker.open_failure_rate", "degraded < open");
    }
    if b.degraded_min_calls == 0 || b.degraded_min_calls > b.min_calls {
        return fail(&k("degraded_min_calls"), "must be in 1..=min_calls");
    }
    for (name, d) in [("slow_call", b.slow_call), ("break_time", b.break_time)] {
        if d.is_zero() {
            return fail(&k(name), "must be greater than zero");
        }
    }
    if !(1..=6).contains(&b.probes) {
        return fail(&k("probes"), "must be in 1..=6");
    }
    if b.probe_timeout < s.timing.send_timeout {
        return fail(
            "outbound.breaker.probe_timeout, timing.send_timeout",
            "probe_timeout must be >= send_timeout (a probe admission outlives the probe)",
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_times_are_hh_mm() {
        assert_eq!(minutes_of_day("00:00"), Some(0));
        assert_eq!(minutes_of_day("08:00"), Some(480));
        assert_eq!(minutes_of_day("23:59"), Some(1439));
        for bad in ["24:00", "8:00", "08:60", "0800", "", "ab:cd"] {
            assert_eq!(minutes_of_day(bad), None, "{bad}");
        }
    }
}

#[cfg(test)]
mod load_tests {
    use std::collections::HashMap;

    use super::super::DEFAULT_TOML;
    use super::*;

    fn violation(env: &[(&str, &str)]) -> String {
        let env: HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        match Settings::from_sources(DEFAULT_TOML, None, &env) {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("expected a violation for {env:?}, got {other:?}"),
        }
    }

    #[test]
    fn defaults_mirror_the_central_bank() {
        let s = Settings::from_sources(DEFAULT_TOML, None, &HashMap::new()).unwrap();
        let cpm = s.outbound.bucket.channels[&ChannelId::Cpm];
        assert_eq!((cpm.capacity, cpm.refill_per_s), (3750, 750));
        let csm = s.outbound.bucket.channels[&ChannelId::Csm];
        assert_eq!((csm.capacity, csm.refill_per_s, csm.night_capacity, csm.night_refill_per_s), (350, 35, 5000, 350));
        assert_eq!(s.outbound.breaker.min_calls, 20);
        assert_eq!(s.outbound.breaker.break_time, Duration::from_secs(30));
        let actors = s.outbound_actors();
        assert_eq!(actors.validate(), Ok(()));
        assert_eq!((actors.senders_per_channel.get(), actors.batch_size.get()), (2, 10));
        assert!(actors.max_batch_bytes < s.icom.limits.max_body_bytes);
    }

    #[test]
    fn outbound_violations_name_their_keys() {
        assert_eq!(violation(&[("CABINE__OUTBOUND__BATCH_SIZE", "11")]), "outbound.batch_size");
        assert_eq!(violation(&[("CABINE__OUTBOUND__BUCKET__NIGHT_FROM", "25:00")]), "outbound.bucket.night_from");
        assert_eq!(
            violation(&[("CABINE__OUTBOUND__BUCKET__CHANNELS__CPM__REFILL_PER_S", "0")]),
            "outbound.bucket.channels.cpm.refill_per_s"
        );
        assert_eq!(
            violation(&[("CABINE__OUTBOUND__BUCKET__CHANNELS__CPM__CAPACITY", "5")]),
            "outbound.bucket.channels.cpm.capacity"
        );
        assert_eq!(
            violation(&[("CABINE__OUTBOUND__BREAKER__OPEN_FAILURE_RATE", "101")]),
            "outbound.breaker.open_failure_rate"
        );
        assert!(
            violation(&[("CABINE__OUTBOUND__BREAKER__DEGRADED_FAILURE_RATE", "60")]).contains("degraded_failure_rate")
        );
        assert!(violation(&[("CABINE__OUTBOUND__BREAKER__PROBE_TIMEOUT", "1s")]).contains("probe_timeout"));
        assert_eq!(violation(&[("CABINE__OUTBOUND__BREAKER__PROBES", "0")]), "outbound.breaker.probes");
        assert_eq!(violation(&[("CABINE__OUTBOUND__BREAKER__SLOW_CALL", "0s")]), "outbound.breaker.slow_call");
        assert_eq!(
            violation(&[("CABINE__OUTBOUND__BREAKER__CONSECUTIVE_FAILURES", "0")]),
            "outbound.breaker.consecutive_failures"
        );
        assert!(violation(&[("CABINE__OUTBOUND__ACK_WAIT", "2s")]).contains("outbound.ack_wait"));
        assert_eq!(violation(&[("CABINE__OUTBOUND__DEADLINES__SAQUE_TROCO", "0s")]), "outbound.deadlines.saque_troco");
        assert_eq!(violation(&[("CABINE__OUTBOUND__SENDERS_PER_CHANNEL", "7")]), "outbound.senders_per_channel");
        assert!(violation(&[("CABINE__OUTBOUND__IDLE_POLL", "5s")]).contains("outbound.idle_poll"));
        assert_eq!(violation(&[("CABINE__OUTBOUND__CONFIRM_BATCH", "0")]), "outbound.confirm_batch");
    }
}
