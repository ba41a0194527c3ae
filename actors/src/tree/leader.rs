//! Leader: campaigns for the `Pool::Leader` lease every acquire interval; while
//! it holds the lease it runs the cluster's singletons (the Sweeper, the
//! OutboundJanitor when outbound is configured, the Reconciler when
//! reconciliation is).
//! Losing the lease stops them at once, then the campaign resumes.
//!
//! Supervision policy (one_for_one over its singletons): a failed singleton is
//! restarted after a backoff (base × 2^(k−1), capped, jittered) only while this
//! pod still leads; more than `max_restarts` failures within `window` make the
//! Leader fail to Root, which releases the leader lease. An operator restart
//! (`restart("sweeper")`, `restart("outbound-janitor")`, `restart("reconciler")`) is immediate and not counted.

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use super::exits::{self, ChildKey};
use super::reconciler::{self, Reconciler};
use super::sweeper::{self, Sweeper};
use super::{RestartError, context::TreeContext};
use crate::backoff::{Backoff, jittered};
use crate::lease::{self, Acquisition};
use crate::outbound::janitor::{self, OutboundJanitor};
use crate::ports::{GrantId, LostCause, Pool};
use crate::supervision::{Plan, Supervision};
use crate::task::OwnedTask;
use crate::timers::{Stamped, Timers};

pub const ID: &str = "leader";

/// The leader's singletons.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Singleton {
    Sweeper,
    OutboundJanitor,
    Reconciler,
}

impl ChildKey for Singleton {
    fn id(&self) -> String {
        match self {
            Singleton::Sweeper => sweeper::ID.into(),
            Singleton::OutboundJanitor => janitor::ID.into(),
            Singleton::Reconciler => reconciler::ID.into(),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Singleton::Sweeper => sweeper::ID,
            Singleton::OutboundJanitor => janitor::ID,
            Singleton::Reconciler => reconciler::ID,
        }
    }

    /// Singletons hold no leases: the leader lease is the Leader's own.
    fn owns(&self, _owner: &str) -> bool {
        false
    }
}

/// What the campaign's timer and task bring back.
pub enum CampaignStep {
    Campaign,
    Campaigned(Acquisition),
}

pub enum LeaderMsg {
    /// The campaign's timer or result, stamped.
    Stamped(u64, CampaignStep),
    /// The campaign task panicked: the Leader fails (Root releases its lease).
    Panicked(String),
    LeaseLost {
        grant: GrantId,
        cause: LostCause,
    },
    Respawn {
        singleton: Singleton,
        generation: u64,
    },
    RestartSingleton {
        id: String,
        reply: RpcReplyPort<Result<(), RestartError>>,
    },
    /// The pod stops: stop the singletons, release the leader lease.
    Drain(RpcReplyPort<()>),
}

impl Stamped for LeaderMsg {
    type Step = CampaignStep;

    fn stamped(generation: u64, step: CampaignStep) -> Self {
        LeaderMsg::Stamped(generation, step)
    }

    fn panicked(why: String) -> Self {
        LeaderMsg::Panicked(why)
    }
}

pub struct LeaderState {
    /// Stamps the campaign's timer and task.
    timers: Timers,
    /// The leader grant while leading (its loss notices stop the singletons).
    leading: Option<GrantId>,
    /// The campaign (or the drain's release) in flight.
    task: Option<OwnedTask>,
    backoff: Backoff,
    supervision: Supervision<Singleton>,
    /// The pod stops: no campaign, no restart.
    draining: bool,
}

pub struct Leader {
    pub ctx: TreeContext,
}

impl Actor for Leader {
    type Msg = LeaderMsg;
    type State = LeaderState;
    type Arguments = ();

    async fn pre_start(&self, _me: ActorRef<LeaderMsg>, _: ()) -> Result<LeaderState, ActorProcessingErr> {
        self.ctx.board.register(ID, Some("root"), "leader");
        let c = &self.ctx.config;
        Ok(LeaderState {
            timers: Timers::default(),
            leading: None,
            task: None,
            backoff: Backoff::new(c.timing.backoff_base, c.timing.backoff_max),
            supervision: Supervision::new(c.restart),
            draining: false,
        })
    }

