//! Storing pulled requests: a whole batch in ONE statement (a multi-row insert
//! with its history lines, `ON CONFLICT DO NOTHING`), then — only when some
//! ran into a stored MsgId or ingress ref — one read of the rows they hit.
//!
//! Poison never fails the batch: a valid request whose fields the table cannot
//! hold (`fields.rs`) becomes a `rejected_invalid` candidate before the insert,
//! the text of an invalid one is cleaned and cut; and should Postgres still
//! refuse the statement's values (a data exception), the batch is stored one
//! row at a time, a refused row as a bare `rejected_invalid` (raw kept).

use std::time::SystemTime;

use cabine_actors::ports::outbound::{Inserted, InvalidOutbound, NewOutbound, OutboundError, OutboundRow, Priority};
use cabine_actors::ports::outbound_bus::{OutboundRequest, ResultStatus};
use serde_json::Value;
use tokio_postgres::types::ToSql;

use super::PgOutboundStore;
use crate::outbound::fields;
use crate::outbound::rows::{ROW_COLUMNS, get, outbound_row, pg_error};
use crate::outbound::transition::{CHANGE_COLUMNS, Change};

/// Inserts the rows given as arrays (`$2..$11`, in order) and their first
/// history line (`accepted`, or `rejected_invalid`); nothing on a conflict.
fn insert_sql() -> String {
    format!(
        "WITH c AS (
            INSERT INTO outbound (ispb, msg_id, ingress_ref, msg_type, channel, priority, deadline, status,
                                  end_to_end_ids, last_error, raw)
            SELECT $1, r.msg_id, r.ingress_ref, r.msg_type, r.channel, r.priority, r.deadline, r.status,
                   ARRAY(SELECT jsonb_array_elements_text(r.e2e)), r.last_error, r.raw
            FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::int2[], $7::timestamptz[],
                        $8::text[], $9::jsonb[], $10::text[], $11::bytea[]) WITH ORDINALITY
                 AS r(msg_id, ingress_ref, msg_type, channel, priority, deadline, status, e2e, last_error, raw, n)
            ORDER BY r.n
            ON CONFLICT DO NOTHING
            RETURNING id, msg_id, ingress_ref, channel, status, attempts, resource_ids, last_error
        ),
        h AS (
            INSERT INTO outbound_history (outbound_id, from_status, to_status, attempt, event, detail)
            SELECT id, NULL, status, attempts, CASE status WHEN 'queued' THEN 'accepted' ELSE status END, last_error
            FROM c
            RETURNING id, outbound_id, event, at, detail
        )
        SELECT {CHANGE_COLUMNS} FROM h JOIN c ON c.id = h.outbound_id ORDER BY c.id"
    )
}

/// One request as the row it becomes.
struct Candidate<'a> {
    msg_id: Option<&'a str>,
    ingress_ref: Option<&'a str>,
    msg_type: Option<&'a str>,
    channel: Option<&'static str>,
    priority: i16,
    deadline: SystemTime,
    status: &'static str,
    end_to_end_ids: Value,
    last_error: Option<String>,
    raw: &'a [u8],
}

impl<'a> Candidate<'a> {
    fn of(request: &'a OutboundRequest, now: SystemTime) -> Self {
        match request {
            OutboundRequest::Valid(m) => match fields::check_storable(m) {
                Ok(()) => Self::valid(m),
                Err(why) => Self::unstorable(m, &why, now),
            },
            OutboundRequest::Invalid(m) => Self::invalid(m, now),
        }
    }

    fn valid(m: &'a NewOutbound) -> Self {
        Candidate {
            msg_id: Some(&m.msg_id),
            ingress_ref: m.ingress_ref.as_deref(),
            msg_type: Some(&m.msg_type),
            channel: Some(m.channel.as_str()),
            priority: m.priority.rank(),
            deadline: m.deadline,
            status: "queued",
            end_to_end_ids: Value::from(m.end_to_end_ids.clone()),
            last_error: None,
            raw: &m.raw,
        }
    }

    fn invalid(m: &'a InvalidOutbound, now: SystemTime) -> Self {
        let reason = match &m.claimed_msg_id {
            Some(id) => format!("{} (MsgId read: {})", m.reason, fields::shown(id)),
            None => m.reason.clone(),
        };
        Self::rejected(m.ingress_ref.as_deref(), m.channel.map(|c| c.as_str()), reason, &m.raw, now)
    }

