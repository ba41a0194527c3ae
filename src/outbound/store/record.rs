//! Recording what happened to a claimed batch, and the SPI's verdicts.
//!
//! Outcomes other than `Sent` apply only while the row is still `sending`
//! under the caller's claim: a claim recovered meanwhile makes them stale. A
//! `Sent` applies to any `queued`/`sending`/`in_doubt` row, because a 201 is a
//! fact: the message is stored at ICOM and must not be sent again.
//!
//! A failure (5xx, timeout, transport) may have been stored: the row remembers
//! it (`maybe_stored_at`) and is `in_doubt` once past its deadline. A definite
//! refusal (4xx) of a row that may already be stored is `in_doubt` too, not
//! `rejected`; a 429 or a put-back past the deadline is `timeout` only when no
//! earlier attempt may have reached the SPI.

use std::collections::HashSet;
use std::sync::LazyLock;
use std::time::Duration;

use cabine_actors::ports::outbound::{
    ClaimToken, ConfirmOutcome, ConfirmRef, OutboundError, Recorded, SendResult, SpiVerdict,
};
use cabine_actors::ports::outbound_bus::ResultEvent;
use deadpool_postgres::GenericClient;

use super::{PAST_DEADLINE, PgOutboundStore, after_doubtful_attempt, events_counted, millis, run_changes};
use crate::outbound::fields;
use crate::outbound::rows::pg_error;
use crate::outbound::transition::{Change, transition_sql};

/// The rows of claim `$4` named in `$1` (MsgIds), with `$2` as each one's note.
const PICK_CLAIMED: &str = "SELECT o.id, o.status AS from_status, r.note AS note
    FROM outbound o JOIN unnest($1::text[], $2::text[]) AS r(msg_id, note) ON o.msg_id = r.msg_id
    WHERE o.ispb = $3 AND o.status = 'sending' AND o.claim = $4 FOR UPDATE OF o";

/// 201s (`$1` MsgIds, `$2` ResourceIds, `$3` ISPB): `sent` from any row not sent
/// yet, an in-doubt one included.
static SENT_SQL: LazyLock<String> = LazyLock::new(|| {
    transition_sql(
        "SELECT o.id, o.status AS from_status, r.rid AS note
         FROM outbound o JOIN unnest($1::text[], $2::text[]) AS r(msg_id, rid) ON o.msg_id = r.msg_id
         WHERE o.ispb = $3 AND o.status IN ('queued', 'sending', 'in_doubt') FOR UPDATE OF o",
        "status = 'sent', attempts = attempts + 1, resource_ids = resource_ids || prev.note, sent_at = now(),
         claim = NULL, claimed_at = NULL, last_error = NULL",
    )
});

/// 201s of rows a verdict finished before they were recorded: they still get
/// their ResourceIds. Its own statement, after [`SENT_SQL`], so that it sees a
/// verdict that committed while that one waited for the row lock.
const LATE_SQL: &str = "UPDATE outbound o SET resource_ids = o.resource_ids || r.rid
    FROM unnest($1::text[], $2::text[]) AS r(msg_id, rid)
    WHERE o.msg_id = r.msg_id AND o.ispb = $3 AND o.status IN ('sent', 'confirmed', 'rejected_by_spi')
      AND NOT (o.resource_ids @> ARRAY[r.rid])";

/// Outcomes of one batch, grouped by what they do to a row.
#[derive(Default)]
struct Grouped {
    sent: (Vec<String>, Vec<String>),
    rejected: (Vec<String>, Vec<String>),
    failed: (Vec<String>, Vec<String>),
    /// 429 and not-sent: (MsgIds, notes, delays in ms).
    waiting: (Vec<String>, Vec<String>, Vec<i64>),
}

impl Grouped {
    fn of(outcomes: &[(String, SendResult)], default_wait: Duration) -> Grouped {
        let mut g = Grouped::default();
        for (msg_id, result) in outcomes {
            let id = msg_id.clone();
            match result {
                SendResult::Sent { resource_id } => push(&mut g.sent, id, fields::resource_id(resource_id)),
                SendResult::Rejected { status, reason } => {
                    push(&mut g.rejected, id, fields::text(&format!("HTTP {status}: {reason}")))
                }
                SendResult::Failed { reason } => push(&mut g.failed, id, fields::text(reason)),
                SendResult::RateLimited { retry_after } => {
                    let wait = retry_after.unwrap_or(default_wait);
                    g.waiting.0.push(id);
                    g.waiting.1.push(format!("HTTP 429: retry after {} ms", wait.as_millis()));
                    g.waiting.2.push(millis(wait));
                }
                SendResult::NotSent { retry_after, reason } => {
                    g.waiting.0.push(id);
                    g.waiting.1.push(format!("not sent: {reason}"));
                    g.waiting.2.push(millis(*retry_after));
                }
            }
        }
        g
    }

    fn only_sent(&self) -> bool {
        self.rejected.0.is_empty() && self.failed.0.is_empty() && self.waiting.0.is_empty()
    }
}

