//! The trickle of traffic under the faults: inbound pacs.008 injected into the
//! simulator at a steady rate (its control API, untouched by any fault), and
//! outbound pacs.008 published on the outbound work-queue stream as the bank's
//! core does, each MsgId counted as published once its PubAck came back; a
//! publish that failed (NATS down) is retried on the next tick with the same
//! body. Both stop when told and hand back what they did.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::harness::outbound::{OutboundFeed, Pacs008Maker, Request, msg_id_of};
use crate::harness::{LocalCluster, SimControl};

/// Bound on one inject call, and on one round of publications with their PubAcks.
const CALL_WITHIN: Duration = Duration::from_secs(5);
const INBOUND_TICK: Duration = Duration::from_millis(50);
const OUTBOUND_TICK: Duration = Duration::from_millis(100);

/// What the inbound injector did.
#[derive(Debug, Default)]
pub struct InboundTally {
    /// ResourceIds the simulator queued for us.
    pub injected: usize,
    /// Inject calls that failed or timed out (their messages were never queued).
    pub errors: u64,
}

/// What the outbound publisher did.
#[derive(Debug, Default)]
pub struct OutboundTally {
    /// MsgIds whose PubAck came back: the bus has them.
    pub published: HashSet<String>,
    /// Publications that failed or went unacknowledged (each retried later).
    pub errors: u64,
    /// Bodies still waiting for a successful publish when the traffic stopped.
    pub unpublished: usize,
}

/// The running traffic.
pub struct Traffic {
    cancel: CancellationToken,
    inbound: JoinHandle<InboundTally>,
    outbound: Option<JoinHandle<OutboundTally>>,
}

impl Traffic {
    /// Starts injecting `rate` inbound messages per second and publishing
    /// `outbound_rate` outbound ones (0: none).
    pub fn start(c: &LocalCluster, rate: f64, outbound_rate: f64) -> Traffic {
        let cancel = CancellationToken::new();
        let inbound = tokio::spawn(inject(c.sim.control.clone(), rate, cancel.clone()));
        let outbound = (outbound_rate > 0.0).then(|| {
            let maker = Pacs008Maker::new(&c.settings.cluster.ispb);
            tokio::spawn(publish(OutboundFeed::of(c), maker, outbound_rate, cancel.clone()))
        });
        Traffic { cancel, inbound, outbound }
    }

    /// Stops both and returns their tallies.
    pub async fn stop(self) -> (InboundTally, OutboundTally) {
        self.cancel.cancel();
        let inbound = self.inbound.await.unwrap_or_default();
        let outbound = match self.outbound {
            Some(task) => task.await.unwrap_or_default(),
            None => OutboundTally::default(),
        };
        (inbound, outbound)
    }
}

/// How many messages are due `elapsed` into a run at `rate` per second.
fn due(elapsed: Duration, rate: f64) -> usize {
    (elapsed.as_secs_f64() * rate) as usize
}

async fn inject(control: SimControl, rate: f64, cancel: CancellationToken) -> InboundTally {
    let mut tally = InboundTally::default();
    let started = Instant::now();
    let mut tick = tokio::time::interval(INBOUND_TICK);
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut asked = 0;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return tally,
            _ = tick.tick() => {}
        }
        let now_due = due(started.elapsed(), rate);
        if now_due <= asked {
            continue;
        }
        match tokio::time::timeout(CALL_WITHIN, control.inject(now_due - asked, "pacs008")).await {
            Ok(Ok(ids)) => tally.injected += ids.len(),
            _ => tally.errors += 1,
        }
        // A failed call is not made up for: the rate stays the rate.
        asked = now_due;
    }
}

async fn publish(feed: OutboundFeed, maker: Pacs008Maker, rate: f64, cancel: CancellationToken) -> OutboundTally {
    let mut tally = OutboundTally::default();
    let mut waiting: VecDeque<Bytes> = VecDeque::new();
    let started = Instant::now();
    let mut tick = tokio::time::interval(OUTBOUND_TICK);
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut made = 0;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tick.tick() => {}
        }
        let now_due = due(started.elapsed(), rate);
        waiting.extend((made..now_due).map(|i| maker.body(i)));
        made = made.max(now_due);
        let round: Vec<Bytes> = waiting.drain(..).collect();
        for body in publish_round(&feed, round, &mut tally).await {
            waiting.push_back(body);
        }
    }
    tally.unpublished = waiting.len();
    tally
}

/// Publishes every body, then awaits every PubAck, all within one bound; the
/// bodies that did not make it.
async fn publish_round(feed: &OutboundFeed, round: Vec<Bytes>, tally: &mut OutboundTally) -> Vec<Bytes> {
    let deadline = Instant::now() + CALL_WITHIN;
    let mut failed = Vec::new();
    let mut acks = Vec::with_capacity(round.len());
    for body in round {
        match tokio::time::timeout_at(deadline, feed.send(body.clone(), Request::default())).await {
            Ok(Ok(ack)) => acks.push((body, ack)),
            _ => failed.push(body),
        }
    }
    for (body, ack) in acks {
        match tokio::time::timeout_at(deadline, ack).await {
            Ok(Ok(_)) => {
                if let Some(id) = msg_id_of(&body) {
                    tally.published.insert(id);
                }
            }
            _ => failed.push(body),
        }
    }
    tally.errors += failed.len() as u64;
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_due_count_follows_the_rate() {
        assert_eq!(due(Duration::from_millis(1500), 100.0), 150);
        assert_eq!(due(Duration::ZERO, 100.0), 0);
        assert_eq!(due(Duration::from_secs(10), 0.5), 5);
    }
}
