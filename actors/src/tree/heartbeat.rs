//! LeaseHeartbeat: every `heartbeat`, renews EVERY lease the pod holds with
//! one `renew_many`, marks lost the ones the store refuses (or whose local
//! validity has passed: renewals failing) and notifies their owners through
//! the ledger, writes the pod's heartbeat (held slots, failover cooldowns) and refreshes the
//! live-pod view that fair share reads. A renewal that finds a lease's key missing
//! or re-granted while the lease was still locally valid is proof that Redis lost
//! keys (eviction, a rollback, a lagging replica: partial amnesia, DESIGN §3): the
//! heartbeat reports it, which quarantines every pool of the cluster. The I/O runs in a spawned task whose
//! report comes back as a message. On drain it leaves the registry first (so
//! other pods take the slots over) and keeps renewing until the tree ends.

use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::time::Instant;

use crate::ledger::slot_name;
use crate::metrics;
use crate::ports::{ClusterError, Lease, LeaseError, LostCause, PodBeat, Pool};
use crate::task::OwnedTask;
use crate::tree::context::TreeContext;

pub const ID: &str = "lease-heartbeat";

pub enum HeartbeatMsg {
    Tick {
        generation: u64,
    },
    TickDone {
        generation: u64,
        report: Box<TickReport>,
    },
    /// Stop beating, remove this pod's key; answers the other live pods.
    Leave(RpcReplyPort<Vec<PodBeat>>),
    /// A partial-amnesia report came back: `Ok` when the store took it.
    Reported {
        evidence: String,
        outcome: Result<(), String>,
    },
}

pub struct TickReport {
    started: Instant,
    sent: Vec<(String, Lease)>,
    renewals: Result<Vec<Result<Lease, LostCause>>, LeaseError>,
    beat: Result<(), ClusterError>,
    live: Result<Vec<PodBeat>, ClusterError>,
}

pub struct HeartbeatState {
    generation: u64,
    task: Option<OwnedTask>,
    leave: Option<OwnedTask>,
    /// A partial-amnesia report on its way to the lease store.
    report: Option<OwnedTask>,
    /// Evidence of partial amnesia not yet taken by the store: reported again every tick until it is.
    pending: Option<String>,
    leaving: bool,
}

pub struct LeaseHeartbeat {
    pub ctx: TreeContext,
    /// When the pod started (uptime in its heartbeat).
    pub born: Instant,
}

impl Actor for LeaseHeartbeat {
    type Msg = HeartbeatMsg;
    type State = HeartbeatState;
    type Arguments = ();

    async fn pre_start(&self, _me: ActorRef<HeartbeatMsg>, _: ()) -> Result<HeartbeatState, ActorProcessingErr> {
        self.ctx.board.register(ID, Some("root"), "lease-heartbeat");
        Ok(HeartbeatState { generation: 0, task: None, leave: None, report: None, pending: None, leaving: false })
    }

    async fn post_start(
        &self,
        me: ActorRef<HeartbeatMsg>,
        state: &mut HeartbeatState,
    ) -> Result<(), ActorProcessingErr> {
        self.ctx.board.set_state(ID, "beating");
        self.spawn_tick(&me, state);
        Ok(())
    }

    async fn handle(
        &self,
        me: ActorRef<HeartbeatMsg>,
        msg: HeartbeatMsg,
        state: &mut HeartbeatState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            HeartbeatMsg::Tick { generation } if generation == state.generation => self.spawn_tick(&me, state),
            HeartbeatMsg::TickDone { generation, report } if generation == state.generation => {
                state.task = None;
                let started = report.started;
                if let Some(evidence) = self.apply(*report)? {
                    self.found_amnesia(state, evidence);
                }
                if state.report.is_none()
                    && let Some(evidence) = state.pending.clone()
                {
                    self.report_amnesia(&me, state, evidence);
                }
                let next = self.ctx.config.timing.heartbeat.saturating_sub(started.elapsed());
                state.generation += 1;
                let generation = state.generation;
                me.send_after(next, move || HeartbeatMsg::Tick { generation });
            }
            HeartbeatMsg::Leave(reply) => self.leave(&me, state, reply),
            HeartbeatMsg::Reported { evidence, outcome } => {
                state.report = None;
                match outcome {
                    Ok(()) if state.pending.as_deref() == Some(evidence.as_str()) => state.pending = None,
                    Ok(()) => {}
                    Err(e) => tracing::warn!(error = %e, "partial amnesia not reported yet; again at the next tick"),
                }
            }
            _ => {}
        }
        Ok(())
    }
}