    async fn post_start(&self, me: ActorRef<LeaderMsg>, state: &mut LeaderState) -> Result<(), ActorProcessingErr> {
        self.campaign(&me, state);
        Ok(())
    }

    async fn handle(
        &self,
        me: ActorRef<LeaderMsg>,
        msg: LeaderMsg,
        state: &mut LeaderState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            LeaderMsg::Stamped(generation, step) if state.timers.is_current(generation) => match step {
                CampaignStep::Campaign if !state.draining => self.campaign(&me, state),
                CampaignStep::Campaign => {}
                CampaignStep::Campaigned(outcome) => self.on_campaigned(&me, state, outcome).await?,
            },
            LeaderMsg::Stamped(..) => tracing::trace!("stale campaign step dropped"),
            LeaderMsg::Panicked(why) => return Err(why.into()),
            LeaderMsg::LeaseLost { grant, cause } if state.leading.as_ref() == Some(&grant) => {
                tracing::warn!(%cause, "leader lease lost: stopping the singletons");
                self.step_down(state);
                self.ctx.board.set_error(ID, format!("leader lease lost: {cause}"));
                self.retry(&me, state, jittered(self.ctx.config.timing.acquire_interval));
            }
            LeaderMsg::Respawn { singleton, generation } => self.respawn(&me, state, singleton, generation).await?,
            LeaderMsg::RestartSingleton { id, reply } => {
                let which = self.singletons().into_iter().find(|s| s.id() == id);
                let ok = which.is_some_and(|s| state.supervision.stop_for_restart(&s, "operator restart"));
                let _ = reply.send(if ok { Ok(()) } else { Err(RestartError::NotRunning(id)) });
            }
            LeaderMsg::Drain(reply) => self.drain(state, reply),
            _ => {}
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        me: ActorRef<LeaderMsg>,
        event: SupervisionEvent,
        state: &mut LeaderState,
    ) -> Result<(), ActorProcessingErr> {
        let respawning = state.leading.is_some() && !state.draining;
        match exits::settle(&self.ctx, &mut state.supervision, &event, !respawning) {
            Plan::SpawnNow(singleton) => self.spawn_singleton(&me, state, singleton).await?,
            Plan::Later { key: singleton, after, generation } => {
                me.send_after(after, move || LeaderMsg::Respawn { singleton, generation });
            }
            Plan::Escalate(why) => return Err(format!("leader singletons: {why}").into()),
            Plan::Nothing => {}
        }
        Ok(())
    }

    async fn post_stop(&self, _me: ActorRef<LeaderMsg>, _state: &mut LeaderState) -> Result<(), ActorProcessingErr> {
        if let Some(lease) = self.ctx.ledger.remove(ID) {
            self.ctx.release(vec![lease]).await;
        }
        Ok(())
    }
}

impl Leader {
    fn retry(&self, me: &ActorRef<LeaderMsg>, state: &mut LeaderState, after: std::time::Duration) {
        state.timers.arm(me, after, CampaignStep::Campaign);
    }

    fn campaign(&self, me: &ActorRef<LeaderMsg>, state: &mut LeaderState) {
        self.ctx.board.set_state(ID, "campaigning");
        // Not leading: an entry under our name is a previous incarnation's leftover.
        lease::release_leftover(&self.ctx, ID);
        let (ctx, notice) =
            (self.ctx.clone(), lease::lost_notice(me, |grant, cause| LeaderMsg::LeaseLost { grant, cause }));
        state.task = Some(state.timers.spawn(me, async move {
            CampaignStep::Campaigned(lease::acquire(&ctx, ID, Pool::Leader, Some(1), notice).await)
        }));
    }

