-- The durable request gate (DESIGN §2.5): "Redis decides who should, Postgres
-- decides who may". Every slot — stream and send alike — has a row; the rows
-- of a pool are its permits. Every ICOM request is preceded by a fenced write
-- of `busy_until = greatest(busy_until, now() + request timeout + margin)`
-- (Postgres's clock); a new holder claims the row (next fence) and sends
-- nothing before the previous `busy_until` has passed. A release clears it
-- only when nothing of its holder is in flight.

-- Stream slots: the cursor row is the gate, written by the statements that
-- precede a GET anyway (batch commit, cursor store).
ALTER TABLE slot_cursor ADD COLUMN busy_until timestamptz;
-- `busy_until` as the last claim found it (what that claim's holder waited out).
ALTER TABLE slot_cursor ADD COLUMN claimed_over timestamptz;

-- Send slots of a channel's send pool.
CREATE TABLE send_slot (
    ispb        text        NOT NULL,
    channel     text        NOT NULL,
    slot        smallint    NOT NULL CHECK (slot BETWEEN 1 AND 6),
    fence       bigint      NOT NULL DEFAULT 0,
    holder      text,
    busy_until  timestamptz,
    claimed_over timestamptz,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (ispb, channel, slot)
);
