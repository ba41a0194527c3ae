-- Stream slots: each (ispb, channel, slot) owns one ICOM stream. Its pull-next
-- and its fence live here, durable across Redis restarts (DESIGN §2.4, §3).
-- Claiming a slot takes the next fence; every write of the holder is
-- conditioned on the fence still being its own.
CREATE TABLE slot_cursor (
    ispb        text        NOT NULL,
    channel     text        NOT NULL,
    slot        smallint    NOT NULL CHECK (slot BETWEEN 1 AND 6),
    fence       bigint      NOT NULL DEFAULT 0,
    pull_next   text,
    holder      text,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (ispb, channel, slot)
);

-- Every inbound message, committed before its batch is acknowledged to ICOM.
-- Unique per (ispb, channel, resource id): a redelivered batch inserts nothing.
CREATE TABLE inbox (
    id             bigserial   PRIMARY KEY,
    ispb           text        NOT NULL,
    channel        text        NOT NULL,
    resource_id    text        NOT NULL,
    msg_id         text,
    msg_def        text,
    end_to_end_id  text,
    raw            bytea       NOT NULL,
    slot           smallint    NOT NULL,
    fence          bigint      NOT NULL,
    status         text        NOT NULL DEFAULT 'received' CHECK (status IN ('received', 'malformed')),
    reason         text,
    attempts       integer     NOT NULL DEFAULT 0,
    received_at    timestamptz NOT NULL DEFAULT now(),
    published_at   timestamptz,
    UNIQUE (ispb, channel, resource_id)
);

CREATE INDEX inbox_unpublished ON inbox (received_at) WHERE published_at IS NULL;
