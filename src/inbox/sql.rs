//! The inbox statements. Each is a single statement (one implicit transaction,
//! one round trip), prepared once per connection. Every write of a holder is
//! conditioned on its fence and arms the slot's gate (DESIGN §2.5):
//! `busy_until = greatest(busy_until, now() + busy_for)`, `busy_for` in
//! milliseconds as the last parameter; `busy_until` never moves back except
//! when its holder releases it with nothing in flight.

/// Takes the next fence of a slot, creating its row at fence 1. `wait_ms` is
/// what is left of the previous holder's window (`busy_until` as the claim
/// found it, kept in `claimed_over`: in `ON CONFLICT DO UPDATE` the existing
/// row's columns are the values before the update); the claim itself opens a
/// window (`busy_until = greatest(busy_until, now() + busy_for)`), which arms
/// the new holder's first request only when there is nothing to wait for. `ON
/// CONFLICT DO UPDATE` locks the row, so concurrent claims (and a holder's
/// concurrent write) serialise.
pub const CLAIM: &str = "\
INSERT INTO slot_cursor (ispb, channel, slot, fence, holder, updated_at, busy_until)
VALUES ($1, $2, $3, 1, $4, now(), now() + $5::bigint * interval '1 millisecond')
ON CONFLICT (ispb, channel, slot)
DO UPDATE SET fence = slot_cursor.fence + 1, holder = EXCLUDED.holder, updated_at = now(),
              claimed_over = slot_cursor.busy_until,
              busy_until = greatest(slot_cursor.busy_until, now() + $5::bigint * interval '1 millisecond')
RETURNING fence, pull_next,
          coalesce(greatest(0, ceil(extract(epoch FROM claimed_over - now()) * 1000)), 0)::bigint AS wait_ms";

/// Commits a batch with the stream's next cursor, all or nothing:
/// `cursor` locks the slot row and moves the cursor only while the fence is ours
/// (a concurrent claim is waited for and re-checked); `batch` inserts only when
/// `cursor` did, skipping rows already there. The one result row says whether the
/// fence held and which rows are new.
pub const COMMIT: &str = "\
WITH cursor AS (
    UPDATE slot_cursor SET pull_next = $5, updated_at = now(),
                           busy_until = greatest(busy_until, now() + $15::bigint * interval '1 millisecond')
    WHERE ispb = $1 AND channel = $2 AND slot = $3 AND fence = $4
    RETURNING fence
), batch AS (
    INSERT INTO inbox (ispb, channel, slot, fence, resource_id, msg_id, msg_def, biz_msg_id, end_to_end_id,
                       from_ispb, to_ispb, raw, status, reason)
    SELECT $1, $2, $3, $4, m.resource_id, m.msg_id, m.msg_def, m.biz_msg_id, m.end_to_end_id,
           m.from_ispb, m.to_ispb, m.raw, CASE WHEN m.reason IS NULL THEN 'received' ELSE 'malformed' END, m.reason
    FROM unnest($6::text[], $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[],
                $13::bytea[], $14::text[])
         AS m(resource_id, msg_id, msg_def, biz_msg_id, end_to_end_id, from_ispb, to_ispb, raw, reason)
    WHERE EXISTS (SELECT 1 FROM cursor)
    ON CONFLICT (ispb, channel, resource_id) DO NOTHING
    RETURNING id, resource_id
)
SELECT EXISTS (SELECT 1 FROM cursor) AS fenced,
       COALESCE(array_agg(batch.id), '{}') AS ids,
       COALESCE(array_agg(batch.resource_id), '{}') AS resource_ids
FROM batch";

/// Stores a cursor without a batch, only while the fence is ours.
pub const STORE_CURSOR: &str = "\
UPDATE slot_cursor SET pull_next = $5, updated_at = now(),
                       busy_until = greatest(busy_until, now() + $6::bigint * interval '1 millisecond')
WHERE ispb = $1 AND channel = $2 AND slot = $3 AND fence = $4";

/// Arms the next request alone, only while the fence is ours.
pub const ARM: &str = "\
UPDATE slot_cursor SET busy_until = greatest(busy_until, now() + $5::bigint * interval '1 millisecond')
WHERE ispb = $1 AND channel = $2 AND slot = $3 AND fence = $4";

/// Clears the gate, only while the fence is ours (its holder has nothing in flight).
pub const RELEASE: &str = "\
UPDATE slot_cursor SET busy_until = NULL WHERE ispb = $1 AND channel = $2 AND slot = $3 AND fence = $4";

/// The slot's current fence, to explain a refused write (0 when the row is gone).
pub const CURRENT_FENCE: &str = "\
SELECT COALESCE((SELECT fence FROM slot_cursor WHERE ispb = $1 AND channel = $2 AND slot = $3), 0)";

/// Every slot cursor row of a participant, for the watchdog (read-only).
pub const CURSORS: &str = "\
SELECT channel, slot, fence, holder, pull_next,
       (extract(epoch FROM now() - updated_at) * 1000)::bigint AS age_ms,
       (extract(epoch FROM busy_until - now()) * 1000)::bigint AS busy_ms
FROM slot_cursor WHERE ispb = $1 ORDER BY channel, slot";
