-- Outbound messages: accepted once per MsgId (invariant 3), taken by priority
-- then deadline with FOR UPDATE SKIP LOCKED and a claim token, never sent
-- after their deadline. Unreadable requests are kept as rejected_invalid
-- (msg_id NULL, deduplicated by where they came from).
CREATE TABLE outbound (
    id                     bigserial   PRIMARY KEY,
    ispb                   text        NOT NULL,
    msg_id                 text        UNIQUE,
    -- `{stream}:{sequence}` of the bus message it came from, when known.
    ingress_ref            text        UNIQUE,
    msg_type               text,
    channel                text        CHECK (channel IN ('cpm', 'csm')),
    -- 0 critical, 1 high, 2 normal, 3 low.
    priority               smallint    NOT NULL CHECK (priority BETWEEN 0 AND 3),
    deadline               timestamptz NOT NULL,
    status                 text        NOT NULL CHECK (status IN ('queued', 'sending', 'sent', 'confirmed',
                               'rejected', 'rejected_by_spi', 'rejected_invalid', 'timeout', 'dead')),
    -- Send attempts since acceptance (429s and waits excluded); never reset.
    attempts               integer     NOT NULL DEFAULT 0,
    -- `attempts` at the last reprocess: poison counts the attempts after it.
    attempts_base          integer     NOT NULL DEFAULT 0,
    not_before             timestamptz NOT NULL DEFAULT now(),
    claim                  text,
    claimed_at             timestamptz,
    resource_ids           text[]      NOT NULL DEFAULT '{}',
    end_to_end_ids         text[]      NOT NULL DEFAULT '{}',
    last_error             text,
    raw                    bytea       NOT NULL,
    created_at             timestamptz NOT NULL DEFAULT now(),
    updated_at             timestamptz NOT NULL DEFAULT now(),
    sent_at                timestamptz,
    confirmed_at           timestamptz,
    unconfirmed_since      timestamptz,
    CHECK (status = 'rejected_invalid' OR (msg_id IS NOT NULL AND msg_type IS NOT NULL AND channel IS NOT NULL)),
    CHECK ((status = 'sending') = (claim IS NOT NULL AND claimed_at IS NOT NULL))
);

-- The take-ready query: per channel, priority then deadline, queued rows only.
CREATE INDEX outbound_ready ON outbound (ispb, channel, priority, deadline, id) WHERE status = 'queued';
-- Expiry of overdue queued rows.
CREATE INDEX outbound_overdue ON outbound (deadline) WHERE status = 'queued';
-- Recovery of claims a vanished sender left behind.
CREATE INDEX outbound_claimed ON outbound (claimed_at) WHERE status = 'sending';
-- Sent rows still waiting for the SPI's pacs.002 / admi.002.
CREATE INDEX outbound_unconfirmed ON outbound (sent_at) WHERE status = 'sent' AND unconfirmed_since IS NULL;
-- Status pages (paged by status) and confirmation by EndToEndId.
CREATE INDEX outbound_by_status ON outbound (status, id);
CREATE INDEX outbound_e2e ON outbound USING gin (end_to_end_ids);

-- Every state change of a message. A line whose `event` is set is also a
-- result event for the bank's core: the outbox, republished until published_at is set.
CREATE TABLE outbound_history (
    id            bigserial   PRIMARY KEY,
    outbound_id   bigint      NOT NULL REFERENCES outbound (id),
    from_status   text,
    to_status     text        NOT NULL,
    attempt       integer     NOT NULL,
    event         text,
    detail        text,
    at            timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz
);

CREATE INDEX outbound_history_of ON outbound_history (outbound_id, id);
CREATE INDEX outbound_unpublished ON outbound_history (id) WHERE event IS NOT NULL AND published_at IS NULL;
