//! The send port on the real client: [`IcomClient`] is an [`IcomSender`] (one
//! connection, one POST at a time) and [`IcomChannels`] its [`SendConnector`]
//! (a fresh client per send lease). Only the outcome types are translated
//! here; the wire work is `IcomClient::send`.

use bytes::Bytes;

use cabine_actors::domain::ChannelId;
use cabine_actors::ports::{IcomSender, SendConnector, SendRefused, SendReply};

use super::client::IcomClient;
use super::endpoint::IcomChannels;
use super::limits::WireError;
use super::outcome::SendOutcome;

/// ICOM's answer as the port speaks it.
pub fn reply_of(outcome: SendOutcome) -> SendReply {
    match outcome {
        SendOutcome::Accepted { resource_ids } => SendReply::Accepted { resource_ids },
        SendOutcome::RateLimited { retry_after } => SendReply::RateLimited { retry_after },
        SendOutcome::Rejected { status, problem } => {
            SendReply::Rejected { status, reason: problem.map_or_else(|| format!("HTTP {status}"), |p| p.summary()) }
        }
        SendOutcome::ServerError { status } => SendReply::ServerError { status },
        SendOutcome::Timeout => SendReply::Timeout,
        SendOutcome::Transport(e) => SendReply::Transport(e),
    }
}

/// A batch the client would not put on the wire: too large (a smaller batch may pass) or unusable.
pub fn refusal_of(e: WireError) -> SendRefused {
    match e {
        WireError::BodyTooLarge { .. } | WireError::HeaderTooLong { .. } => SendRefused::TooLarge(e.to_string()),
        other => SendRefused::Unusable(other.to_string()),
    }
}

#[async_trait::async_trait]
impl IcomSender for IcomClient {
    async fn send(&mut self, batch: &[Bytes]) -> Result<SendReply, SendRefused> {
        IcomClient::send(self, batch).await.map(reply_of).map_err(refusal_of)
    }
}

impl SendConnector for IcomChannels {
    fn sender(&self, channel: ChannelId) -> Box<dyn IcomSender> {
        match self.client(channel) {
            Ok(client) => Box::new(client),
            Err(e) => Box::new(Unreachable(e.to_string())),
        }
    }
}

/// The sender of a channel whose client could not be built: every POST fails
/// as `Transport` with the reason, so the sender backs off and reports it.
struct Unreachable(String);

#[async_trait::async_trait]
impl IcomSender for Unreachable {
    async fn send(&mut self, _batch: &[Bytes]) -> Result<SendReply, SendRefused> {
        Ok(SendReply::Transport(self.0.clone()))
    }
}
