//! Work hints between pods over core NATS (not JetStream: a late hint is worth
//! nothing): after a round stored new rows, the intake publishes the channel on
//! `{prefix}.hint.{ispb}.out`; every pod relays what it hears to its senders'
//! in-memory signal, so the pod holding a send slot sends rows another pod
//! stored now, not at its next `outbound.idle_poll`. Losing a hint (bus down,
//! slow consumer) costs one `idle_poll`, never a message.

use std::time::Duration;

use bytes::Bytes;
use cabine_actors::domain::ChannelId;
use cabine_actors::outbound::OutboundSignal;
use cabine_actors::ports::outbound_bus::WorkHints;
use futures::StreamExt;
use tokio::task::JoinHandle;

/// Publishes hints; never blocks the intake (each publish is its own task).
pub struct NatsWorkHints {
    client: async_nats::Client,
    subject: String,
}

impl NatsWorkHints {
    pub fn new(client: async_nats::Client, subject: String) -> Self {
        NatsWorkHints { client, subject }
    }
}

impl WorkHints for NatsWorkHints {
    fn rows_stored(&self, channel: ChannelId) {
        let (client, subject) = (self.client.clone(), self.subject.clone());
        tokio::spawn(async move {
            let outcome = match client.publish(subject, Bytes::from_static(channel.as_str().as_bytes())).await {
                Ok(()) => "sent",
                Err(e) => {
                    tracing::debug!(error = %e, "work hint not sent; the senders look at their idle_poll");
                    "failed"
                }
            };
            metrics::counter!("cabine_outbound_work_hints_total", "direction" => outcome).increment(1);
        });
    }
}

/// Relays every hint heard on `subject` to `signal` for the life of the pod,
/// subscribing again (after a second) whenever the subscription ends.
pub fn relay(client: async_nats::Client, subject: String, signal: OutboundSignal) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            match client.subscribe(subject.clone()).await {
                Ok(mut hints) => {
                    while let Some(hint) = hints.next().await {
                        let heard = std::str::from_utf8(&hint.payload).ok();
                        if let Some(channel) = ChannelId::ALL.into_iter().find(|c| Some(c.as_str()) == heard) {
                            signal.work(channel);
                            metrics::counter!("cabine_outbound_work_hints_total", "direction" => "received")
                                .increment(1);
                        }
                    }
                }
                Err(e) => tracing::debug!(error = %e, "work hints: subscribe failed; retrying"),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}
