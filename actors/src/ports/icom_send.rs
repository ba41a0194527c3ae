//! The ICOM send port: one connection owned by one sender slot, one request at
//! a time (`&mut self`), a typed reply per POST of 1..=10 messages. A fresh
//! connection is opened per send lease. The wire format is known only to
//! `cabine::icom`.

use std::time::Duration;

use bytes::Bytes;

use crate::domain::ChannelId;

/// What ICOM answered to one POST.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendReply {
    /// 201: every message stored, one ResourceId each, in order.
    Accepted { resource_ids: Vec<String> },
    /// 429 with an optional `Retry-After`: nothing stored.
    RateLimited { retry_after: Option<Duration> },
    /// Another 4xx: nothing stored; `reason` carries the RFC 7807 summary if any.
    Rejected { status: u16, reason: String },
    /// 5xx: maybe stored; resend the same MsgIds later.
    ServerError { status: u16 },
    /// No complete answer within the send timeout: maybe stored.
    Timeout,
    /// Refused, reset, TLS or framing failure: maybe stored.
    Transport(String),
}

impl SendReply {
    /// Label for metrics and status pages.
    pub fn label(&self) -> &'static str {
        match self {
            SendReply::Accepted { .. } => "accepted",
            SendReply::RateLimited { .. } => "rate_limited",
            SendReply::Rejected { .. } => "rejected",
            SendReply::ServerError { .. } => "server_error",
            SendReply::Timeout => "timeout",
            SendReply::Transport(_) => "transport",
        }
    }

    /// True when the server answered (whatever it said): the POST is no longer
    /// in flight there. A timeout or a broken connection may leave it so.
    pub fn answered(&self) -> bool {
        !self.breaks_connection()
    }

    /// True when the connection should be dropped and a fresh one opened.
    pub fn breaks_connection(&self) -> bool {
        matches!(self, SendReply::Timeout | SendReply::Transport(_))
    }
}

/// The batch itself cannot be put on the wire: nothing was sent.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SendRefused {
    /// Over a wire limit (body size): a smaller batch may pass, a lone message never will.
    #[error("batch over a wire limit: {0}")]
    TooLarge(String),
    /// Empty, too many parts, or otherwise unusable (a bug in the caller).
    #[error("batch unusable: {0}")]
    Unusable(String),
}

/// One send connection. `&mut self` makes "one request at a time" structural.
#[async_trait::async_trait]
pub trait IcomSender: Send + 'static {
    /// POSTs `batch` (1..=10 raw XML messages) as one request.
    async fn send(&mut self, batch: &[Bytes]) -> Result<SendReply, SendRefused>;
}

/// Opens a fresh send connection for a sender that has just been granted a send lease.
pub trait SendConnector: Send + Sync + 'static {
    fn sender(&self, channel: ChannelId) -> Box<dyn IcomSender>;
}
