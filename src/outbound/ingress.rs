//! Outbound requests from the bus: the subject `{prefix}.out.{ispb}.{channel}`,
//! the headers below, and an ISO 20022 body whose MsgId and type are read
//! here. A request that cannot be read, or whose MsgId, type or EndToEndIds
//! break the table's rules (`fields.rs`: a NUL byte, an EndToEndId of
//! kilobytes), becomes an [`InvalidOutbound`] (kept as `rejected_invalid`),
//! never an error that would block the consumer.
//!
//! Headers (NATS headers, never sent to ICOM; names compared case-insensitively):
//! - `Cabine-Priority`: `critical` | `high` | `normal` (default) | `low`;
//! - `Cabine-Deadline`: an RFC 3339 instant (`2024-01-02T10:00:00-03:00`), or
//! - `Cabine-Deadline-Class`: `standard` (default, 5 min) | `saque_troco` (30 s),
//!   counted from the request's publication on the bus. Giving both is invalid.

mod consumer;
mod fuzz;

use std::time::SystemTime;

use bytes::Bytes;
use cabine_actors::ports::outbound::{
    Deadline, DeadlineBudgets, DeadlineClass, InvalidOutbound, NewOutbound, Priority,
};
use cabine_actors::ports::outbound_bus::OutboundRequest;

pub use consumer::{ConsumerSpec, JetStreamIngress, ensure_consumer, pull_batch};
pub use fuzz::fuzz_entry;

use super::{fields, xml_fields};
use crate::config::{ChannelId, Ispb, Settings};

pub const PRIORITY_HEADER: &str = "Cabine-Priority";
pub const DEADLINE_HEADER: &str = "Cabine-Deadline";
pub const DEADLINE_CLASS_HEADER: &str = "Cabine-Deadline-Class";

/// What a request is checked against.
#[derive(Clone, Debug)]
pub struct IngressRules {
    pub ispb: Ispb,
    pub channels: Vec<ChannelId>,
    pub budgets: DeadlineBudgets,
    pub max_message_bytes: usize,
}

impl IngressRules {
    pub fn from_settings(s: &Settings) -> Self {
        IngressRules {
            ispb: s.cluster.ispb.clone(),
            channels: s.enabled_channels().map(|(id, _)| id).collect(),
            budgets: DeadlineBudgets {
                standard: s.outbound.deadlines.standard,
                saque_troco: s.outbound.deadlines.saque_troco,
            },
            max_message_bytes: s.outbound.max_message_bytes,
        }
    }
}

/// What cabine reads of an outbound message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    /// `Document/*/GrpHdr/MsgId`, else `AppHdr/BizMsgIdr`.
    pub msg_id: Option<String>,
    /// `pacs.008` from `AppHdr/MsgDefIdr` `pacs.008.spi.1.16`.
    pub msg_type: Option<String>,
    /// What the SPI's pacs.002 will reference.
    pub end_to_end_ids: Vec<String>,
}

/// Reads the envelope's MsgId, type and the EndToEndIds it is about (its own
/// `EndToEndId`s; for a status report, its `OrgnlEndToEndId`s), at most 100 values.
pub fn read_envelope(raw: &[u8]) -> Result<Envelope, xml_fields::XmlError> {
    let wanted = ["GrpHdr/MsgId", "AppHdr/BizMsgIdr", "AppHdr/MsgDefIdr", "EndToEndId", "TxInfAndSts/OrgnlEndToEndId"];
    let mut env = Envelope { msg_id: None, msg_type: None, end_to_end_ids: Vec::new() };
    let mut biz = None;
    for (i, text) in xml_fields::collect(raw, &wanted, 100)? {
        match i {
            0 if env.msg_id.is_none() && !text.is_empty() => env.msg_id = Some(text),
            1 if biz.is_none() && !text.is_empty() => biz = Some(text),
            2 => env.msg_type = text.match_indices('.').nth(1).map(|(at, _)| text[..at].to_owned()),
            3 | 4 => env.end_to_end_ids.push(text),
            _ => {}
        }
    }
    env.msg_id = env.msg_id.or(biz);
    Ok(env)
}

/// One request as it arrived (bus or HTTP).
pub struct RawRequest<'a> {
    /// From [`channel_of_subject`] (bus) or [`enabled_channel`] (HTTP).
    pub channel: Result<ChannelId, String>,
    pub header: &'a dyn Fn(&str) -> Option<String>,
    pub body: Bytes,
    /// `{stream}:{sequence}:{published ns}` of the bus message.
    pub ingress_ref: Option<String>,
    pub published: SystemTime,
}