fn push(pair: &mut (Vec<String>, Vec<String>), id: String, note: String) {
    pair.0.push(id);
    pair.1.push(note);
}

impl PgOutboundStore {
    pub(super) async fn record_outcomes(
        &self,
        claim: &ClaimToken,
        outcomes: &[(String, SendResult)],
    ) -> Result<Recorded, OutboundError> {
        let g = Grouped::of(outcomes, self.policy.retry_after_default);
        if g.only_sent() {
            // The common batch, all 201: one statement, its own transaction (two when a verdict came first).
            let changes = self.bounded(|client| async move { self.record_sent(&*client, &g.sent).await }).await?;
            return Ok(recorded(outcomes, changes));
        }
        let changes = self
            .bounded(|mut client| async move {
                let tx = client.transaction().await.map_err(|e| pg_error(&e))?;
                let mut changes = Vec::new();
                if !g.sent.0.is_empty() {
                    changes.extend(self.record_sent(&tx, &g.sent).await?);
                }
                if !g.rejected.0.is_empty() {
                    let sql = transition_sql(
                        PICK_CLAIMED,
                        "status = CASE WHEN maybe_stored_at IS NULL THEN 'rejected' ELSE 'in_doubt' END,
                         attempts = attempts + 1, claim = NULL, claimed_at = NULL, last_error = prev.note",
                    );
                    let (ids, notes) = &g.rejected;
                    changes.extend(run_changes(&tx, &sql, &[ids, notes, &self.ispb, &claim.0]).await?);
                }
                if !g.failed.0.is_empty() {
                    changes.extend(self.record_failed(&tx, claim, &g.failed).await?);
                }
                if !g.waiting.0.is_empty() {
                    changes.extend(self.record_waiting(&tx, claim, &g.waiting).await?);
                }
                tx.commit().await.map_err(|e| pg_error(&e))?;
                Ok(changes)
            })
            .await?;
        Ok(recorded(outcomes, changes))
    }

    /// 201s: `sent`; the ResourceIds of rows a verdict finished first only when some row did not change.
    async fn record_sent<C: GenericClient>(
        &self,
        client: &C,
        sent: &(Vec<String>, Vec<String>),
    ) -> Result<Vec<Change>, OutboundError> {
        let changes = run_changes(client, &SENT_SQL, &[&sent.0, &sent.1, &self.ispb]).await?;
        if changes.len() < sent.0.len() {
            client.execute(LATE_SQL, &[&sent.0, &sent.1, &self.ispb]).await.map_err(|e| pg_error(&e))?;
        }
        Ok(changes)
    }

    /// 429s and rows put back unsent: no attempt; past the deadline `timeout`,
    /// or `in_doubt` when an earlier attempt may have reached the SPI.
    async fn record_waiting<C: GenericClient>(
        &self,
        tx: &C,
        claim: &ClaimToken,
        (ids, notes, waits): &(Vec<String>, Vec<String>, Vec<i64>),
    ) -> Result<Vec<Change>, OutboundError> {
        let sql = transition_sql(
            "SELECT o.id, o.status AS from_status, r.note AS note, r.wait_ms AS wait_ms
             FROM outbound o JOIN unnest($1::text[], $2::text[], $5::bigint[]) AS r(msg_id, note, wait_ms)
               ON o.msg_id = r.msg_id
             WHERE o.ispb = $3 AND o.status = 'sending' AND o.claim = $4 FOR UPDATE OF o",
            &format!(
                "status = CASE WHEN deadline <= now() THEN {PAST_DEADLINE} ELSE 'queued' END, claim = NULL,
                 claimed_at = NULL, not_before = now() + prev.wait_ms * interval '1 millisecond', last_error = prev.note"
            ),
        );
        run_changes(tx, &sql, &[ids, notes, &self.ispb, &claim.0, waits]).await
    }

    /// 5xx / timeout / transport: an attempt that may have reached the SPI;
    /// backoff with full jitter (`random() x min(max, base x 2^n)`), dead after
    /// `poison_attempts`, `in_doubt` past the deadline.
    async fn record_failed<C: GenericClient>(
        &self,
        tx: &C,
        claim: &ClaimToken,
        failed: &(Vec<String>, Vec<String>),
    ) -> Result<Vec<Change>, OutboundError> {
        let set = format!(
            "attempts = attempts + 1, {}, claim = NULL, claimed_at = NULL, last_error = prev.note,
             not_before = now() + random() * LEAST($6::float8, $5::float8 * power(2, LEAST(attempts - attempts_base, 30)))
                                 * interval '1 millisecond'",
            after_doubtful_attempt("$7")
        );
        let sql = transition_sql(PICK_CLAIMED, &set);
        let (base, max) = (millis(self.policy.backoff_base) as f64, millis(self.policy.backoff_max) as f64);
        let poison = self.poison();
        run_changes(tx, &sql, &[&failed.0, &failed.1, &self.ispb, &claim.0, &base, &max, &poison]).await
    }

