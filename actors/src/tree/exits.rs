//! What every supervisor does around a child's exit, written once: book it
//! ([`Supervision::plan`]), give back the leases the child's subtree held
//! (ractor runs no `post_stop` on failure, so the supervisor must), show the
//! restart on the board and in metrics — "restarting" only when a restart is
//! planned — and hand the plan back for the supervisor to carry out. Also the
//! drain fan-out: ask every child, collect the answers that come in time.

use std::hash::Hash;
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{ActorRef, Message, RpcReplyPort, SupervisionEvent};
use tokio::task::JoinSet;

use super::context::TreeContext;
use crate::supervision::{Plan, Supervision};

/// A supervisor's key for one child.
pub trait ChildKey: Clone + Eq + Hash {
    /// Status id (`slot/cpm/3`).
    fn id(&self) -> String;
    /// Metric label of its kind.
    fn kind(&self) -> &'static str;
    /// True for ledger owners in this child's subtree (their leases are released on exit).
    fn owns(&self, owner: &str) -> bool;
}

/// Books `event`, cleans up after the exited child, returns what to do next.
pub fn settle<K: ChildKey>(
    ctx: &TreeContext,
    supervision: &mut Supervision<K>,
    event: &SupervisionEvent,
    draining: bool,
) -> Plan<K> {
    let (exit, plan) = supervision.plan(event, draining);
    let Some(exit) = exit else { return plan };
    let plan = match plan {
        Plan::Escalate(why) => Plan::Escalate(format!("{}: {why}", exit.key.id())),
        other => other,
    };
    let leases = ctx.ledger.take_owned(|owner| exit.key.owns(owner));
    ctx.release_in_background(leases);
    if let Some((counted, why)) = exit.restart {
        let id = exit.key.id();
        ctx.board.count_restart(&id);
        crate::metrics::restart(exit.key.kind());
        if counted {
            tracing::warn!(actor = %id, %why, "actor failed");
            ctx.board.set_error(&id, why);
        }
        if matches!(plan, Plan::SpawnNow(_) | Plan::Later { .. }) {
            ctx.board.set_state(&id, "restarting");
        }
    }
    plan
}

/// Asks every child with `ask` and returns the answers that came within `budget`.
pub async fn ask_all<M, R>(
    children: Vec<ActorRef<M>>,
    budget: Option<Duration>,
    ask: impl Fn(RpcReplyPort<R>) -> M + Clone + Send + 'static,
) -> Vec<R>
where
    M: Message,
    R: Send + 'static,
{
    let mut calls = JoinSet::new();
    for child in children {
        let ask = ask.clone();
        calls.spawn(async move { child.call(ask, budget).await });
    }
    let mut answers = Vec::new();
    while let Some(done) = calls.join_next().await {
        if let Ok(Ok(CallResult::Success(answer))) = done {
            answers.push(answer);
        }
    }
    answers
}
