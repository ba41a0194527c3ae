-- Parked outbound requests (DESIGN §2.2: persisted raw, dead-lettered, never
-- blocking). A request the bus has delivered more than `outbound.max_deliver`
-- times without the intake storing it (whatever stopped it: a crash, a store
-- that refused it, a bug) is kept here as it came off the bus — subject, the
-- `Cabine-*` headers, the body byte for byte — and acknowledged, so it no
-- longer comes back every `ack_wait` with the requests pulled beside it.
--
-- Apart from `outbound` on purpose: a parked request has not been judged (it
-- may hold no MsgId, or one Postgres refuses), so it reserves no MsgId and has
-- no place in the send state machine. An operator reprocesses it by its
-- ingress reference: parsed again and stored like a fresh request (valid →
-- `queued`, unreadable → `rejected_invalid`), the row kept as `reprocessed`.
-- Only bytea and cleaned text here: parking itself cannot hit a data error.
CREATE TABLE outbound_parked (
    id              bigserial   PRIMARY KEY,
    ispb            text        NOT NULL,
    -- `{stream}:{sequence}:{published ns}` of the bus message: a redelivery parks nothing new.
    ingress_ref     text        UNIQUE,
    subject         text        NOT NULL,
    -- The `Cabine-*` headers as received: [[name, value], …].
    headers         jsonb       NOT NULL DEFAULT '[]',
    raw             bytea       NOT NULL,
    -- JetStream's delivery count when it was parked.
    deliveries      integer     NOT NULL,
    reason          text        NOT NULL,
    status          text        NOT NULL DEFAULT 'parked' CHECK (status IN ('parked', 'reprocessed')),
    parked_at       timestamptz NOT NULL DEFAULT now(),
    reprocessed_at  timestamptz,
    -- What the reprocess stored it as (its MsgId when it had a usable one).
    outbound_msg_id text
);

-- The operator's page and the parked gauge: rows still parked, oldest first.
CREATE INDEX outbound_parked_waiting ON outbound_parked (ispb, id) WHERE status = 'parked';