/// Validates a request into a [`NewOutbound`], or says why it is invalid.
pub fn parse_request(req: RawRequest<'_>, rules: &IngressRules) -> OutboundRequest {
    let envelope = read_envelope(&req.body);
    let claimed_msg_id = envelope.as_ref().ok().and_then(|e| e.msg_id.clone());
    let channel = req.channel.clone();
    match validate(&req, rules, channel.clone(), envelope) {
        Ok(valid) => OutboundRequest::Valid(valid),
        Err(reason) => OutboundRequest::Invalid(InvalidOutbound {
            ingress_ref: req.ingress_ref,
            channel: channel.ok(),
            claimed_msg_id,
            reason,
            raw: req.body,
        }),
    }
}

fn validate(
    req: &RawRequest<'_>,
    rules: &IngressRules,
    channel: Result<ChannelId, String>,
    envelope: Result<Envelope, xml_fields::XmlError>,
) -> Result<NewOutbound, String> {
    let channel = channel?;
    if req.body.len() > rules.max_message_bytes {
        return Err(format!(
            "body of {} bytes exceeds outbound.max_message_bytes ({})",
            req.body.len(),
            rules.max_message_bytes
        ));
    }
    let priority = match (req.header)(PRIORITY_HEADER) {
        None => Priority::Normal,
        Some(p) => p.trim().parse().map_err(|e| format!("{PRIORITY_HEADER}: {e}"))?,
    };
    let deadline = deadline(req)?.resolve(req.published, &rules.budgets);
    let envelope = envelope.map_err(|e| format!("body: {e}"))?;
    let msg_id = envelope.msg_id.ok_or("body: no GrpHdr/MsgId nor AppHdr/BizMsgIdr")?;
    let msg_type = envelope.msg_type.ok_or("body: no AppHdr/MsgDefIdr like pacs.008.spi.1.16")?;
    let body = |e: String| format!("body: {e}");
    fields::check_msg_id(&msg_id).map_err(body)?;
    fields::check_msg_type(&msg_type).map_err(body)?;
    envelope.end_to_end_ids.iter().try_for_each(|e| fields::check_end_to_end_id(e)).map_err(body)?;
    Ok(NewOutbound {
        msg_id,
        msg_type,
        channel,
        priority,
        deadline,
        end_to_end_ids: envelope.end_to_end_ids,
        ingress_ref: req.ingress_ref.clone(),
        raw: req.body.clone(),
    })
}

fn deadline(req: &RawRequest<'_>) -> Result<Deadline, String> {
    match ((req.header)(DEADLINE_HEADER), (req.header)(DEADLINE_CLASS_HEADER)) {
        (Some(_), Some(_)) => Err(format!("both {DEADLINE_HEADER} and {DEADLINE_CLASS_HEADER}: give one")),
        (Some(at), None) => {
            let at = time::OffsetDateTime::parse(at.trim(), &time::format_description::well_known::Rfc3339)
                .map_err(|e| format!("{DEADLINE_HEADER}: not RFC 3339 ({e})"))?;
            Ok(Deadline::At(at.into()))
        }
        (None, Some(class)) => {
            Ok(Deadline::Class(class.trim().parse().map_err(|e| format!("{DEADLINE_CLASS_HEADER}: {e}"))?))
        }
        (None, None) => Ok(Deadline::Class(DeadlineClass::Standard)),
    }
}

/// The channel of `{prefix}.out.{ispb}.{channel}`, which must be our ISPB and an enabled channel.
pub fn channel_of_subject(subject: &str, rules: &IngressRules) -> Result<ChannelId, String> {
    let mut tokens = subject.rsplit('.');
    let (channel, ispb, out) = (tokens.next(), tokens.next(), tokens.next());
    if out != Some("out") || ispb != Some(rules.ispb.as_str()) {
        return Err(format!("subject {subject:?} is not {{prefix}}.out.{}.{{channel}}", rules.ispb));
    }
    enabled_channel(channel.unwrap_or_default(), rules)
}

/// `name` as a channel this pod serves.
pub fn enabled_channel(name: &str, rules: &IngressRules) -> Result<ChannelId, String> {
    let channel: ChannelId = name.parse()?;
    if !rules.channels.contains(&channel) {
        return Err(format!("channel {channel} is not enabled"));
    }
    Ok(channel)
}

#[cfg(test)]
mod tests;
