//! In-memory circuit breaker with the Lua script's state machine: a sliding
//! window of `window_buckets` slices; OPEN on a failure rate over `min_calls`
//! calls or `consecutive_failures` in a row; DEGRADED on elevated failure or
//! slow rates; OPEN turns HALF_OPEN at the first admit after `break_time`,
//! which admits `probes` probes whose admissions expire after `probe_timeout`;
//! a probe's success closes, its failure re-opens; every open and close starts
//! a new generation and outcomes of older calls are ignored. Shared by pods.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::domain::ChannelId;
use crate::ports::breaker::{Admission, BreakerError, BreakerState, BreakerView, Call, CallOutcome, CircuitBreaker};

#[derive(Clone, Debug)]
pub struct FakeBreakerSettings {
    pub window: Duration,
    pub window_buckets: u64,
    pub min_calls: u64,
    pub open_failure_rate: u64,
    pub consecutive_failures: u64,
    pub degraded_min_calls: u64,
    pub degraded_failure_rate: u64,
    pub degraded_slow_rate: u64,
    pub break_time: Duration,
    pub probes: usize,
    pub probe_timeout: Duration,
}

/// Per channel: what happened, for assertions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BreakerAudit {
    pub opened: u64,
    pub closed: u64,
    pub admitted: u64,
    pub refused: u64,
    pub probes: u64,
}

#[derive(Default)]
struct Slice {
    epoch: u64,
    calls: u64,
    fails: u64,
    slow: u64,
}

struct Machine {
    state: BreakerState,
    generation: u64,
    opened: u64,
    consecutive: u64,
    slices: Vec<Slice>,
    probes: HashMap<String, u64>,
    audit: BreakerAudit,
}

pub struct FakeBreaker {
    settings: FakeBreakerSettings,
    born: Instant,
    machines: Mutex<HashMap<ChannelId, Machine>>,
    next_probe: Mutex<u64>,
    down: AtomicBool,
}

impl FakeBreaker {
    pub fn new(settings: FakeBreakerSettings) -> Arc<Self> {
        Arc::new(FakeBreaker {
            settings,
            born: Instant::now(),
            machines: Mutex::default(),
            next_probe: Mutex::new(0),
            down: AtomicBool::new(false),
        })
    }

    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    pub fn audit(&self, channel: ChannelId) -> BreakerAudit {
        self.with(channel, |m, _| m.audit.clone())
    }

    pub fn current(&self, channel: ChannelId) -> BreakerState {
        self.with(channel, |m, _| m.state)
    }

    fn now_ms(&self) -> u64 {
        self.born.elapsed().as_millis() as u64
    }

    fn with<T>(&self, channel: ChannelId, f: impl FnOnce(&mut Machine, u64) -> T) -> T {
        let now = self.now_ms();
        let buckets = self.settings.window_buckets as usize;
        let mut machines = self.machines.lock().unwrap_or_else(|p| p.into_inner());
        let m = machines.entry(channel).or_insert_with(|| Machine {
            state: BreakerState::Closed,
            generation: 0,
            opened: 0,
            consecutive: 0,
            slices: (0..buckets).map(|_| Slice::default()).collect(),
            probes: HashMap::new(),
            audit: BreakerAudit::default(),
        });
        f(m, now)
    }

    fn check(&self) -> Result<(), BreakerError> {
        if self.down.load(Ordering::SeqCst) {
            Err(BreakerError::Unavailable("fake breaker down".into()))
        } else {
            Ok(())
        }
    }

    fn epoch(&self, now: u64) -> u64 {
        let slice = (self.settings.window.as_millis() as u64 / self.settings.window_buckets).max(1);
        now / slice + self.settings.window_buckets
    }

    fn totals(&self, m: &Machine, now: u64) -> (u64, u64, u64) {
        let (epoch, n) = (self.epoch(now), self.settings.window_buckets);
        m.slices
            .iter()
            .filter(|s| s.epoch + n > epoch && s.epoch > 0)
            .fold((0, 0, 0), |(c, f, s), x| (c + x.calls, f + x.fails, s + x.slow))
    }