    /// A valid request the table cannot hold as it is: kept as `rejected_invalid`, raw intact.
    fn unstorable(m: &'a NewOutbound, why: &str, now: SystemTime) -> Self {
        let reason = format!("not storable as sent: {why}");
        let ingress_ref = m.ingress_ref.as_deref().filter(|r| r.len() <= 256 && !r.contains('\0'));
        Self::rejected(ingress_ref, Some(m.channel.as_str()), reason, &m.raw, now)
    }

    fn rejected(
        ingress_ref: Option<&'a str>,
        channel: Option<&'static str>,
        reason: String,
        raw: &'a [u8],
        now: SystemTime,
    ) -> Self {
        Candidate {
            msg_id: None,
            ingress_ref,
            msg_type: None,
            channel,
            priority: Priority::Normal.rank(),
            deadline: now,
            status: "rejected_invalid",
            end_to_end_ids: Value::Array(Vec::new()),
            last_error: Some(fields::text(&reason)),
            raw,
        }
    }

    /// What is left when Postgres refuses this row's values: the bare rejected
    /// row (no MsgId, no EndToEndIds, the raw body) with Postgres's reason.
    fn bare(&self, refused: &str, now: SystemTime) -> Self {
        let reason = format!("refused by Postgres ({refused}); stored raw");
        let ingress_ref = self.ingress_ref.filter(|r| !r.contains('\0'));
        Self::rejected(ingress_ref, self.channel, reason, self.raw, now)
    }

    /// Whether `change` is the row this candidate became.
    fn became(&self, change: &Change) -> bool {
        let Some(event) = &change.event else { return false };
        change.msg_id.as_deref() == self.msg_id
            && event.ingress_ref.as_deref() == self.ingress_ref
            && event.detail == self.last_error
    }

    /// The stored row it ran into: by MsgId, else by ingress ref.
    fn conflict<'r>(&self, stored: &'r [(OutboundRow, Vec<u8>)]) -> Option<&'r (OutboundRow, Vec<u8>)> {
        let by_msg_id = self.msg_id.and_then(|m| stored.iter().find(|(r, _)| r.msg_id.as_deref() == Some(m)));
        by_msg_id
            .or_else(|| self.ingress_ref.and_then(|i| stored.iter().find(|(r, _)| r.ingress_ref.as_deref() == Some(i))))
    }
}

impl PgOutboundStore {
    /// The batch insert behind `insert`, `insert_invalid` and `insert_batch`.
    pub(super) async fn store_requests(&self, requests: &[OutboundRequest]) -> Result<Vec<Inserted>, OutboundError> {
        let now = SystemTime::now();
        let mut candidates: Vec<Candidate> = requests.iter().map(|r| Candidate::of(r, now)).collect();
        let mut changes = match self.insert_candidates(&candidates).await {
            Err(OutboundError::Refused(why)) => {
                tracing::warn!(why, rows = candidates.len(), "a batch refused by Postgres: stored one row at a time");
                self.insert_one_by_one(&mut candidates, now).await?
            }
            other => other?,
        };
        let mut answers: Vec<Option<Inserted>> = Vec::with_capacity(candidates.len());
        for c in &candidates {
            let new = changes.iter().position(|ch| c.became(ch)).map(|i| changes.swap_remove(i));
            answers.push(new.and_then(|ch| ch.event).map(|event| Inserted::New { event }));
        }
        if answers.iter().any(Option::is_none) {
            let stored = self.conflicting_rows(&candidates).await?;
            for (answer, c) in answers.iter_mut().zip(&candidates).filter(|(a, _)| a.is_none()) {
                *answer = Some(duplicate_of(c, &stored)?);
            }
        }
        let answers: Vec<Inserted> = answers.into_iter().flatten().collect();
        count_inserts(&answers, requests);
        Ok(answers)
    }

