//! The publisher's Prometheus series: what reached the bus, what failed or was
//! left to the sweep, the queue depth and how far publication lags behind.

/// Which path published a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// Handed over by a slot right after its commit.
    Live,
    /// Found unpublished by the republish sweep.
    Sweep,
}

impl Path {
    pub fn as_str(self) -> &'static str {
        match self {
            Path::Live => "live",
            Path::Sweep => "sweep",
        }
    }
}

pub const PUBLISHED: &str = "cabine_inbound_published_total";
pub const BUS_DUPLICATES: &str = "cabine_inbound_publish_duplicates_total";
pub const FAILURES: &str = "cabine_inbound_publish_failures_total";
pub const DEFERRED: &str = "cabine_inbound_publish_deferred_total";
pub const QUEUE_DEPTH: &str = "cabine_inbound_publish_queue_depth";
pub const OLDEST_UNPUBLISHED: &str = "cabine_inbound_oldest_unpublished_seconds";
pub const LAG: &str = "cabine_inbound_publication_lag_seconds";

pub fn describe() {
    metrics::describe_counter!(PUBLISHED, "Inbox rows acknowledged by JetStream (label path: live or sweep).");
    metrics::describe_counter!(BUS_DUPLICATES, "Publications JetStream recognised as duplicates (Nats-Msg-Id).");
    metrics::describe_counter!(
        FAILURES,
        "Publications or publish marks that failed (label reason); the sweep retries."
    );
    metrics::describe_counter!(DEFERRED, "Committed rows left to the republish sweep because the bus was down.");
    metrics::describe_gauge!(QUEUE_DEPTH, "Committed rows waiting for the publisher.");
    metrics::describe_gauge!(OLDEST_UNPUBLISHED, "Age of the oldest committed row not yet on the bus (0: none).");
    metrics::describe_histogram!(LAG, "Commit to PubAck, per published row (label path).");
}
