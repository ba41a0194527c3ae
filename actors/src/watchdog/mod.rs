//! Watchdog: on every pod, every `watchdog.interval`, builds the cluster view
//! through the ports — holders of every pool (lease store), live pods (pod
//! registry), every slot's cursor (inbox), the publication lag (publisher) —
//! and raises or clears alerts by the [`rules`]: zero-active, stale-slot, lag,
//! cap. Alerts go to the metrics (`cabine_watchdog_alert{kind,channel,slot}`
//! 0/1, `cabine_watchdog_alerts_total`), to the log on every transition, to its
//! status node (`/actors`) and to `/cluster`.
//!
//! Why on every pod rather than as a leader singleton: the alerts must not
//! depend on the leader election they may be about (a pod that cannot reach
//! ICOM or Postgres can still lead), every pod's `/cluster` shows them, and
//! each pod's view also feeds its own orphan pickup (the free-slot sightings
//! its standby slots read). The cost is a few reads per interval per pod.
//!
//! The reads run in a spawned task, each bounded; the result comes back as a
//! message. The watchdog holds no lease; Root restarts it like any child.

pub mod alert;
pub mod config;
pub mod rules;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::time::Instant;

use crate::metrics;
use crate::ports::Pool;
use crate::task::OwnedTask;
use crate::tree::context::TreeContext;
pub use alert::{Alert, AlertBoard, AlertKind};
pub use config::WatchdogConfig;
use rules::{History, Observation};

pub const ID: &str = "watchdog";

pub enum WatchdogMsg {
    Tick { generation: u64 },
    Observed { generation: u64, observation: Box<Observation> },
}

pub struct WatchdogState {
    generation: u64,
    task: Option<OwnedTask>,
    history: History,
}

pub struct Watchdog {
    pub ctx: TreeContext,
}

impl Actor for Watchdog {
    type Msg = WatchdogMsg;
    type State = WatchdogState;
    type Arguments = ();

    async fn pre_start(&self, _me: ActorRef<WatchdogMsg>, _: ()) -> Result<WatchdogState, ActorProcessingErr> {
        self.ctx.board.register(ID, Some("root"), "watchdog");
        metrics::watchdog_ready(&self.ctx.config.channels);
        Ok(WatchdogState { generation: 0, task: None, history: History::default() })
    }

    async fn post_start(&self, me: ActorRef<WatchdogMsg>, state: &mut WatchdogState) -> Result<(), ActorProcessingErr> {
        self.ctx.board.set_state(ID, "watching");
        self.observe(&me, state);
        Ok(())
    }

    async fn handle(
        &self,
        me: ActorRef<WatchdogMsg>,
        msg: WatchdogMsg,
        state: &mut WatchdogState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            WatchdogMsg::Tick { generation } if generation == state.generation => self.observe(&me, state),
            WatchdogMsg::Observed { generation, observation } if generation == state.generation => {
                state.task = None;
                let started = observation.at;
                self.apply(state, &observation);
                let next = self.ctx.config.watchdog.interval.saturating_sub(started.elapsed());
                state.generation += 1;
                let generation = state.generation;
                me.send_after(next, move || WatchdogMsg::Tick { generation });
            }
            _ => {}
        }
        Ok(())
    }

    async fn post_stop(&self, _me: ActorRef<WatchdogMsg>, _: &mut WatchdogState) -> Result<(), ActorProcessingErr> {
        self.ctx.board.set_state(ID, "stopped");
        Ok(())
    }
}

impl Watchdog {
    fn observe(&self, me: &ActorRef<WatchdogMsg>, state: &mut WatchdogState) {
        state.generation += 1;
        let (generation, ctx, me) = (state.generation, self.ctx.clone(), me.clone());
        state.task = Some(OwnedTask::spawn(async move {
            let observation = Box::new(observe(ctx).await);
            let _ = me.send_message(WatchdogMsg::Observed { generation, observation });
        }));
    }

    fn apply(&self, state: &mut WatchdogState, observation: &Observation) {
        let eval = state.history.evaluate(observation, &self.ctx.config, now_ms());
        for (channel, free) in eval.free {
            self.ctx.sightings.record(channel, observation.at, free);
        }
        for alert in &eval.raised {
            alert.announce(true);
        }
        for alert in &eval.cleared {
            alert.announce(false);
        }
        let board = &self.ctx.board;
        board.add_detail(ID, "checks", 1);
        board.set_detail(ID, "alerts", serde_json::to_value(&eval.alerts).unwrap_or_default());
        if eval.blind.is_empty() {
            board.set_state(ID, "watching");
        } else {
            board.set_state(ID, "partly-blind");
            board.set_error(ID, eval.blind.join("; "));
        }
        self.ctx.alerts.set(eval.alerts);
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

async fn bounded<T, E: std::fmt::Display>(
    budget: Duration,
    read: impl Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(budget, read).await {
        Ok(outcome) => outcome.map_err(|e| e.to_string()),
        Err(_) => Err(format!("no answer within {budget:?}")),
    }
}

/// One read of every source, concurrently, each bounded.
async fn observe(ctx: TreeContext) -> Observation {
    let at = Instant::now();
    let c = &ctx.config;
    let budget = c.watchdog.interval.max(c.timing.heartbeat);
    let ports = &ctx.ports;
    let mut pools: Vec<Pool> = c.channels.iter().flat_map(|ch| [Pool::Stream(*ch), Pool::Send(*ch)]).collect();
    pools.push(Pool::Leader);
    let holders = async {
        let mut read = Vec::with_capacity(pools.len());
        for pool in pools {
            read.push((pool, bounded(budget, ports.leases.holders(pool)).await));
        }
        read
    };
    let (pods, holders, cursors, oldest_unpublished) = tokio::join!(
        bounded(budget, ports.pods.live_pods()),
        holders,
        bounded(budget, ports.inbox.cursors()),
        bounded(budget, ports.publisher.oldest_unpublished()),
    );
    Observation { at, pods, holders, cursors, oldest_unpublished }
}
