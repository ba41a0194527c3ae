//! Leader: campaigns for the `Pool::Leader` lease every acquire interval; while
//! it holds the lease it runs the cluster's singletons (the Sweeper, and the
//! OutboundJanitor when outbound is configured).
//! Losing the lease stops them at once, then the campaign resumes.
//!
//! Supervision policy (one_for_one over its singletons): a failed singleton is
//! restarted after a backoff (base × 2^(k−1), capped, jittered) only while this
//! pod still leads; more than `max_restarts` failures within `window` make the
//! Leader fail to Root, which releases the leader lease. An operator restart
//! (`restart("sweeper")`, `restart("outbound-janitor")`) is immediate and not counted.

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use super::sweeper::{self, Sweeper};
use super::{RestartError, context::TreeContext};
use crate::backoff::{Backoff, jittered};
use crate::ledger::{HeldLease, LostNotice};
use crate::outbound::janitor::{self, OutboundJanitor};
use crate::ports::{Acquired, GrantId, LeaseError, LostCause, Pool};
use crate::supervision::{Supervision, Verdict};
use crate::task::OwnedTask;

pub const ID: &str = "leader";

/// The leader's singletons (room for the Reconciler).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Singleton {
    Sweeper,
    OutboundJanitor,
}

impl Singleton {
    pub fn id(self) -> &'static str {
        match self {
            Singleton::Sweeper => sweeper::ID,
            Singleton::OutboundJanitor => janitor::ID,
        }
    }
}

pub enum Campaign {
    Won(HeldLease, GrantId),
    Lost,
    Quarantined(std::time::Duration),
    Failed(String),
    Fatal(String),
}

pub enum LeaderMsg {
    Campaign {
        generation: u64,
    },
    Campaigned {
        generation: u64,
        outcome: Campaign,
    },
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

pub struct LeaderState {
    generation: u64,
    leading: Option<GrantId>,
    task: Option<OwnedTask>,
    backoff: Backoff,
    supervision: Supervision<Singleton>,
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
            generation: 0,
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
            LeaderMsg::Campaign { generation } if generation == state.generation && !state.draining => {
                self.campaign(&me, state)
            }
            LeaderMsg::Campaigned { generation, outcome } if generation == state.generation => {
                self.on_campaigned(&me, state, outcome).await?
            }
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
        match state.supervision.on_event(&event) {
            Verdict::Restart { key, after, counted, why } => {
                self.ctx.board.count_restart(key.id());
                crate::metrics::restart(key.id());
                if counted {
                    self.ctx.board.set_error(key.id(), why);
                }
                if state.leading.is_some() && !state.draining {
                    let generation = state.supervision.arm_respawn(key);
                    me.send_after(after, move || LeaderMsg::Respawn { singleton: key, generation });
                }
            }
            Verdict::Escalate { why, .. } => return Err(format!("leader singletons: {why}").into()),
            Verdict::Retired(_) | Verdict::Ignore => {}
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
        state.generation += 1;
        let generation = state.generation;
        me.send_after(after, move || LeaderMsg::Campaign { generation });
    }

    fn campaign(&self, me: &ActorRef<LeaderMsg>, state: &mut LeaderState) {
        self.ctx.board.set_state(ID, "campaigning");
        // Not leading: an entry under our name is a previous incarnation's leftover.
        if let Some(orphan) = self.ctx.ledger.remove(ID) {
            self.ctx.release_in_background(vec![orphan]);
        }
        state.generation += 1;
        let (generation, ctx, me) = (state.generation, self.ctx.clone(), me.clone());
        state.task = Some(OwnedTask::spawn(async move {
            let notice_to = me.clone();
            let notice: LostNotice = Box::new(move |grant, cause| {
                let _ = notice_to.send_message(LeaderMsg::LeaseLost { grant: grant.clone(), cause });
            });
            let outcome = match ctx.ports.leases.acquire(Pool::Leader, Some(1)).await {
                Ok(Acquired::Granted(lease)) => {
                    let grant = lease.grant.clone();
                    Campaign::Won(ctx.ledger.hold(ID, lease, notice), grant)
                }
                Ok(Acquired::Full) => Campaign::Lost,
                Ok(Acquired::Quarantined { remaining }) => Campaign::Quarantined(remaining),
                Err(LeaseError::Fatal(e)) => Campaign::Fatal(e),
                Err(e) => Campaign::Failed(e.to_string()),
            };
            let _ = me.send_message(LeaderMsg::Campaigned { generation, outcome });
        }));
    }

    async fn on_campaigned(
        &self,
        me: &ActorRef<LeaderMsg>,
        state: &mut LeaderState,
        outcome: Campaign,
    ) -> Result<(), ActorProcessingErr> {
        state.task = None;
        let every = self.ctx.config.timing.acquire_interval;
        match outcome {
            Campaign::Won(lease, grant) if lease.current().is_some() && !state.draining => {
                tracing::info!(pod = %self.ctx.config.pod_id, "leading the cluster");
                state.backoff.reset();
                state.leading = Some(grant);
                self.ctx.board.set_state(ID, "leading");
                for singleton in self.singletons() {
                    self.spawn_singleton(me, state, singleton).await?;
                }
            }
            Campaign::Won(..) => {
                if let Some(lease) = self.ctx.ledger.remove(ID) {
                    self.ctx.release_in_background(vec![lease]);
                }
                if !state.draining {
                    self.retry(me, state, jittered(every));
                }
            }
            Campaign::Lost => {
                self.ctx.board.set_state(ID, "following");
                self.retry(me, state, jittered(every));
            }
            Campaign::Quarantined(remaining) => self.retry(me, state, remaining + jittered(every)),
            Campaign::Failed(why) => {
                self.ctx.board.set_error(ID, why);
                let after = state.backoff.next_delay().max(every / 4);
                self.retry(me, state, after);
            }
            Campaign::Fatal(why) => return Err(format!("leader campaign: {why}").into()),
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
        };
        state.supervision.adopt(cell, which);
        Ok(())
    }

    fn singletons(&self) -> Vec<Singleton> {
        let mut all = vec![Singleton::Sweeper];
        if self.ctx.config.outbound.is_some() {
            all.push(Singleton::OutboundJanitor);
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