impl LeaseHeartbeat {
    fn beat(&self) -> PodBeat {
        let c = &self.ctx.config;
        PodBeat {
            pod_id: c.pod_id.clone(),
            pid: std::process::id(),
            version: c.version.clone(),
            uptime_s: self.born.elapsed().as_secs(),
            held: self.ctx.ledger.held_names(),
            streams: c.channels.iter().map(|ch| (*ch, c.stream_pool.get())).collect(),
            cooldown: self.ctx.failover.cooling_names(Instant::now()),
        }
    }

    fn spawn_tick(&self, me: &ActorRef<HeartbeatMsg>, state: &mut HeartbeatState) {
        state.generation += 1;
        let (generation, ctx, me) = (state.generation, self.ctx.clone(), me.clone());
        let beat = (!state.leaving).then(|| self.beat());
        state.task = Some(OwnedTask::spawn(async move {
            let report = tick(ctx, beat).await;
            let _ = me.send_message(HeartbeatMsg::TickDone { generation, report: Box::new(report) });
        }));
    }

    /// Applies a tick's answers; returns the evidence of partial amnesia, if any.
    fn apply(&self, report: TickReport) -> Result<Option<String>, ActorProcessingErr> {
        let (ledger, board) = (&self.ctx.ledger, &self.ctx.board);
        let mut lost = match report.renewals {
            Ok(answers) => ledger.apply_renewals(&report.sent, answers),
            Err(LeaseError::Lost(cause)) => {
                ledger.apply_renewals(&report.sent, report.sent.iter().map(|_| Err(cause)).collect())
            }
            Err(LeaseError::Unavailable(e)) => {
                board.set_error(ID, format!("renewal failed: {e}"));
                Vec::new()
            }
            Err(LeaseError::Fatal(e)) => return Err(format!("lease store fatal on renew: {e}").into()),
        };
        let evidence = amnesia_evidence(&report.sent, &lost);
        lost.extend(ledger.expire_overdue(LostCause::Unreachable));
        for (owner, cause) in &lost {
            tracing::warn!(%owner, %cause, "lease lost");
        }
        if let Err(e) = report.beat {
            board.set_error(ID, format!("beat failed: {e}"));
        }
        match report.live {
            Ok(pods) => {
                board.set_detail(ID, "live_pods", pods.len());
                self.ctx.view.set(pods);
            }
            Err(e) => board.set_error(ID, format!("live pods unknown: {e}")),
        }
        board.set_detail(ID, "leases_held", ledger.held().len());
        let n = usize::from(self.ctx.config.stream_pool.get());
        let cooling = self.ctx.failover.cooling(Instant::now());
        for ch in &self.ctx.config.channels {
            let holding = ledger.held_slots(Pool::Stream(*ch)).len();
            metrics::slots(*ch, holding, n.saturating_sub(holding));
            metrics::slots_cooling(*ch, cooling.iter().filter(|s| s.channel == *ch).count());
        }
        Ok(evidence)
    }

    /// New evidence: shown at once, merged into what is still to report.
    fn found_amnesia(&self, state: &mut HeartbeatState, evidence: String) {
        tracing::error!(%evidence, "PARTIAL REDIS AMNESIA: a locally valid lease's key is gone or re-granted; quarantining every pool");
        metrics::partial_amnesia();
        self.ctx.board.add_detail(ID, "partial_amnesia", 1);
        self.ctx.board.set_error(ID, format!("partial amnesia: {evidence}"));
        state.pending = Some(match state.pending.take() {
            Some(earlier) => format!("{earlier}; {evidence}"),
            None => evidence,
        });
    }