    async fn insert_candidates(&self, candidates: &[Candidate<'_>]) -> Result<Vec<Change>, OutboundError> {
        let (msg_ids, refs) = (column(candidates, |c| c.msg_id), column(candidates, |c| c.ingress_ref));
        let (types, channels) = (column(candidates, |c| c.msg_type), column(candidates, |c| c.channel));
        let statuses = column(candidates, |c| c.status);
        let errors = column(candidates, |c| c.last_error.as_deref());
        let priorities = column(candidates, |c| c.priority);
        let deadlines = column(candidates, |c| c.deadline);
        let e2e = column(candidates, |c| &c.end_to_end_ids);
        let raws = column(candidates, |c| c.raw);
        let p: [&(dyn ToSql + Sync); 11] =
            [&self.ispb, &msg_ids, &refs, &types, &channels, &priorities, &deadlines, &statuses, &e2e, &errors, &raws];
        self.changes(&insert_sql(), &p).await
    }

    /// Each candidate in its own statement; one whose values Postgres refuses is
    /// replaced by its bare form (and stored so). Rows stored before an error stay.
    async fn insert_one_by_one(
        &self,
        candidates: &mut [Candidate<'_>],
        now: SystemTime,
    ) -> Result<Vec<Change>, OutboundError> {
        let mut changes = Vec::with_capacity(candidates.len());
        for c in candidates.iter_mut() {
            match self.insert_candidates(std::slice::from_ref(c)).await {
                Ok(mut one) => changes.append(&mut one),
                Err(OutboundError::Refused(why)) => {
                    tracing::warn!(why, ingress_ref = c.ingress_ref, "a request refused by Postgres: kept raw");
                    metrics::counter!("cabine_outbound_refused_rows_total").increment(1);
                    *c = c.bare(&why, now);
                    changes.append(&mut self.insert_candidates(std::slice::from_ref(c)).await?);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(changes)
    }

    /// The stored rows (with their bodies) the conflicting candidates ran into.
    async fn conflicting_rows(
        &self,
        candidates: &[Candidate<'_>],
    ) -> Result<Vec<(OutboundRow, Vec<u8>)>, OutboundError> {
        let msg_ids: Vec<&str> = candidates.iter().filter_map(|c| c.msg_id).collect();
        let refs: Vec<&str> = candidates.iter().filter_map(|c| c.ingress_ref).collect();
        let sql = format!(
            "SELECT {ROW_COLUMNS}, raw FROM outbound WHERE msg_id = ANY($1::text[]) OR ingress_ref = ANY($2::text[])"
        );
        let rows = self
            .bounded(|client| async move {
                let stmt = client.prepare_cached(&sql).await.map_err(|e| pg_error(&e))?;
                client.query(&stmt, &[&msg_ids, &refs]).await.map_err(|e| pg_error(&e))
            })
            .await?;
        rows.iter().map(|r| Ok((outbound_row(r)?, get::<Vec<u8>>(r, 17)?))).collect()
    }
}

/// One column of the batch, as the array parameter it is sent as.
fn column<'c, 'a, T>(candidates: &'c [Candidate<'a>], f: impl Fn(&'c Candidate<'a>) -> T) -> Vec<T> {
    candidates.iter().map(f).collect()
}

/// A candidate that was not inserted: the existing row's state, and whether the body is the same.
fn duplicate_of(c: &Candidate, stored: &[(OutboundRow, Vec<u8>)]) -> Result<Inserted, OutboundError> {
    if c.msg_id.is_none() && c.ingress_ref.is_none() {
        return Err(OutboundError::Fatal("conflict on a row without a key".into()));
    }
    let key = c.msg_id.or(c.ingress_ref).unwrap_or_default();
    let (row, raw) = c
        .conflict(stored)
        .ok_or_else(|| OutboundError::Unavailable(format!("conflict on {key:?} but no row: retry")))?;
    let same_body = raw.as_slice() == c.raw;
    if !same_body {
        tracing::warn!(key, "a different body arrived under a stored key: refused as a duplicate");
    }
    Ok(Inserted::Duplicate { row: row.clone(), same_body })
}

fn count_inserts(answers: &[Inserted], requests: &[OutboundRequest]) {
    let invalid = |a: &Inserted| matches!(a, Inserted::New { event } if event.status == ResultStatus::RejectedInvalid);
    let rejected = answers.iter().zip(requests).filter(|(a, r)| matches!(r, OutboundRequest::Invalid(_)) || invalid(a));
    metrics::counter!("cabine_outbound_invalid_total").increment(rejected.count() as u64);
    for (answer, request) in answers.iter().zip(requests) {
        let outcome = match answer {
            Inserted::New { .. } if invalid(answer) => "rejected_invalid",
            Inserted::New { .. } => "accepted",
            Inserted::Duplicate { .. } => "duplicate",
        };
        if matches!(request, OutboundRequest::Valid(_)) {
            metrics::counter!("cabine_outbound_inserts_total", "outcome" => outcome).increment(1);
        }
    }
}