    fn elevated(&self, (calls, fails, slow): (u64, u64, u64)) -> bool {
        let s = &self.settings;
        calls >= s.degraded_min_calls
            && (fails * 100 >= s.degraded_failure_rate * calls || slow * 100 >= s.degraded_slow_rate * calls)
    }

    fn move_to(&self, m: &mut Machine, to: BreakerState, now: u64) {
        m.state = to;
        m.generation += 1;
        m.consecutive = 0;
        if to == BreakerState::Open {
            m.opened = now;
            m.audit.opened += 1;
        } else {
            m.audit.closed += 1;
        }
        m.slices.iter_mut().for_each(|s| *s = Slice::default());
        m.probes.clear();
    }

    fn count(&self, m: &mut Machine, outcome: CallOutcome, now: u64) {
        let epoch = self.epoch(now);
        let slice = &mut m.slices[(epoch % self.settings.window_buckets) as usize];
        if slice.epoch != epoch {
            *slice = Slice { epoch, ..Slice::default() };
        }
        slice.calls += 1;
        match outcome {
            CallOutcome::Failure => {
                slice.fails += 1;
                m.consecutive += 1;
            }
            CallOutcome::Slow => {
                slice.slow += 1;
                m.consecutive = 0;
            }
            _ => m.consecutive = 0,
        }
        let s = &self.settings;
        let (calls, fails, slow) = self.totals(m, now);
        if m.consecutive >= s.consecutive_failures
            || (calls >= s.min_calls && fails * 100 >= s.open_failure_rate * calls)
        {
            self.move_to(m, BreakerState::Open, now);
        } else {
            m.state = if self.elevated((calls, fails, slow)) { BreakerState::Degraded } else { BreakerState::Closed };
        }
    }

    fn admit_at(&self, m: &mut Machine, now: u64) -> Admission {
        let (brk, ttl) = (self.settings.break_time.as_millis() as u64, self.settings.probe_timeout.as_millis() as u64);
        if m.state == BreakerState::Open {
            if now < m.opened + brk {
                m.audit.refused += 1;
                let retry_after = Duration::from_millis(m.opened + brk - now);
                return Admission::Refused { state: BreakerState::Open, retry_after };
            }
            m.state = BreakerState::HalfOpen;
        }
        if m.state == BreakerState::HalfOpen {
            m.probes.retain(|_, expires| *expires > now);
            if m.probes.len() >= self.settings.probes {
                m.audit.refused += 1;
                let first = m.probes.values().min().copied().unwrap_or(now + 1);
                let retry_after = Duration::from_millis(first.saturating_sub(now).max(1));
                return Admission::Refused { state: BreakerState::HalfOpen, retry_after };
            }
            let id = {
                let mut n = self.next_probe.lock().unwrap_or_else(|p| p.into_inner());
                *n += 1;
                format!("probe-{n}")
            };
            m.probes.insert(id.clone(), now + ttl);
            m.audit.probes += 1;
            m.audit.admitted += 1;
            return Admission::Admit(Call { generation: m.generation, probe: Some(id) });
        }
        m.audit.admitted += 1;
        Admission::Admit(Call { generation: m.generation, probe: None })
    }

    fn record_at(&self, m: &mut Machine, call: &Call, outcome: CallOutcome, now: u64) {
        if let Some(probe) = &call.probe {
            m.probes.remove(probe);
        }
        if call.generation != m.generation || outcome == CallOutcome::Ignored || m.state == BreakerState::Open {
            return;
        }
        if m.state == BreakerState::HalfOpen {
            if call.is_probe() {
                let to = if outcome == CallOutcome::Failure { BreakerState::Open } else { BreakerState::Closed };
                self.move_to(m, to, now);
            }
            return;
        }
        self.count(m, outcome, now);
    }
}

#[async_trait::async_trait]
impl CircuitBreaker for FakeBreaker {
    async fn admit(&self, channel: ChannelId) -> Result<Admission, BreakerError> {
        self.check()?;
        Ok(self.with(channel, |m, now| self.admit_at(m, now)))
    }