    /// Tells the lease store (in a task) that it lost keys: no pool grants for a quarantine.
    fn report_amnesia(&self, me: &ActorRef<HeartbeatMsg>, state: &mut HeartbeatState, evidence: String) {
        let (ctx, me) = (self.ctx.clone(), me.clone());
        state.report = Some(OwnedTask::spawn(async move {
            let budget = ctx.config.timing.heartbeat;
            let outcome = match tokio::time::timeout(budget, ctx.ports.leases.report_amnesia(&evidence)).await {
                Ok(Ok(quarantine)) => {
                    tracing::warn!(?quarantine, "quarantine started for partial amnesia");
                    Ok(())
                }
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no answer within {budget:?}")),
            };
            let _ = me.send_message(HeartbeatMsg::Reported { evidence, outcome });
        }));
    }

    fn leave(&self, me: &ActorRef<HeartbeatMsg>, state: &mut HeartbeatState, reply: RpcReplyPort<Vec<PodBeat>>) {
        state.leaving = true;
        self.ctx.board.set_state(ID, "leaving");
        // A beat in flight must not land after the key is removed; renewals go on.
        state.task = None;
        self.spawn_tick(me, state);
        let ctx = self.ctx.clone();
        state.leave = Some(OwnedTask::spawn(async move {
            let budget = ctx.config.timing.heartbeat;
            let pods = &ctx.ports.pods;
            if let Err(e) = bounded(budget, pods.leave(&ctx.config.pod_id)).await {
                tracing::warn!(error = %e, "leaving the pod registry failed; the key expires");
            }
            let others = match bounded(budget, pods.live_pods()).await {
                Ok(live) => live,
                Err(_) => ctx.view.pods().unwrap_or_default(),
            };
            let others = others.into_iter().filter(|p| p.pod_id != ctx.config.pod_id).collect();
            let _ = reply.send(others);
        }));
    }
}

/// Leases still ours (the ledger applied the answer) whose key the renewal found
/// missing or held by another grant: only a store that lost keys does that to
/// a lease that was valid when the renewal was sent (its key outlives the
/// local validity by lock_delay).
fn amnesia_evidence(sent: &[(String, Lease)], lost: &[(String, LostCause)]) -> Option<String> {
    let found: Vec<String> = lost
        .iter()
        .filter(|(_, cause)| matches!(cause, LostCause::Missing | LostCause::Stolen))
        .filter_map(|(owner, cause)| {
            let lease = sent.iter().find(|(o, _)| o == owner).map(|(_, l)| l)?;
            Some(format!("{} {cause} ({owner})", slot_name(lease.pool, lease.slot)))
        })
        .collect();
    (!found.is_empty()).then(|| found.join(", "))
}

async fn bounded<T>(budget: Duration, call: impl Future<Output = Result<T, ClusterError>>) -> Result<T, ClusterError> {
    tokio::time::timeout(budget, call).await.unwrap_or_else(|_| Err(ClusterError::Unavailable("timed out".into())))
}

/// One tick's I/O: renewal, beat and live-pod read run together, each bounded
/// by the heartbeat period, so a slow store never stretches the renewal interval.
async fn tick(ctx: TreeContext, beat: Option<PodBeat>) -> TickReport {
    let started = Instant::now();
    let budget = ctx.config.timing.heartbeat;
    let sent = ctx.ledger.held();
    let leases: Vec<Lease> = sent.iter().map(|(_, l)| l.clone()).collect();
    let renew = async {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        tokio::time::timeout(budget, ctx.ports.leases.renew_many(&leases))
            .await
            .unwrap_or_else(|_| Err(LeaseError::Unavailable("renew_many timed out".into())))
    };
    let beat = async {
        match &beat {
            Some(b) => bounded(budget, ctx.ports.pods.beat(b)).await,
            None => Ok(()),
        }
    };
    let live = bounded(budget, ctx.ports.pods.live_pods());
    let (renewals, beat, live) = tokio::join!(renew, beat, live);
    TickReport { started, sent, renewals, beat, live }
}
