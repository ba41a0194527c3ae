//! The publisher's statements: mark rows published, page through what the
//! sweep must republish, and read the oldest unpublished row's age. All of them
//! walk the partial index `inbox_unpublished (ispb, id)` (migration V2).

/// Marks a whole round published in one statement, committed without waiting
/// for the WAL flush (`synchronous_commit` off for this transaction only): a
/// mark a Postgres crash loses is a row the sweep republishes, which JetStream
/// and the consumers drop as a duplicate — the path a crash between the PubAck
/// and the mark already takes. The inbox commits the acknowledgement waits for
/// stay synchronous.
pub const MARK_PUBLISHED: &str = "\
UPDATE inbox SET published_at = now()
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
WHERE id = ANY($1) AND published_at IS NULL";

/// Highest id at the start of a sweep: the sweep never chases rows committed after it began.
pub const MAX_ID: &str = "SELECT COALESCE(max(id), 0) FROM inbox";

/// One page of rows to republish (id order, after `$2`, up to `$3`, committed more
/// than `$4` seconds ago, at most `$5`), counting the attempt on each.
pub const SWEEP_PAGE: &str = "\
UPDATE inbox SET attempts = attempts + 1
WHERE id = ANY (ARRAY(
    SELECT id FROM inbox
    WHERE ispb = $1 AND published_at IS NULL AND status = 'received'
      AND id > $2 AND id <= $3 AND received_at < now() - make_interval(secs => $4)
    ORDER BY id
    LIMIT $5))
RETURNING id, channel, resource_id, msg_def, raw, EXTRACT(EPOCH FROM now() - received_at)::float8 AS age_s";

/// Age in seconds of the oldest row not yet on the bus, 0 when there is none.
pub const OLDEST_UNPUBLISHED: &str = "\
SELECT COALESCE((
    SELECT EXTRACT(EPOCH FROM now() - received_at)::float8 FROM inbox
    WHERE ispb = $1 AND published_at IS NULL AND status = 'received'
    ORDER BY id LIMIT 1), 0)";