    async fn on_campaigned(
        &self,
        me: &ActorRef<LeaderMsg>,
        state: &mut LeaderState,
        outcome: Acquisition,
    ) -> Result<(), ActorProcessingErr> {
        state.task = None;
        let every = self.ctx.config.timing.acquire_interval;
        match outcome {
            Acquisition::Granted(held) if held.lease.current().is_some() && !state.draining => {
                tracing::info!(pod = %self.ctx.config.pod_id, "leading the cluster");
                state.backoff.reset();
                state.leading = Some(held.grant);
                self.ctx.board.set_state(ID, "leading");
                for singleton in self.singletons() {
                    self.spawn_singleton(me, state, singleton).await?;
                }
            }
            Acquisition::Granted(_) => {
                if let Some(lease) = self.ctx.ledger.remove(ID) {
                    self.ctx.release_in_background(vec![lease]);
                }
                if !state.draining {
                    self.retry(me, state, jittered(every));
                }
            }
            Acquisition::Full => {
                self.ctx.board.set_state(ID, "following");
                self.retry(me, state, jittered(every));
            }
            Acquisition::Quarantined(remaining) => self.retry(me, state, remaining + jittered(every)),
            Acquisition::Retry(why) => {
                self.ctx.board.set_error(ID, why);
                let after = state.backoff.next_delay().max(every / 4);
                self.retry(me, state, after);
            }
            Acquisition::Fatal(why) => return Err(format!("leader campaign: {why}").into()),
        }
        Ok(())
    }

    async fn spawn_singleton(
        &self,
        me: &ActorRef<LeaderMsg>,
        state: &mut LeaderState,
        which: Singleton,
    ) -> Result<(), ActorProcessingErr> {
        let (ctx, sup) = (self.ctx.clone(), me.get_cell());
        let cell = match which {
            Singleton::Sweeper => Actor::spawn_linked(None, Sweeper { ctx }, (), sup).await?.0.get_cell(),
            Singleton::OutboundJanitor => {
                let (config, ports) = ctx.outbound().ok_or("outbound janitor without outbound ports")?;
                Actor::spawn_linked(None, OutboundJanitor { ctx, config, ports }, (), sup).await?.0.get_cell()
            }
            Singleton::Reconciler => {
                let port = ctx.ports.reconciler.clone().ok_or("reconciler without its port")?;
                let schedule = ctx.config.reconcile.clone().ok_or("reconciler without its schedule")?;
                Actor::spawn_linked(None, Reconciler { ctx, port, schedule }, (), sup).await?.0.get_cell()
            }
        };
        state.supervision.adopt(cell, which);
        Ok(())
    }

    fn singletons(&self) -> Vec<Singleton> {
        let mut all = vec![Singleton::Sweeper];
        if self.ctx.config.outbound.is_some() {
            all.push(Singleton::OutboundJanitor);
        }
        if self.ctx.config.reconcile.is_some() && self.ctx.ports.reconciler.is_some() {
            all.push(Singleton::Reconciler);
        }
        all
    }

    async fn respawn(
        &self,
        me: &ActorRef<LeaderMsg>,
        state: &mut LeaderState,
        singleton: Singleton,
        generation: u64,
    ) -> Result<(), ActorProcessingErr> {
        if state.supervision.take_respawn(&singleton, generation) && state.leading.is_some() {
            self.spawn_singleton(me, state, singleton).await?;
        }
        Ok(())
    }

    fn step_down(&self, state: &mut LeaderState) {
        state.leading = None;
        state.supervision.cancel_respawns();
        for singleton in self.singletons() {
            state.supervision.retire(&singleton, "leadership lost");
        }
        if let Some(lease) = self.ctx.ledger.remove(ID) {
            self.ctx.release_in_background(vec![lease]);
        }
    }

    fn drain(&self, state: &mut LeaderState, reply: RpcReplyPort<()>) {
        state.draining = true;
        state.timers.invalidate();
        state.task = None;
        state.leading = None;
        state.supervision.cancel_respawns();
        for singleton in self.singletons() {
            state.supervision.retire(&singleton, "pod draining");
        }
        self.ctx.board.set_state(ID, "drained");
        let ctx = self.ctx.clone();
        state.task = Some(OwnedTask::spawn(async move {
            if let Some(lease) = ctx.ledger.remove(ID) {
                ctx.release(vec![lease]).await;
            }
            let _ = reply.send(());
        }));
    }
}
