-- What V1 lacked for the inbound pipeline (DESIGN §2.2, §2.3, §5):
-- the rest of the envelope, an index that serves both the republish sweep and
-- the oldest-unpublished gauge, and the dead-letter view over malformed rows.

-- AppHdr/BizMsgIdr, AppHdr/Fr and AppHdr/To, when the envelope could be read.
ALTER TABLE inbox
    ADD COLUMN biz_msg_id text,
    ADD COLUMN from_ispb  text,
    ADD COLUMN to_ispb    text;

-- Rows waiting for the bus, per ISPB in insertion order: the sweep pages through
-- it by id, the lag gauge reads its first entry. Malformed rows are dead
-- letters, never published, so they stay out of it (and out of the lag).
DROP INDEX inbox_unpublished;
CREATE INDEX inbox_unpublished ON inbox (ispb, id) WHERE published_at IS NULL AND status = 'received';

-- Dead letters: every message that could not be read, raw bytes intact, with
-- the reason. Operators inspect and replay from here; nothing is ever dropped.
CREATE INDEX inbox_malformed ON inbox (received_at) WHERE status = 'malformed';

CREATE VIEW inbox_dead_letter AS
SELECT id, ispb, channel, slot, fence, resource_id, reason, msg_def, msg_id,
       octet_length(raw) AS raw_bytes, raw, received_at
FROM inbox
WHERE status = 'malformed';
