//! The supervision tree's configuration — plain durations and sizes that the
//! `cabine` crate builds from its Settings — and the bundle of ports it drives.

use std::sync::Arc;
use std::time::Duration;

use crate::domain::{ChannelId, PoolSize};
use crate::failover::FailoverConfig;
use crate::outbound::{OutboundConfig, OutboundPorts};
use crate::ports::incident::IncidentLog;
use crate::ports::reconcile::Reconciliation;
use crate::ports::{DictPolicies, IcomConnector, InboundPublisher, InboxStore, LeaseStore, PodRegistry};
use crate::tree::reconciler::ReconcileSchedule;
use crate::watchdog::WatchdogConfig;

/// Everything the tree needs to know, validated by [`TreeConfig::validate`].
#[derive(Clone, Debug)]
pub struct TreeConfig {
    /// This pod's id: the pod part of every grant and its heartbeat key.
    pub pod_id: String,
    /// Build version, shown in the pod's heartbeat.
    pub version: String,
    /// Enabled channels: one Channel supervisor each.
    pub channels: Vec<ChannelId>,
    /// Stream slots per channel: one Slot actor per slot on every pod.
    pub stream_pool: PoolSize,
    pub timing: TreeTiming,
    pub poll_mode: PollMode,
    /// Restart intensity of every supervisor.
    pub restart: RestartPolicy,
    /// The outbound actors (dispatcher, senders, confirmer, janitor); `None`: inbound only.
    pub outbound: Option<OutboundConfig>,
    /// When a failing holder hands its slot over; orphan pickup.
    pub failover: FailoverConfig,
    pub watchdog: WatchdogConfig,
    /// The Reconciler's schedule; `None` (or no reconciler port): no reconciliation.
    pub reconcile: Option<ReconcileSchedule>,
    /// How often the DictSync actor takes the DICT's buckets; `None` (or no dict port): no DictSync.
    pub dict_sync: Option<Duration>,
}

/// Timings (DESIGN §6). The lease length itself lives in the lease store: the
/// actors only read each lease's local validity.
#[derive(Clone, Debug)]
pub struct TreeTiming {
    /// LeaseHeartbeat tick: renews every lease, beats, refreshes the live-pod view.
    pub heartbeat: Duration,
    /// The longest a stream request may take; a request starts only while the
    /// lease is valid for `long_poll_timeout + request_margin`.
    pub long_poll_timeout: Duration,
    pub request_margin: Duration,
    /// The durable gate (DESIGN §2.5): a request leaves within this of the
    /// fenced write that armed it; each write keeps the slot busy for the
    /// request's timeout + this, by Postgres's clock.
    pub gate_margin: Duration,
    /// How often a standby slot (and the leader campaign) tries to acquire.
    pub acquire_interval: Duration,
    /// Long-poll mode: least time between two polls after an empty (204) answer.
    pub empty_poll_floor: Duration,
    /// Errors back off exponentially with full jitter from `backoff_base` up to `backoff_max`.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// Time a draining pod gives its slots to hand over (or close) their streams.
    pub drain_time: Duration,
    /// Whole stop budget of [`crate::tree::Tree::shutdown`] (drain included).
    pub stop_timeout: Duration,
    /// The sweeper republishes rows left unpublished for longer than this...
    pub republish_after: Duration,
    /// ...every `sweep_interval`.
    pub sweep_interval: Duration,
}

impl Default for TreeTiming {
    /// DESIGN §6 defaults.
    fn default() -> Self {
        TreeTiming {
            heartbeat: Duration::from_secs(3),
            long_poll_timeout: Duration::from_secs(8),
            request_margin: Duration::from_millis(100),
            gate_margin: Duration::from_millis(500),
            acquire_interval: Duration::from_secs(1),
            empty_poll_floor: Duration::from_millis(200),
            backoff_base: Duration::from_millis(200),
            backoff_max: Duration::from_secs(30),
            drain_time: Duration::from_secs(5),
            stop_timeout: Duration::from_secs(10),
            republish_after: Duration::from_secs(30),
            sweep_interval: Duration::from_secs(10),
        }
    }
}

/// How a holding slot paces its polls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollMode {
    /// Re-poll at once (the server holds an empty GET ~5 s); at least
    /// `empty_poll_floor` between polls after an immediate 204.
    LongPoll,
    /// Polls aligned to UNIX-time multiples of `cycle`, slot n offset by
    /// `(n − 1) × stagger`; a batch is followed by an immediate poll (its acknowledgement).
    Scheduled { cycle: Duration, stagger: Duration },
}

