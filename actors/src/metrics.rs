//! The actors' metrics, through the `metrics` facade (the `cabine` crate
//! installs the Prometheus recorder). Names and labels live here only.

use std::time::Duration;

use crate::domain::ChannelId;

/// One poll cycle ended with `outcome` (`messages`, `empty`, `unknown_stream`, ...).
pub fn poll(channel: ChannelId, outcome: &'static str, took: Duration) {
    metrics::counter!("cabine_slot_polls_total", "channel" => channel.as_str(), "outcome" => outcome).increment(1);
    metrics::histogram!("cabine_slot_poll_seconds", "channel" => channel.as_str()).record(took.as_secs_f64());
}

/// A cycle that delivered a batch: the GET that read it, and the rest of the
/// cycle — lease check, gate, commit, hand-over — which is ours, not the protocol's.
pub fn delivered_cycle(channel: ChannelId, get: Duration, took: Duration) {
    metrics::histogram!("cabine_slot_get_seconds", "channel" => channel.as_str()).record(get.as_secs_f64());
    metrics::histogram!("cabine_slot_cycle_overhead_seconds", "channel" => channel.as_str())
        .record(took.saturating_sub(get).as_secs_f64());
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

/// Slots of a channel holding / on standby (cooldown included) on this pod.
pub fn slots(channel: ChannelId, holding: usize, standby: usize) {
    metrics::gauge!("cabine_slots", "channel" => channel.as_str(), "state" => "holding").set(holding as f64);
    metrics::gauge!("cabine_slots", "channel" => channel.as_str(), "state" => "standby").set(standby as f64);
}

/// A lease this pod held was lost.
pub fn lease_lost(cause: &'static str) {
    metrics::counter!("cabine_leases_lost_total", "cause" => cause).increment(1);
}

/// This pod found partial Redis amnesia (a locally valid lease's key missing or re-granted).
pub fn partial_amnesia() {
    metrics::counter!("cabine_lease_partial_amnesia_total").increment(1);
}

/// Rows the leader's sweeper republished.
pub fn republished(rows: usize) {
    metrics::counter!("cabine_inbound_republished_total").increment(rows as u64);
}

/// One intake step of the dispatcher (`pulled`, `inserted`, `duplicate`, `invalid`, `ack_failed`).
pub fn intake(step: &'static str, n: usize) {
    metrics::counter!("cabine_outbound_intake_total", "step" => step).increment(n as u64);
}

/// Whether the dispatcher stopped pulling (1) because too many rows are queued.
pub fn backpressure(on: bool) {
    metrics::gauge!("cabine_outbound_backpressure").set(if on { 1.0 } else { 0.0 });
}

/// Queued rows of one (channel, priority) at the last depth probe.
pub fn queue_depth(channel: ChannelId, priority: &'static str, queued: u64) {
    metrics::gauge!("cabine_outbound_queue_depth", "channel" => channel.as_str(), "priority" => priority)
        .set(queued as f64);
}

/// Parked outbound requests waiting for an operator (all channels).
pub fn parked(waiting: u64) {
    metrics::gauge!("cabine_outbound_parked").set(waiting as f64);
}

/// One batch a sender finished, by outcome (`accepted`, `server_error`, `breaker_open`, ...).
pub fn send_batch(channel: ChannelId, outcome: &'static str, messages: usize, took: Duration) {
    let c = channel.as_str();
    metrics::counter!("cabine_outbound_batches_total", "channel" => c, "outcome" => outcome).increment(1);
    metrics::counter!("cabine_outbound_messages_total", "channel" => c, "outcome" => outcome)
        .increment(messages as u64);
    metrics::histogram!("cabine_outbound_send_seconds", "channel" => c).record(took.as_secs_f64());
}

/// Time one step of a sender's turn took: `admit`, `take`, `draw` with its bucket waits (prepare,
/// overlapping the previous POST), `arm` (the gate write, during the previous POST), `record`, `count`,
/// `publish` (finish, in the background). The POST itself is `cabine_outbound_send_seconds`.
pub fn turn_step(channel: ChannelId, step: &'static str, took: Duration) {
    metrics::histogram!("cabine_outbound_turn_step_seconds", "channel" => channel.as_str(), "step" => step)
        .record(took.as_secs_f64());
}

/// Time one step of an intake round took (`pull`: waiting on the bus; `store`: insert and acknowledge each).
pub fn intake_step(step: &'static str, took: Duration) {
    metrics::histogram!("cabine_outbound_intake_step_seconds", "step" => step).record(took.as_secs_f64());
}

/// Send leases held by this pod's senders of a channel.
pub fn senders_holding(channel: ChannelId, holding: usize) {
    metrics::gauge!("cabine_outbound_senders_holding", "channel" => channel.as_str()).set(holding as f64);
}

/// The shared breaker's state of a channel as last read (0 closed, 1 degraded, 2 open, 3 half-open).
pub fn breaker_state(channel: ChannelId, code: u8) {
    metrics::gauge!("cabine_outbound_breaker_state", "channel" => channel.as_str()).set(f64::from(code));
}

/// An outcome could not be recorded within the patience (Postgres down): the claim is recovered later.
pub fn record_abandoned(channel: ChannelId, messages: usize) {
    metrics::counter!("cabine_outbound_record_abandoned_total", "channel" => channel.as_str())
        .increment(messages as u64);
}

/// Rows the janitor changed (`expired`, `recovered`, `flagged`, `republished`) or the confirmer applied.
pub fn outbound_upkeep(job: &'static str, n: usize) {
    metrics::counter!("cabine_outbound_upkeep_total", "job" => job).increment(n as u64);
}

/// A holding slot failed over (its cycles kept failing on this pod).
pub fn slot_failover(channel: ChannelId) {
    metrics::counter!("cabine_slot_failovers_total", "channel" => channel.as_str()).increment(1);
}

/// A standby over its fair share adopted a slot nobody took.
pub fn orphan_adopted(channel: ChannelId) {
    metrics::counter!("cabine_slot_orphans_adopted_total", "channel" => channel.as_str()).increment(1);
}

/// Slots of a channel sitting out a failover cooldown on this pod.
pub fn slots_cooling(channel: ChannelId, cooling: usize) {
    metrics::gauge!("cabine_slots", "channel" => channel.as_str(), "state" => "cooldown").set(cooling as f64);
}

fn alert_labels(channel: Option<ChannelId>, slot: Option<u8>) -> (&'static str, String) {
    (channel.map_or("", ChannelId::as_str), slot.map_or_else(String::new, |n| n.to_string()))
}

/// A watchdog alert is up (1) or down (0).
pub fn watchdog_alert(kind: &'static str, channel: Option<ChannelId>, slot: Option<u8>, on: bool) {
    let (channel, slot) = alert_labels(channel, slot);
    metrics::gauge!("cabine_watchdog_alert", "kind" => kind, "channel" => channel, "slot" => slot).set(if on {
        1.0
    } else {
        0.0
    });
}

/// A watchdog alert was raised.
pub fn watchdog_raised(kind: &'static str, channel: Option<ChannelId>, slot: Option<u8>) {
    let (channel, slot) = alert_labels(channel, slot);
    metrics::counter!("cabine_watchdog_alerts_total", "kind" => kind, "channel" => channel, "slot" => slot)
        .increment(1);
}

/// The channel-wide alert gauges at 0, so dashboards see them before any alert.
pub fn watchdog_ready(channels: &[ChannelId]) {
    for ch in channels {
        watchdog_alert("zero_active", Some(*ch), None, false);
        watchdog_alert("cap", Some(*ch), None, false);
        metrics::counter!("cabine_slot_failovers_total", "channel" => ch.as_str()).increment(0);
    }
    watchdog_alert("lag", None, None, false);
}

/// The outbound actors' metrics (dispatcher, senders, janitor, confirmer).
fn describe_outbound() {
    metrics::describe_counter!(
        "cabine_outbound_intake_total",
        "Outbound requests through the dispatcher's intake, by step (pulled, inserted, duplicate, invalid, ack_failed)."
    );
    metrics::describe_gauge!(
        "cabine_outbound_backpressure",
        "1 while the dispatcher stops pulling because outbound.max_queued rows wait; else 0."
    );
    metrics::describe_gauge!(
        "cabine_outbound_queue_depth",
        "Queued outbound rows at the last depth probe, by channel and priority."
    );
    metrics::describe_counter!(
        "cabine_outbound_batches_total",
        "Send batches (one POST each) finished, by channel and outcome."
    );
    metrics::describe_counter!(
        "cabine_outbound_messages_total",
        "Outbound messages in finished send batches, by channel and outcome."
    );
    metrics::describe_histogram!("cabine_outbound_send_seconds", "One POST to ICOM, by channel.");
    metrics::describe_histogram!(
        "cabine_outbound_turn_step_seconds",
        "One step of a sender's turn (admit, take, draw, record, count, publish_wait, publish), by channel."
    );
    metrics::describe_histogram!(
        "cabine_outbound_intake_step_seconds",
        "One step of an intake round (pull: waiting on the bus; store: insert and acknowledge)."
    );
    metrics::describe_gauge!("cabine_outbound_senders_holding", "Send leases held by this pod's senders, by channel.");
    metrics::describe_gauge!(
        "cabine_outbound_breaker_state",
        "The shared circuit breaker of a channel as last read: 0 closed, 1 degraded, 2 open, 3 half-open."
    );
    metrics::describe_counter!(
        "cabine_outbound_record_abandoned_total",
        "Sent messages whose outcome could not be recorded in time (Postgres down): their claims are recovered later."
    );
    metrics::describe_counter!(
        "cabine_outbound_upkeep_total",
        "Rows the janitor changed (expired, recovered, flagged, republished) or the confirmer applied, by job."
    );
}

/// Describes the actors' metrics and shows the restart counters at zero, so
/// dashboards see every series from the start.
pub fn describe() {
    metrics::describe_counter!("cabine_slot_polls_total", "Poll cycles of the stream slots, by outcome.");
    metrics::describe_histogram!(
        "cabine_slot_poll_seconds",
        "One poll cycle: GET, commit, hand-over to the publisher."
    );
    metrics::describe_histogram!(
        "cabine_slot_get_seconds",
        "The GET of a poll cycle that delivered a batch (the protocol's share of the cycle)."
    );
    metrics::describe_histogram!(
        "cabine_slot_cycle_overhead_seconds",
        "A delivering poll cycle minus its GET: lease check, gate, commit, hand-over (cabine's share)."
    );
    metrics::describe_counter!("cabine_inbound_messages_total", "Inbound messages by stage (received, persisted).");
    metrics::describe_counter!("cabine_actor_restarts_total", "Actors restarted by their supervisor, by kind.");
    metrics::describe_gauge!("cabine_slots", "Stream slots of this pod holding / on standby, per channel.");
    metrics::describe_counter!("cabine_leases_lost_total", "Leases this pod lost, by cause.");
    metrics::describe_counter!(
        "cabine_lease_partial_amnesia_total",
        "Renewals that found a locally valid lease's key missing or re-granted (Redis lost keys): each starts a quarantine."
    );
    metrics::describe_counter!("cabine_slot_failovers_total", "Slots handed over because their cycles kept failing.");
    metrics::describe_counter!("cabine_slot_orphans_adopted_total", "Free slots adopted beyond the fair share.");
    metrics::describe_gauge!("cabine_watchdog_alert", "Watchdog alerts up (1) or down (0), by kind, channel, slot.");
    metrics::describe_counter!("cabine_watchdog_alerts_total", "Watchdog alerts raised, by kind, channel, slot.");
    metrics::describe_counter!("cabine_inbound_republished_total", "Inbox rows the leader's sweep published again.");
    metrics::describe_gauge!(
        "cabine_outbound_parked",
        "Outbound requests parked (delivered more than outbound.max_deliver times without being stored), not reprocessed yet."
    );
    describe_outbound();
    describe_reconcile();
    for kind in ["slot", "channel", "leader", "lease-heartbeat", "sweeper", "watchdog", "reconciler"] {
        metrics::counter!("cabine_actor_restarts_total", "kind" => kind).increment(0);
    }
    // At zero from the start: a dashboard or an alert over them shows 0, not "no data".
    for cause in ["expired", "stolen", "missing", "amnesia", "unreachable", "send"] {
        metrics::counter!("cabine_leases_lost_total", "cause" => cause).increment(0);
    }
    // Until this pod reconciles a window (only the leader does): no critical finding of its own.
    metrics::gauge!("cabine_reconcile_last_critical").set(0.0);
}

fn describe_reconcile() {
    metrics::describe_counter!(
        "cabine_reconcile_windows_total",
        "Windows reconciled against the Central Bank's statement."
    );
    metrics::describe_counter!(
        "cabine_reconcile_statement_entries_total",
        "Entries of the statements (camt.053) the reconciled windows were compared with."
    );
    metrics::describe_counter!(
        "cabine_reconcile_settled_sends_total",
        "Sends whose status a statement settled (in doubt or unconfirmed: confirmed, timeout, rejected_by_spi)."
    );
    metrics::describe_counter!(
        "cabine_reconcile_discrepancies_total",
        "Discrepancies of each reconciled window (a re-run counts its window again), by kind and level."
    );
    metrics::describe_gauge!(
        "cabine_reconcile_last_window_end_seconds",
        "End (UNIX seconds) of the last window reconciled."
    );
    metrics::describe_gauge!("cabine_reconcile_last_critical", "CRITICAL discrepancies of the last window reconciled.");
    metrics::describe_counter!(
        "cabine_reconcile_failures_total",
        "Reconciliation runs that failed (no statement in time, a store or the bus unavailable); retried."
    );
}

/// One window reconciled: its statement's entries, discrepancies by kind, sends settled.
pub fn reconciled(w: &crate::ports::reconcile::WindowReport) {
    metrics::counter!("cabine_reconcile_windows_total").increment(1);
    metrics::counter!("cabine_reconcile_statement_entries_total").increment(w.statement_entries);
    metrics::counter!("cabine_reconcile_settled_sends_total").increment(w.settled_sends);
    for (kind, n) in &w.discrepancies {
        let (kind, level) = (kind.label(), kind.level().label());
        metrics::counter!("cabine_reconcile_discrepancies_total", "kind" => kind, "level" => level).increment(*n);
    }
    let to = w.to.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    metrics::gauge!("cabine_reconcile_last_window_end_seconds").set(to);
    metrics::gauge!("cabine_reconcile_last_critical").set(w.critical() as f64);
}

/// A reconciliation run that failed (retried).
pub fn reconcile_failed() {
    metrics::counter!("cabine_reconcile_failures_total").increment(1);
}
