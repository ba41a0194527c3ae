//! The HELP text of every metric the `cabine` crate records that its own
//! module does not describe where it is built (the lease, inbox, publisher,
//! ICOM and gate adapters do): readiness, Redis scripts, and the outbound
//! store, bus, bucket and breaker adapters. `tests/metric_help.rs` checks that
//! every metric of both crates has one.

/// Registers the descriptions with the installed recorder.
pub fn describe() {
    describe_readiness();
    describe_outbound_store();
    describe_outbound_bus();
    describe_redis();
    describe_incidents();
    describe_dict();
}

fn describe_dict() {
    metrics::describe_counter!(
        "cabine_dict_lookups_total",
        "DICT lookups answered to the bank core, by source (dict, cache, stale_cache; local for a refusal) and outcome (found, not_found, rate_limited, unavailable, malformed)."
    );
    metrics::describe_counter!(
        "cabine_dict_cache_total",
        "DICT cache reads by result: hit, miss, error (Redis unreachable)."
    );
    metrics::describe_histogram!("cabine_dict_request_seconds", "Seconds of one DICT request (GET entries/{Key}).");
    metrics::describe_gauge!(
        "cabine_dict_bucket_tokens",
        "Tokens of the cluster's mirror of a DICT bucket (policy), as the last admission or policy sync saw them."
    );
    metrics::describe_counter!(
        "cabine_dict_bucket_fail_open_total",
        "DICT lookups admitted unchecked because Redis could not be asked (fail-open: the DICT's own bucket still stands)."
    );
    metrics::describe_counter!(
        "cabine_dict_policy_syncs_total",
        "Resynchronisations of the DICT buckets from GET /policies/, by outcome (ok, failed)."
    );
}

fn describe_incidents() {
    metrics::describe_counter!(
        "cabine_incident_events_total",
        "Incidents (failovers, quarantines, breaker openings) for the incident log, by outcome: written, folded (a repeat within 30 s), dropped (queue full), failed."
    );
}

fn describe_readiness() {
    metrics::describe_gauge!(
        "cabine_ready",
        "1 when every dependency answered the last probe and the pod is not stopping."
    );
    metrics::describe_gauge!(
        "cabine_dependency_up",
        "1 when the dependency (redis, postgres, migrations, nats, jetstream) answered the last readiness probe."
    );
}

fn describe_outbound_store() {
    metrics::describe_counter!(
        "cabine_outbound_inserts_total",
        "Valid outbound requests stored, by outcome (inserted, duplicate)."
    );
    metrics::describe_counter!("cabine_outbound_invalid_total", "Outbound requests stored as invalid (never sent).");
    metrics::describe_counter!(
        "cabine_outbound_parked_total",
        "Outbound requests parked (past outbound.max_deliver or refused by the store)."
    );
    metrics::describe_counter!(
        "cabine_outbound_refused_rows_total",
        "Outbound rows Postgres refused (data errors), stored row by row as rejected_invalid with the raw body kept."
    );
    metrics::describe_counter!(
        "cabine_outbound_claims_recovered_total",
        "Outbound rows claimed for sending longer than timing.processing_timeout, returned to the queue."
    );
    metrics::describe_counter!(
        "cabine_outbound_unconfirmed_total",
        "Sent rows flagged for lacking a verdict after outbound.unconfirmed_after."
    );
    metrics::describe_counter!(
        "cabine_outbound_timeouts_total",
        "Outbound rows that reached their deadline never sent (timeout)."
    );
    metrics::describe_counter!(
        "cabine_outbound_in_doubt_total",
        "Outbound rows that reached their deadline after an attempt of unknown outcome (in_doubt)."
    );
    metrics::describe_counter!(
        "cabine_outbound_in_doubt_settled_total",
        "In-doubt rows settled by reconciliation, by resulting status."
    );
    metrics::describe_counter!(
        "cabine_outbound_verdicts_total",
        "SPI verdicts applied to outbound rows, by resulting status."
    );
    metrics::describe_counter!(
        "cabine_outbound_sent_by_verdict_total",
        "Rows moved to sent by a verdict that overtook the record of their 201."
    );
    metrics::describe_counter!(
        "cabine_outbound_stale_outcomes_total",
        "Send outcomes not recorded because the row had moved on (a verdict or recovery came first)."
    );
    metrics::describe_counter!(
        "cabine_outbound_reports_correlated_total",
        "Inbound pacs.002/admi.002 reports matched to outbound rows."
    );
    metrics::describe_counter!(
        "cabine_outbound_reports_unreadable_total",
        "Inbound reports whose reference could not be read."
    );
    metrics::describe_counter!(
        "cabine_outbound_reports_retried_total",
        "Inbound reports that matched no row yet, left for the next pass."
    );
    metrics::describe_counter!(
        "cabine_outbound_reports_unmatched_total",
        "Inbound reports given up on: they match no outbound row."
    );
}

fn describe_outbound_bus() {
    metrics::describe_counter!("cabine_outbound_pulled_total", "Outbound requests pulled from the work-queue stream.");
    metrics::describe_counter!(
        "cabine_outbound_results_published_total",
        "Outbound result events acknowledged by JetStream."
    );
    metrics::describe_counter!(
        "cabine_outbound_results_failed_total",
        "Outbound result events not acknowledged; the janitor republishes them."
    );
    metrics::describe_counter!(
        "cabine_outbound_results_republished_total",
        "Outbound result events published again by the janitor."
    );
    metrics::describe_counter!(
        "cabine_outbound_work_hints_total",
        "Work hints between pods (rows stored on a channel), by direction: sent, failed, received."
    );
}

fn describe_redis() {
    metrics::describe_counter!(
        "cabine_redis_errors_total",
        "Redis script calls that failed, by operation and kind (unavailable, fatal)."
    );
    metrics::describe_gauge!(
        "cabine_outbound_bucket_tokens",
        "Tokens left in the shared ICOM rate bucket of a channel at the last draw."
    );
    metrics::describe_counter!(
        "cabine_outbound_bucket_waits_total",
        "Bucket draws told to wait for a refill, by channel."
    );
    metrics::describe_counter!("cabine_outbound_bucket_errors_total", "Bucket draws that failed, by channel and kind.");
    metrics::describe_counter!(
        "cabine_outbound_breaker_transitions_total",
        "Shared circuit-breaker state changes seen by this pod, by channel and new state."
    );
}