    async fn record(
        &self,
        channel: ChannelId,
        call: &Call,
        outcome: CallOutcome,
    ) -> Result<BreakerState, BreakerError> {
        self.check()?;
        Ok(self.with(channel, |m, now| {
            self.record_at(m, call, outcome, now);
            m.state
        }))
    }

    async fn state(&self, channel: ChannelId) -> Result<BreakerView, BreakerError> {
        self.check()?;
        let brk = self.settings.break_time.as_millis() as u64;
        Ok(self.with(channel, |m, now| {
            let totals = self.totals(m, now);
            let (state, retry_after) = match m.state {
                BreakerState::Open if now >= m.opened + brk => (BreakerState::HalfOpen, None),
                BreakerState::Open => (BreakerState::Open, Some(Duration::from_millis(m.opened + brk - now))),
                BreakerState::HalfOpen => (BreakerState::HalfOpen, None),
                _ if self.elevated(totals) => (BreakerState::Degraded, None),
                _ => (BreakerState::Closed, None),
            };
            BreakerView {
                state,
                generation: m.generation,
                calls: totals.0,
                failures: totals.1,
                slow: totals.2,
                consecutive_failures: m.consecutive,
                probes_in_flight: m.probes.values().filter(|e| **e > now).count() as u64,
                retry_after,
            }
        }))
    }

    async fn reset(&self, channel: ChannelId) -> Result<(), BreakerError> {
        self.check()?;
        self.with(channel, |m, now| self.move_to(m, BreakerState::Closed, now));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> FakeBreakerSettings {
        FakeBreakerSettings {
            window: Duration::from_secs(10),
            window_buckets: 10,
            min_calls: 4,
            open_failure_rate: 50,
            consecutive_failures: 3,
            degraded_min_calls: 2,
            degraded_failure_rate: 20,
            degraded_slow_rate: 50,
            break_time: Duration::from_secs(2),
            probes: 1,
            probe_timeout: Duration::from_secs(1),
        }
    }

    async fn call(b: &FakeBreaker, outcome: CallOutcome) -> BreakerState {
        let Admission::Admit(call) = b.admit(ChannelId::Cpm).await.unwrap() else { return BreakerState::Open };
        b.record(ChannelId::Cpm, &call, outcome).await.unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn opens_half_opens_and_closes_like_the_script() {
        let b = FakeBreaker::new(settings());
        assert_eq!(call(&b, CallOutcome::Success).await, BreakerState::Closed);
        assert_eq!(call(&b, CallOutcome::Failure).await, BreakerState::Degraded);
        assert_eq!(call(&b, CallOutcome::Ignored).await, BreakerState::Degraded, "4xx and 429 never count");
        call(&b, CallOutcome::Failure).await;
        assert_eq!(call(&b, CallOutcome::Failure).await, BreakerState::Open, "3 in a row");
        let Admission::Refused { state, retry_after } = b.admit(ChannelId::Cpm).await.unwrap() else { panic!() };
        assert_eq!((state, retry_after), (BreakerState::Open, Duration::from_secs(2)));
        tokio::time::sleep(Duration::from_secs(2)).await;
        let Admission::Admit(probe) = b.admit(ChannelId::Cpm).await.unwrap() else { panic!("a probe") };
        assert!(probe.is_probe());
        assert!(matches!(
            b.admit(ChannelId::Cpm).await.unwrap(),
            Admission::Refused { state: BreakerState::HalfOpen, .. }
        ));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Admission::Admit(second) = b.admit(ChannelId::Cpm).await.unwrap() else {
            panic!("the first probe expired")
        };
        assert_eq!(
            b.record(ChannelId::Cpm, &probe, CallOutcome::Failure).await.unwrap(),
            BreakerState::Open,
            "expired probe still reports"
        );
        assert_eq!(
            b.record(ChannelId::Cpm, &second, CallOutcome::Success).await.unwrap(),
            BreakerState::Open,
            "older generation ignored"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(call(&b, CallOutcome::Success).await, BreakerState::Closed);
        assert_eq!(b.audit(ChannelId::Cpm).opened, 2);
    }
}
