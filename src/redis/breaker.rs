//! The Redis [`CircuitBreaker`]: one breaker per (ispb, channel) shared by
//! every pod, one Lua call per admit/record (`scripts/breaker.lua`), times from
//! Redis `TIME`. OPEN half-opens lazily at the first admit after the break;
//! probe admissions expire, so a probe that never reports cannot wedge it.
//! Unreachable Redis → `Unavailable`: the caller sends nothing (fail closed).

use std::sync::Arc;
use std::time::Duration;

use cabine_actors::ports::breaker::{
    Admission, BreakerError, BreakerState, BreakerView, Call, CallOutcome, CircuitBreaker,
};
use cabine_actors::ports::incident::{Incident, IncidentKind, IncidentLog};
use fred::prelude::*;

use super::guard::{GuardKeys, GuardScript, ScriptClock, ScriptFailure};
use crate::config::{BreakerSettings, ChannelId};

const BREAKER_LUA: &str = include_str!("scripts/breaker.lua");

pub struct RedisBreaker {
    client: Client,
    keys: GuardKeys,
    clock: ScriptClock,
    settings: BreakerSettings,
    script: GuardScript,
    /// Where an opening is recorded for the incident report (the pod's log).
    incidents: Option<Arc<dyn IncidentLog>>,
}

/// The script's reply.
struct Reply {
    state: BreakerState,
    generation: u64,
    flag: bool,
    retry: Duration,
    probe: bool,
    view: [u64; 5],
}

impl Reply {
    fn parse(r: &[i64]) -> Result<Reply, BreakerError> {
        let [state, generation, flag, retry, probe, calls, failures, slow, consec, probes] = r else {
            return Err(BreakerError::Fatal(format!("breaker reply has {} fields, want 10", r.len())));
        };
        let state = match state {
            0 => BreakerState::Closed,
            1 => BreakerState::Degraded,
            2 => BreakerState::Open,
            3 => BreakerState::HalfOpen,
            other => return Err(BreakerError::Fatal(format!("breaker state code {other}"))),
        };
        let n = |v: &i64| u64::try_from(*v).unwrap_or(0);
        Ok(Reply {
            state,
            generation: n(generation),
            flag: *flag == 1,
            retry: Duration::from_millis(n(retry)),
            probe: *probe == 1,
            view: [n(calls), n(failures), n(slow), n(consec), n(probes)],
        })
    }
}

impl RedisBreaker {
    pub fn new(client: Client, keys: GuardKeys, settings: &BreakerSettings, clock: ScriptClock) -> Self {
        let script = GuardScript::new(BREAKER_LUA);
        RedisBreaker { client, keys, clock, settings: settings.clone(), script, incidents: None }
    }

    /// Records each opening this pod's calls cause in `log`.
    pub fn with_incidents(mut self, log: Arc<dyn IncidentLog>) -> Self {
        self.incidents = Some(log);
        self
    }

    async fn call(
        &self,
        channel: ChannelId,
        op: &str,
        call: Option<&Call>,
        extra: [&str; 2],
    ) -> Result<Reply, BreakerError> {
        let s = &self.settings;
        let ms = |d: Duration| Value::from(d.as_millis() as i64);
        let mut args = vec![
            Value::from(op),
            Value::from(self.clock.arg() as i64),
            ms(s.window),
            Value::from(i64::from(s.window_buckets)),
            Value::from(i64::from(s.min_calls)),
            Value::from(i64::from(s.open_failure_rate)),
            Value::from(i64::from(s.consecutive_failures)),
            Value::from(i64::from(s.degraded_min_calls)),
            Value::from(i64::from(s.degraded_failure_rate)),
            Value::from(i64::from(s.degraded_slow_rate)),
            ms(s.break_time),
            Value::from(i64::from(s.probes)),
            ms(s.probe_timeout),
            Value::from(call.map_or(0, |c| c.generation as i64)),
        ];
        args.extend(extra.map(Value::from));
        let keys = vec![self.keys.of(channel, "breaker"), self.keys.of(channel, "breaker:probes")];
        let r = self.script.run(&self.client, keys, args).await.map_err(|f| match f {
            ScriptFailure::Transient(e) => BreakerError::Unavailable(e),
            ScriptFailure::Fatal(e) => BreakerError::Fatal(e),
        })?;
        let reply = Reply::parse(&r)?;
        metrics::gauge!("cabine_outbound_breaker_state", "channel" => channel.as_str()).set(state_code(reply.state));
        Ok(reply)
    }
}

fn state_code(s: BreakerState) -> f64 {
    match s {
        BreakerState::Closed => 0.0,
        BreakerState::Degraded => 1.0,
        BreakerState::Open => 2.0,
        BreakerState::HalfOpen => 3.0,
    }
}

fn probe_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

fn outcome_arg(o: CallOutcome) -> &'static str {
    match o {
        CallOutcome::Success => "success",
        CallOutcome::Failure => "failure",
        CallOutcome::Slow => "slow",
        CallOutcome::Ignored => "ignored",
    }
}

fn transition(channel: ChannelId, to: BreakerState) {
    tracing::warn!(%channel, state = to.as_str(), "circuit breaker changed state");
    metrics::counter!("cabine_outbound_breaker_transitions_total", "channel" => channel.as_str(), "to" => to.as_str())
        .increment(1);
}

#[async_trait::async_trait]
impl CircuitBreaker for RedisBreaker {
    async fn admit(&self, channel: ChannelId) -> Result<Admission, BreakerError> {
        let id = probe_id();
        let r = self.call(channel, "admit", None, [&id, ""]).await?;
        if !r.flag {
            return Ok(Admission::Refused { state: r.state, retry_after: r.retry });
        }
        Ok(Admission::Admit(Call { generation: r.generation, probe: r.probe.then_some(id) }))
    }

    async fn record(
        &self,
        channel: ChannelId,
        call: &Call,
        outcome: CallOutcome,
    ) -> Result<BreakerState, BreakerError> {
        let probe = call.probe.as_deref().unwrap_or("");
        let r = self.call(channel, "record", Some(call), [probe, outcome_arg(outcome)]).await?;
        if r.flag {
            transition(channel, r.state);
            if let (BreakerState::Open, Some(log)) = (r.state, &self.incidents) {
                log.record(Incident {
                    kind: IncidentKind::BreakerOpened,
                    channel: Some(channel),
                    slot: None,
                    detail: format!("opened after a {} call", outcome_arg(outcome)),
                });
            }
        }
        Ok(r.state)
    }

    async fn state(&self, channel: ChannelId) -> Result<BreakerView, BreakerError> {
        let r = self.call(channel, "peek", None, ["", ""]).await?;
        let [calls, failures, slow, consecutive_failures, probes_in_flight] = r.view;
        Ok(BreakerView {
            state: r.state,
            generation: r.generation,
            calls,
            failures,
            slow,
            consecutive_failures,
            probes_in_flight,
            retry_after: (r.state == BreakerState::Open).then_some(r.retry),
        })
    }

    async fn reset(&self, channel: ChannelId) -> Result<(), BreakerError> {
        self.call(channel, "reset", None, ["", ""]).await?;
        transition(channel, BreakerState::Closed);
        Ok(())
    }
}
