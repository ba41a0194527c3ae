//! The outbound bus ports (NATS JetStream): requests pulled from the shared
//! durable consumer, acknowledged only once stored; result events published
//! from the store's outbox with a `Nats-Msg-Id` so the core sees each once.

use std::str::FromStr;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::domain::ChannelId;
use crate::ports::outbound::{InvalidOutbound, NewOutbound};

/// What the bank's core hears on `{prefix}.out.result.{ispb}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResultStatus {
    Accepted,
    Sent,
    Confirmed,
    Rejected,
    RejectedBySpi,
    RejectedInvalid,
    Timeout,
    InDoubt,
    Dead,
}

impl ResultStatus {
    pub const ALL: [ResultStatus; 9] = [
        ResultStatus::Accepted,
        ResultStatus::Sent,
        ResultStatus::Confirmed,
        ResultStatus::Rejected,
        ResultStatus::RejectedBySpi,
        ResultStatus::RejectedInvalid,
        ResultStatus::Timeout,
        ResultStatus::InDoubt,
        ResultStatus::Dead,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ResultStatus::Accepted => "accepted",
            ResultStatus::Sent => "sent",
            ResultStatus::Confirmed => "confirmed",
            ResultStatus::Rejected => "rejected",
            ResultStatus::RejectedBySpi => "rejected_by_spi",
            ResultStatus::RejectedInvalid => "rejected_invalid",
            ResultStatus::Timeout => "timeout",
            ResultStatus::InDoubt => "in_doubt",
            ResultStatus::Dead => "dead",
        }
    }
}

impl FromStr for ResultStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        ResultStatus::ALL.into_iter().find(|st| st.as_str() == s).ok_or_else(|| format!("unknown result status {s:?}"))
    }
}

/// One state change the core is told about, stored before it is published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResultEvent {
    /// The history line's id (the outbox key).
    pub id: i64,
    pub msg_id: Option<String>,
    pub ingress_ref: Option<String>,
    pub channel: Option<ChannelId>,
    pub status: ResultStatus,
    /// Send attempts so far (cumulative; never reset by a reprocess).
    pub attempt: u32,
    pub at: SystemTime,
    pub resource_ids: Vec<String>,
    /// What the history line says: the error or verdict reason, or the ResourceId when sent.
    pub detail: Option<String>,
}

impl ResultEvent {
    /// `Nats-Msg-Id`: `{msg_id}:{status}:{attempt}` (an invalid request without
    /// MsgId uses its ingress ref, else `row-{id}`), so a republished event is seen once.
    pub fn dedup_id(&self) -> String {
        let key = match (&self.msg_id, &self.ingress_ref) {
            (Some(m), _) => m.clone(),
            (None, Some(r)) => r.clone(),
            (None, None) => format!("event-{}", self.id),
        };
        format!("{key}:{}:{}", self.status.as_str(), self.attempt)
    }
}

/// One request read from the bus: valid, or to be kept as `rejected_invalid`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutboundRequest {
    Valid(NewOutbound),
    Invalid(InvalidOutbound),
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IngressError {
    /// Bus unreachable or slow: pull again later; unacknowledged requests are redelivered.
    #[error("outbound ingress unavailable: {0}")]
    Unavailable(String),
    /// The stream or consumer is missing or misconfigured: escalate.
    #[error("outbound ingress fatal: {0}")]
    Fatal(String),
}

/// Acknowledges one pulled request; called only after it is stored.
#[async_trait::async_trait]
pub trait IngressAck: Send + 'static {
    async fn ack(self: Box<Self>) -> Result<(), IngressError>;
}

/// A request as it came off the bus, byte for byte: what a parked copy keeps
/// and what a reprocess parses again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// `{stream}:{sequence}:{published ns}`: the key of a parked copy.
    pub ingress_ref: Option<String>,
    pub subject: String,
    /// The `Cabine-*` headers, as received (name, value).
    pub headers: Vec<(String, String)>,
    pub raw: Bytes,
    /// How often the bus has delivered it, this time included (1 the first time).
    pub deliveries: u32,
}

impl Arrival {
    /// A header's value, the name compared case-insensitively.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.clone())
    }
}

/// A pulled request (parsed), the bus message it was read from, and the handle that acknowledges it.
pub struct Pulled {
    pub request: OutboundRequest,
    pub arrival: Arrival,
    pub ack: Box<dyn IngressAck>,
}

impl std::fmt::Debug for Pulled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pulled")
            .field("request", &self.request)
            .field("deliveries", &self.arrival.deliveries)
            .finish_non_exhaustive()
    }
}

/// The durable pull consumer shared by every pod.
#[async_trait::async_trait]
pub trait OutboundIngress: Send + Sync + 'static {
    /// Up to `max` requests, waiting at most `wait` for the first ones.
    async fn pull(&self, max: usize, wait: Duration) -> Result<Vec<Pulled>, IngressError>;
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResultsError {
    /// Bus or database unreachable: the events stay unpublished; the sweep retries.
    #[error("results publisher unavailable: {0}")]
    Unavailable(String),
}

/// Publishes result events and marks them published in the outbox.
#[async_trait::async_trait]
pub trait ResultSink: Send + Sync + 'static {
    /// Publishes freshly stored events (both awaits), then marks them published.
    /// On error the unpublished ones are left for [`ResultSink::sweep`].
    async fn publish(&self, events: &[ResultEvent]) -> Result<usize, ResultsError>;
    /// Republishes events unpublished for longer than `older_than`, at most `max`.
    async fn sweep(&self, older_than: Duration, max: u32) -> Result<usize, ResultsError>;
}

/// Tells every pod's senders that rows were committed on a channel, so a
/// sender of another pod sends them now rather than at its next `idle_poll`.
/// A hint only: Postgres is the truth, and a lost hint costs one `idle_poll`.
/// Never blocks the intake.
pub trait WorkHints: Send + Sync + 'static {
    fn rows_stored(&self, channel: ChannelId);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_names_round_trip() {
        for s in ResultStatus::ALL {
            assert_eq!(s.as_str().parse::<ResultStatus>().unwrap(), s);
        }
    }

    #[test]
    fn dedup_ids_follow_msg_id_status_attempt() {
        let ev = ResultEvent {
            id: 7,
            msg_id: Some("M1".into()),
            ingress_ref: Some("S:3".into()),
            channel: Some(ChannelId::Cpm),
            status: ResultStatus::RejectedBySpi,
            attempt: 2,
            at: SystemTime::UNIX_EPOCH,
            resource_ids: vec![],
            detail: None,
        };
        assert_eq!(ev.dedup_id(), "M1:rejected_by_spi:2");
        let invalid = ResultEvent { msg_id: None, status: ResultStatus::RejectedInvalid, attempt: 0, ..ev.clone() };
        assert_eq!(invalid.dedup_id(), "S:3:rejected_invalid:0");
        let bare = ResultEvent { ingress_ref: None, ..invalid };
        assert_eq!(bare.dedup_id(), "event-7:rejected_invalid:0");
    }
}
