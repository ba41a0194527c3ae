//! From ICOM's reply to one POST to what happened to each message it carried
//! (what the store records) and to how the call counts for the breaker; and
//! the cut of a claimed batch to the body budget.

use std::time::Duration;

use crate::ports::SendReply;
use crate::ports::breaker::CallOutcome;
use crate::ports::outbound::{ReadyMessage, SendResult, StatusClass};

/// Each message's result, in batch order.
pub fn outcomes(reply: &SendReply, sent: &[ReadyMessage]) -> Vec<(String, SendResult)> {
    if let SendReply::Accepted { resource_ids } = reply {
        if resource_ids.len() != sent.len() {
            tracing::warn!(
                ids = resource_ids.len(),
                messages = sent.len(),
                "201 with a ResourceId count that does not match"
            );
        }
        return sent
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let resource_id = resource_ids.get(i).cloned().unwrap_or_default();
                (m.msg_id.clone(), SendResult::Sent { resource_id })
            })
            .collect();
    }
    let each = per_message(reply);
    sent.iter().map(|m| (m.msg_id.clone(), each.clone())).collect()
}

/// The result every message of a non-201 reply shares.
fn per_message(reply: &SendReply) -> SendResult {
    let failed = |reason: String| SendResult::Failed { reason };
    match reply {
        SendReply::Accepted { .. } => failed("201 handled above".into()),
        SendReply::RateLimited { retry_after } => SendResult::RateLimited { retry_after: *retry_after },
        SendReply::Rejected { status, reason } => match StatusClass::of(*status) {
            StatusClass::Permanent => SendResult::Rejected { status: *status, reason: reason.clone() },
            StatusClass::RateLimited => SendResult::RateLimited { retry_after: None },
            StatusClass::Retry | StatusClass::Created => failed(format!("HTTP {status}: {reason}")),
        },
        SendReply::ServerError { status } => failed(format!("HTTP {status}")),
        SendReply::Timeout => failed("no answer within the send timeout".into()),
        SendReply::Transport(e) => failed(format!("transport: {e}")),
    }
}

/// How the call counts for the breaker: only 5xx, timeouts and transport errors fail it.
pub fn call_outcome(reply: &SendReply, elapsed: Duration, slow: Duration) -> CallOutcome {
    let first = match reply {
        SendReply::Accepted { .. } => SendResult::Sent { resource_id: String::new() },
        other => per_message(other),
    };
    CallOutcome::of_send(&first, elapsed, slow)
}

/// Every message put back unsent (not an attempt), after `retry_after`.
pub fn not_sent(messages: &[ReadyMessage], retry_after: Duration, reason: &str) -> Vec<(String, SendResult)> {
    messages
        .iter()
        .map(|m| (m.msg_id.clone(), SendResult::NotSent { retry_after, reason: reason.to_owned() }))
        .collect()
}

/// The longest prefix within `max_bytes` (at least one message), and the rest.
pub fn cut(mut messages: Vec<ReadyMessage>, max_bytes: usize) -> (Vec<ReadyMessage>, Vec<ReadyMessage>) {
    let mut total = 0;
    let keep = messages
        .iter()
        .take_while(|m| {
            total += m.raw.len();
            total <= max_bytes
        })
        .count()
        .max(1)
        .min(messages.len());
    let rest = messages.split_off(keep);
    (messages, rest)
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use bytes::Bytes;

    use super::*;
    use crate::ports::outbound::Priority;

    fn msg(id: &str, bytes: usize) -> ReadyMessage {
        ReadyMessage {
            id: 1,
            msg_id: id.into(),
            msg_type: "pacs.008".into(),
            priority: Priority::Normal,
            deadline: SystemTime::UNIX_EPOCH,
            attempts: 0,
            raw: Bytes::from(vec![b'x'; bytes]),
        }
    }

    #[test]
    fn replies_map_to_what_icom_did() {
        let batch = [msg("A", 1), msg("B", 1)];
        let ok = outcomes(&SendReply::Accepted { resource_ids: vec!["r1".into(), "r2".into()] }, &batch);
        assert_eq!(ok[1], ("B".into(), SendResult::Sent { resource_id: "r2".into() }));
        let rejected = outcomes(&SendReply::Rejected { status: 400, reason: "schema".into() }, &batch);
        assert!(matches!(rejected[0].1, SendResult::Rejected { status: 400, .. }));
        let timeout_408 = outcomes(&SendReply::Rejected { status: 408, reason: String::new() }, &batch);
        assert!(matches!(timeout_408[0].1, SendResult::Failed { .. }));
        let limited = outcomes(&SendReply::RateLimited { retry_after: None }, &batch);
        assert_eq!(limited[0].1, SendResult::RateLimited { retry_after: None });
        let fast = Duration::from_millis(1);
        assert_eq!(call_outcome(&SendReply::ServerError { status: 503 }, fast, fast * 10), CallOutcome::Failure);
        assert_eq!(
            call_outcome(&SendReply::Rejected { status: 403, reason: String::new() }, fast, fast),
            CallOutcome::Ignored
        );
        assert_eq!(call_outcome(&SendReply::RateLimited { retry_after: None }, fast, fast), CallOutcome::Ignored);
        assert_eq!(call_outcome(&SendReply::Timeout, fast, fast * 10), CallOutcome::Failure);
    }

    #[test]
    fn a_batch_is_cut_to_the_body_budget_but_never_to_nothing() {
        let (keep, rest) = cut(vec![msg("A", 40), msg("B", 40), msg("C", 40)], 100);
        assert_eq!((keep.len(), rest.len()), (2, 1));
        let (keep, rest) = cut(vec![msg("A", 400), msg("B", 1)], 100);
        assert_eq!((keep.len(), rest.len()), (1, 1));
        let (keep, rest) = cut(vec![msg("A", 1)], 100);
        assert_eq!((keep.len(), rest.len()), (1, 0));
    }
}
