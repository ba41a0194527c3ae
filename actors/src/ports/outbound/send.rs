//! What happened to each message of a claimed batch, and how an ICOM HTTP
//! status maps to it.

use std::time::Duration;

use crate::ports::outbound_bus::ResultEvent;

/// What happened to one message of a claimed batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendResult {
    /// 201: stored by ICOM under this ResourceId.
    Sent { resource_id: String },
    /// A permanent 4xx (400/403/404/411/413/415…): this POST was not stored;
    /// never retried. `rejected`, or `in_doubt` when an earlier attempt may
    /// have stored the message.
    Rejected { status: u16, reason: String },
    /// 429: back to the queue after `retry_after`, not counted as an attempt.
    RateLimited { retry_after: Option<Duration> },
    /// 5xx, timeout, transport: maybe stored; resend the same MsgId after a backoff
    /// with full jitter; `dead` after `poison_attempts`; past the deadline the
    /// row is `in_doubt`, never `timeout` (the SPI may hold it).
    Failed { reason: String },
    /// Never sent (no lease, no tokens, breaker open, stopping): back to the queue
    /// after `retry_after`, not an attempt.
    NotSent { retry_after: Duration, reason: String },
}

/// How an ICOM HTTP status maps to a [`SendResult`] kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusClass {
    Created,
    Permanent,
    RateLimited,
    Retry,
}

impl StatusClass {
    /// 2xx created; 429 rate-limited; 408 and 5xx (and anything unexpected) retried;
    /// any other 4xx permanent (ICOM did not store it).
    pub fn of(status: u16) -> StatusClass {
        match status {
            200..=299 => StatusClass::Created,
            429 => StatusClass::RateLimited,
            408 => StatusClass::Retry,
            400..=499 => StatusClass::Permanent,
            _ => StatusClass::Retry,
        }
    }
}

/// What [`OutboundStore::record`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recorded {
    pub events: Vec<ResultEvent>,
    /// MsgIds whose outcome was ignored: their claim was recovered (or they were
    /// confirmed) meanwhile.
    pub stale: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_what_icom_did() {
        assert_eq!(StatusClass::of(201), StatusClass::Created);
        for s in [400, 403, 404, 411, 413, 415] {
            assert_eq!(StatusClass::of(s), StatusClass::Permanent, "{s}");
        }
        assert_eq!(StatusClass::of(429), StatusClass::RateLimited);
        for s in [408, 500, 502, 503, 504] {
            assert_eq!(StatusClass::of(s), StatusClass::Retry, "{s}");
        }
    }
}