/// Restart intensity: more than `max_restarts` restarts within `window`
/// makes a supervisor give up and fail to its own supervisor.
#[derive(Clone, Copy, Debug)]
pub struct RestartPolicy {
    pub max_restarts: u32,
    pub window: Duration,
    /// A child's n-th restart in the window waits ~`backoff_base × 2^(n−1)`, capped.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            max_restarts: 5,
            window: Duration::from_secs(60),
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
        }
    }
}

/// A configuration the tree cannot run with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("tree config `{key}`: {rule}")]
pub struct TreeConfigError {
    pub key: &'static str,
    pub rule: &'static str,
}

impl TreeConfig {
    /// Defaults of DESIGN §6 for one pod with the primary channel.
    pub fn new(pod_id: impl Into<String>) -> Self {
        TreeConfig {
            pod_id: pod_id.into(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            channels: vec![ChannelId::Cpm],
            stream_pool: PoolSize::try_from(4).expect("4 is a pool size"),
            timing: TreeTiming::default(),
            poll_mode: PollMode::LongPoll,
            restart: RestartPolicy::default(),
            outbound: None,
            failover: FailoverConfig::default(),
            watchdog: WatchdogConfig::default(),
            reconcile: None,
            dict_sync: None,
        }
    }

    pub fn validate(&self) -> Result<(), TreeConfigError> {
        let t = &self.timing;
        let fail = |key, rule| Err(TreeConfigError { key, rule });
        if self.pod_id.is_empty() {
            return fail("pod_id", "must not be empty");
        }
        let mut channels = self.channels.clone();
        channels.sort();
        channels.dedup();
        if channels.len() != self.channels.len() {
            return fail("channels", "each channel at most once");
        }
        if t.heartbeat.is_zero() || t.acquire_interval.is_zero() || t.sweep_interval.is_zero() {
            return fail("timing", "heartbeat, acquire_interval and sweep_interval must be > 0");
        }
        if t.backoff_base.is_zero() || t.backoff_base > t.backoff_max {
            return fail("timing.backoff_base", "must be > 0 and ≤ backoff_max");
        }
        if t.gate_margin.is_zero() {
            return fail("timing.gate_margin", "must be > 0");
        }
        if t.stop_timeout <= t.drain_time {
            return fail("timing.stop_timeout", "must be > drain_time");
        }
        if let PollMode::Scheduled { cycle, .. } = self.poll_mode
            && cycle.is_zero()
        {
            return fail("poll_mode.cycle", "must be > 0");
        }
        let r = &self.restart;
        if r.max_restarts == 0 || r.window.is_zero() || r.backoff_base > r.backoff_max {
            return fail("restart", "max_restarts ≥ 1, window > 0, backoff_base ≤ backoff_max");
        }
        self.failover.validate(t)?;
        self.watchdog.validate(self)?;
        match &self.outbound {
            Some(outbound) => outbound.validate(),
            None => Ok(()),
        }
    }

    /// The least lease validity a stream request needs before it may start.
    pub fn request_budget(&self) -> Duration {
        self.timing.long_poll_timeout + self.timing.request_margin
    }
}

/// The ports the tree drives, as shared trait objects.
#[derive(Clone)]
pub struct Ports {
    pub leases: Arc<dyn LeaseStore>,
    pub pods: Arc<dyn PodRegistry>,
    pub inbox: Arc<dyn InboxStore>,
    pub icom: Arc<dyn IcomConnector>,
    pub publisher: Arc<dyn InboundPublisher>,
    /// Needed when [`TreeConfig::outbound`] is set.
    pub outbound: Option<OutboundPorts>,
    /// Needed when [`TreeConfig::reconcile`] is set.
    pub reconciler: Option<Arc<dyn Reconciliation>>,
    /// Failovers and quarantines, for the incident report.
    pub incidents: Arc<dyn IncidentLog>,
    /// Needed when [`TreeConfig::dict_sync`] is set.
    pub dict: Option<Arc<dyn DictPolicies>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_broken_values_name_their_key() {
        assert_eq!(TreeConfig::new("pod-a").validate(), Ok(()));
        let mut c = TreeConfig::new("pod-a");
        c.channels = vec![ChannelId::Cpm, ChannelId::Cpm];
        assert_eq!(c.validate().unwrap_err().key, "channels");
        let mut c = TreeConfig::new("pod-a");
        c.timing.stop_timeout = c.timing.drain_time;
        assert_eq!(c.validate().unwrap_err().key, "timing.stop_timeout");
        let mut c = TreeConfig::new("");
        c.poll_mode = PollMode::Scheduled { cycle: Duration::ZERO, stagger: Duration::ZERO };
        assert_eq!(c.validate().unwrap_err().key, "pod_id");
    }
}
