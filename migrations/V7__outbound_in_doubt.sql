-- In-doubt sends: a message that is no longer sent, yet may have reached the
-- SPI, is `in_doubt` — never `timeout`, which tells the bank's core it was
-- never sent and lets it pay again under a new MsgId. It stays `in_doubt`
-- until the SPI's verdict arrives (pacs.002 / admi.002) or the Reconciler
-- settles it; nothing sends it again by itself.

ALTER TABLE outbound DROP CONSTRAINT outbound_status_check;
ALTER TABLE outbound ADD CONSTRAINT outbound_status_check CHECK (status IN ('queued', 'sending', 'sent',
    'confirmed', 'rejected', 'rejected_by_spi', 'rejected_invalid', 'timeout', 'in_doubt', 'dead'));

-- The first attempt whose outcome left open whether the SPI stored the message
-- (5xx, timeout, transport error, a claim recovered after its sender vanished).
-- Set once, never cleared: from then on the deadline (or a definite refusal of
-- a later resend) makes the row `in_doubt`, not `timeout` / `rejected`.
ALTER TABLE outbound ADD COLUMN maybe_stored_at timestamptz;

-- Rows from before this migration: any attempt of a row still live (or dead,
-- which a reprocess makes live again) was such an attempt, since 4xx and 201
-- end a row; a rejected row with more than one attempt had one before its 4xx.
UPDATE outbound SET maybe_stored_at = updated_at
WHERE sent_at IS NULL
  AND ((status IN ('queued', 'sending', 'dead') AND attempts > 0) OR (status = 'rejected' AND attempts > 1));

-- An admi.002 may name the refused message by the ResourceId its POST was given.
CREATE INDEX outbound_resource_ids ON outbound USING gin (resource_ids) WITH (fastupdate = off);

-- A status report whose reference matches nothing yet (a ResourceId whose 201
-- its sender has not recorded) is retried after `correlate_after`, and given
-- up — `correlated_at` and `unmatched_at` set, the row kept — after a patience.
ALTER TABLE inbox
    ADD COLUMN correlate_tries integer NOT NULL DEFAULT 0,
    ADD COLUMN correlate_after timestamptz,
    ADD COLUMN unmatched_at    timestamptz;
