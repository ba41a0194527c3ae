//! The ICOM stream port: one connection, one request at a time (`&mut self`),
//! typed outcomes. The wire format itself is known only to `cabine::icom`.

use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::domain::ChannelId;

/// What the envelope says, when it could be read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageMeta {
    /// `AppHdr/MsgDefIdr`, e.g. `pacs.008.spi.1.16`.
    pub msg_def: Option<String>,
    /// `AppHdr/BizMsgIdr`.
    pub biz_msg_id: Option<String>,
    /// `Document/*/GrpHdr/MsgId`.
    pub msg_id: Option<String>,
    /// First `EndToEndId` of the document, if any.
    pub end_to_end_id: Option<String>,
    /// `AppHdr/Fr` and `AppHdr/To` ISPBs.
    pub from: Option<String>,
    pub to: Option<String>,
}

impl MessageMeta {
    /// Message type for bus subjects: `pacs.008` from `pacs.008.spi.1.16`, else `unknown`.
    pub fn msg_type(&self) -> &str {
        self.msg_def.as_deref().and_then(|d| d.match_indices('.').nth(1).map(|(i, _)| &d[..i])).unwrap_or("unknown")
    }
}

/// One message read from a stream: its raw bytes always, its envelope when parseable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InboundMessage {
    /// `PI-ResourceId` of the part (or of the response for a single message).
    pub resource_id: String,
    pub raw: Bytes,
    pub meta: MessageMeta,
    /// `Some(reason)` when the XML could not be read or the part broke a rule:
    /// it is still persisted (status `malformed`) and acknowledged.
    pub malformed: Option<String>,
}

/// Outcome of `start` / `next` on a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PollOutcome {
    /// A batch (1..=10). Following `pull_next` acknowledges it.
    Messages { batch: Vec<InboundMessage>, pull_next: String },
    /// Nothing to deliver within the server's hold (204).
    Empty { pull_next: String },
    /// 429 on start: the participant already has its streams open.
    TooManyStreams,
    /// 404 / 410: the stream or the token is unknown (expired): start a new one.
    UnknownStream,
    /// 429 with an optional `Retry-After`.
    RateLimited { retry_after: Option<Duration> },
    /// Another 4xx: not our transport's fault; carries the RFC 7807 body if any.
    Rejected { status: u16, problem: Option<String> },
    /// 5xx.
    ServerError { status: u16 },
    /// No complete response within the request timeout.
    Timeout,
    /// Connection refused, reset, TLS failure, malformed response framing.
    Transport(String),
}

impl PollOutcome {
    /// Label for metrics and status pages.
    pub fn label(&self) -> &'static str {
        match self {
            PollOutcome::Messages { .. } => "messages",
            PollOutcome::Empty { .. } => "empty",
            PollOutcome::TooManyStreams => "too_many_streams",
            PollOutcome::UnknownStream => "unknown_stream",
            PollOutcome::RateLimited { .. } => "rate_limited",
            PollOutcome::Rejected { .. } => "rejected",
            PollOutcome::ServerError { .. } => "server_error",
            PollOutcome::Timeout => "timeout",
            PollOutcome::Transport(_) => "transport",
        }
    }

    /// True when the server answered (whatever it said): the request is no
    /// longer in flight there. A timeout or a broken connection may leave it so.
    pub fn answered(&self) -> bool {
        !matches!(self, PollOutcome::Timeout | PollOutcome::Transport(_))
    }
}

/// Outcome of `close` (DELETE on the pull-next).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CloseOutcome {
    /// 200, or 410 (already gone): treated as success.
    Closed,
    Failed(String),
}

/// One ICOM connection of one slot. `&mut self` makes "one request at a time" structural.
#[async_trait::async_trait]
pub trait IcomStream: Send + 'static {
    async fn start(&mut self) -> PollOutcome;
    async fn next(&mut self, pull_next: &str) -> PollOutcome;
    async fn close(&mut self, pull_next: &str) -> CloseOutcome;
}

/// Opens a fresh connection for a slot that has just been granted.
pub trait IcomConnector: Send + Sync + 'static {
    fn stream(&self, channel: ChannelId) -> Box<dyn IcomStream>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msg_type_is_the_first_two_segments() {
        let meta = MessageMeta { msg_def: Some("pacs.008.spi.1.16".into()), ..Default::default() };
        assert_eq!(meta.msg_type(), "pacs.008");
        assert_eq!(MessageMeta::default().msg_type(), "unknown");
        let odd = MessageMeta { msg_def: Some("admi".into()), ..Default::default() };
        assert_eq!(odd.msg_type(), "unknown");
    }
}
