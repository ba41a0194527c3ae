//! The pod's drain (SIGTERM), run by Root in a spawned task within
//! `drain_time`: leave the pod registry first (so other pods' fair share grows
//! and they take the slots), release the leader lease, then every slot hands
//! over — or closes its stream when no other live pod runs that slot. Whatever
//! has not finished by the deadline is released by force. Meanwhile the
//! outbound dispatcher stops pulling and every sender finishes (and records)
//! the send in flight, then releases its send lease.

use ractor::ActorRef;
use ractor::rpc::CallResult;
use tokio::time::Instant;

use super::DrainReport;
use super::channel::ChannelMsg;
use super::context::TreeContext;
use super::exits;
use super::heartbeat::HeartbeatMsg;
use super::leader::LeaderMsg;
use super::root::tally;
use crate::outbound::dispatcher::DispatcherMsg;
use crate::outbound::sender::SenderDrain;
use crate::outbound::senders::SendChannelMsg;
use crate::ports::PodBeat;

/// Time for a channel's answer to arrive after the slots' deadline.
const SLACK: std::time::Duration = std::time::Duration::from_millis(200);

/// The outbound actors a drain talks to.
pub struct OutboundRefs {
    pub dispatcher: Option<ActorRef<DispatcherMsg>>,
    pub senders: Vec<ActorRef<SendChannelMsg>>,
}

pub async fn run(
    ctx: TreeContext,
    heartbeat: Option<ActorRef<HeartbeatMsg>>,
    leader: Option<ActorRef<LeaderMsg>>,
    channels: Vec<ActorRef<ChannelMsg>>,
    outbound: OutboundRefs,
) -> DrainReport {
    let started = Instant::now();
    let deadline = started + ctx.config.timing.drain_time;
    let left = || Some(deadline.saturating_duration_since(Instant::now()));
    let others = leave(&ctx, heartbeat, left()).await;
    let leader_done = async {
        if let Some(leader) = leader {
            let _ = leader.call(LeaderMsg::Drain, left()).await;
        }
    };
    // A channel answers by the deadline with what its slots said; a little slack for the answer.
    let ask = move |reply| ChannelMsg::Drain { others: others.clone(), deadline, reply };
    let slots_done = async { exits::ask_all(channels, left().map(|d| d + SLACK), ask).await.concat() };
    let ((), outcomes, (dispatcher_stopped, sends)) =
        tokio::join!(leader_done, slots_done, drain_outbound(outbound, deadline));
    let mut report = DrainReport::default();
    tally(&mut report, &outcomes);
    report.dispatcher_stopped = dispatcher_stopped;
    report.senders_released = sends.iter().filter(|s| s.released).count();
    report.sends_finished = sends.iter().filter(|s| s.finished_send).count();
    let per_channel = ctx.config.outbound.as_ref().map_or(0, |o| usize::from(o.senders_per_channel.get()));
    report.senders_unanswered = (per_channel * ctx.config.channels.len()).saturating_sub(sends.len());
    let expected = ctx.config.channels.len() * usize::from(ctx.config.stream_pool.get());
    report.unanswered = expected.saturating_sub(outcomes.len());
    let leftovers = ctx.ledger.take_owned(|_| true);
    report.forced = leftovers.len();
    ctx.release(leftovers).await;
    report.took_ms = started.elapsed().as_millis() as u64;
    report
}

/// Stops the dispatcher's pulls and drains every sender, by `deadline`.
async fn drain_outbound(refs: OutboundRefs, deadline: Instant) -> (bool, Vec<SenderDrain>) {
    let left = || Some(deadline.saturating_duration_since(Instant::now()));
    let dispatcher = async {
        match refs.dispatcher {
            Some(d) => matches!(d.call(DispatcherMsg::Drain, left()).await, Ok(CallResult::Success(()))),
            None => false,
        }
    };
    let ask = move |reply| SendChannelMsg::Drain { deadline, reply };
    let senders = async { exits::ask_all(refs.senders, left().map(|d| d + SLACK), ask).await.concat() };
    tokio::join!(dispatcher, senders)
}

/// Stops the heartbeat's beats and removes this pod's key; the other live pods.
async fn leave(
    ctx: &TreeContext,
    heartbeat: Option<ActorRef<HeartbeatMsg>>,
    budget: Option<std::time::Duration>,
) -> Vec<PodBeat> {
    if let Some(hb) = heartbeat
        && let Ok(CallResult::Success(others)) = hb.call(HeartbeatMsg::Leave, budget).await
    {
        return others;
    }
    let _ = ctx.ports.pods.leave(&ctx.config.pod_id).await;
    ctx.view.pods().unwrap_or_default().into_iter().filter(|p| p.pod_id != ctx.config.pod_id).collect()
}