    pub(super) async fn apply_verdict(
        &self,
        reference: &ConfirmRef,
        verdict: &SpiVerdict,
    ) -> Result<ConfirmOutcome, OutboundError> {
        self.bounded(|client| async move { self.verdict_on(&*client, reference, verdict).await }).await
    }

    /// Applies the SPI's verdict on `client` (a pooled connection or the confirmer's transaction).
    pub(crate) async fn verdict_on<C: GenericClient>(
        &self,
        client: &C,
        reference: &ConfirmRef,
        verdict: &SpiVerdict,
    ) -> Result<ConfirmOutcome, OutboundError> {
        let (matches, key) = match reference {
            ConfirmRef::MsgId(m) => ("msg_id = $1", m),
            ConfirmRef::EndToEndId(e) => ("end_to_end_ids @> ARRAY[$1::text]", e),
            ConfirmRef::Related(r) => ("(msg_id = $1 OR resource_ids @> ARRAY[$1::text])", r),
        };
        let (status, note) = match verdict {
            SpiVerdict::Confirmed => ("confirmed", None),
            SpiVerdict::Rejected { reason } => ("rejected_by_spi", Some(reason.as_str())),
        };
        // Rows a send was recorded for (or that gave up: in_doubt, timeout, dead, rejected) take the
        // verdict at once (an in-doubt row's first doubtful attempt becomes its `sent_at`: the verdict
        // proves it was stored); a row still queued or sending is first made `sent` (the rarer case:
        // one more statement).
        let sql = transition_sql(
            &format!(
                "SELECT id, status AS from_status, $3::text AS note FROM outbound
                 WHERE {matches} AND ispb = $2
                   AND status NOT IN ('confirmed', 'rejected_by_spi', 'rejected_invalid', 'queued', 'sending')
                 FOR UPDATE"
            ),
            "status = $4, confirmed_at = now(), sent_at = COALESCE(sent_at, maybe_stored_at), claim = NULL,
             claimed_at = NULL, last_error = prev.note",
        );
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] = [key, &self.ispb, &note, &status];
        let mut events = Vec::new();
        for round in 0..2 {
            let changes = run_changes(client, &sql, &params).await?;
            if let Some(event) = changes.into_iter().find_map(|c| c.event) {
                metrics::counter!("cabine_outbound_verdicts_total", "status" => status).increment(1);
                events.push(event);
                return Ok(ConfirmOutcome::Applied(events));
            }
            if round == 0 {
                // Also when this changes nothing: its sender may have just recorded the send.
                events = self.sent_before_verdict(client, matches, key).await?;
            }
        }
        let sql = format!("SELECT status FROM outbound WHERE {matches} AND ispb = $2 LIMIT 1");
        let found = client.query_opt(&sql, &[key, &self.ispb]).await.map_err(|e| pg_error(&e))?;
        match found {
            None => Ok(ConfirmOutcome::Unknown),
            Some(r) => Ok(ConfirmOutcome::AlreadyFinal(r.get::<_, String>(0).parse().map_err(OutboundError::Fatal)?)),
        }
    }
}

impl PgOutboundStore {
    /// A verdict proves the SPI stored the message: a row still `sending` (its
    /// sender has the 201 but has not recorded it yet) or `queued` (a claim
    /// recovered after a crash past the 201) is `sent` first, so the bank's core
    /// hears `sent` before `confirmed` and `sent_at` is never missing.
    async fn sent_before_verdict<C: GenericClient>(
        &self,
        client: &C,
        matches: &str,
        key: &String,
    ) -> Result<Vec<ResultEvent>, OutboundError> {
        let sql = transition_sql(
            &format!(
                "SELECT id, status AS from_status, 'the SPI answered before the send was recorded' AS note
                 FROM outbound WHERE {matches} AND ispb = $2 AND status IN ('queued', 'sending') FOR UPDATE"
            ),
            "status = 'sent', attempts = attempts + 1, sent_at = now(), claim = NULL, claimed_at = NULL,
             last_error = NULL",
        );
        let changes = run_changes(client, &sql, &[key, &self.ispb]).await?;
        if !changes.is_empty() {
            metrics::counter!("cabine_outbound_sent_by_verdict_total").increment(changes.len() as u64);
        }
        Ok(changes.into_iter().filter_map(|c| c.event).collect())
    }
}

/// Events of the changes, and the MsgIds that changed nothing (stale claim).
fn recorded(outcomes: &[(String, SendResult)], changes: Vec<Change>) -> Recorded {
    let changed: HashSet<&str> = changes.iter().filter_map(|c| c.msg_id.as_deref()).collect();
    let stale: Vec<String> =
        outcomes.iter().map(|(m, _)| m).filter(|m| !changed.contains(m.as_str())).cloned().collect();
    if !stale.is_empty() {
        metrics::counter!("cabine_outbound_stale_outcomes_total").increment(stale.len() as u64);
    }
    let events = events_counted(changes);
    Recorded { events, stale }
}
