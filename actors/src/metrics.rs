//! The actors' metrics, through the `metrics` facade (the `cabine` crate
//! installs the Prometheus recorder). Names and labels live here only.

use std::time::Duration;

use crate::domain::ChannelId;

/// One poll cycle ended with `outcome` (`messages`, `empty`, `unknown_stream`, ...).
pub fn poll(channel: ChannelId, outcome: &'static str, took: Duration) {
    metrics::counter!("cabine_slot_polls_total", "channel" => channel.as_str(), "outcome" => outcome).increment(1);
    metrics::histogram!("cabine_slot_poll_seconds", "channel" => channel.as_str()).record(took.as_secs_f64());
}

/// A committed batch: received from ICOM, newly persisted, already there, malformed.
pub fn batch(channel: ChannelId, received: usize, persisted: usize, duplicates: usize, malformed: usize) {
    let c = channel.as_str();
    metrics::counter!("cabine_inbound_messages_total", "channel" => c, "stage" => "received")
        .increment(received as u64);
    metrics::counter!("cabine_inbound_messages_total", "channel" => c, "stage" => "persisted")
        .increment(persisted as u64);
    metrics::counter!("cabine_inbound_duplicates_total", "channel" => c).increment(duplicates as u64);
    metrics::counter!("cabine_inbound_malformed_total", "channel" => c).increment(malformed as u64);
}

/// A supervisor restarted one of its children.
pub fn restart(kind: &'static str) {
    metrics::counter!("cabine_actor_restarts_total", "kind" => kind).increment(1);
}

/// Slots of a channel holding / on standby on this pod.
pub fn slots(channel: ChannelId, holding: usize, standby: usize) {
    metrics::gauge!("cabine_slots", "channel" => channel.as_str(), "state" => "holding").set(holding as f64);
    metrics::gauge!("cabine_slots", "channel" => channel.as_str(), "state" => "standby").set(standby as f64);
}

/// A lease this pod held was lost.
pub fn lease_lost(cause: &'static str) {
    metrics::counter!("cabine_leases_lost_total", "cause" => cause).increment(1);
}

/// Rows the leader's sweeper republished.
pub fn republished(rows: usize) {
    metrics::counter!("cabine_inbound_republished_total").increment(rows as u64);
}

/// Describes the actors' metrics and shows the restart counters at zero, so
/// dashboards see every series from the start.
pub fn describe() {
    metrics::describe_counter!("cabine_slot_polls_total", "Poll cycles of the stream slots, by outcome.");
    metrics::describe_histogram!(
        "cabine_slot_poll_seconds",
        "One poll cycle: GET, commit, hand-over to the publisher."
    );
    metrics::describe_counter!("cabine_inbound_messages_total", "Inbound messages by stage (received, persisted).");
    metrics::describe_counter!("cabine_actor_restarts_total", "Actors restarted by their supervisor, by kind.");
    metrics::describe_gauge!("cabine_slots", "Stream slots of this pod holding / on standby, per channel.");
    metrics::describe_counter!("cabine_leases_lost_total", "Leases this pod lost, by cause.");
    for kind in ["slot", "channel", "leader", "lease-heartbeat", "sweeper"] {
        metrics::counter!("cabine_actor_restarts_total", "kind" => kind).increment(0);
    }
}
