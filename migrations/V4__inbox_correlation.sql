-- Durable confirmation of outbound messages: inbound status reports (pacs.002,
-- admi.002) are applied to the outbound messages they reference by a confirmer
-- that reads the rows not correlated yet. A crash between the inbox commit and
-- the verdict leaves the row here, and the next pass (any pod) applies it.
ALTER TABLE inbox ADD COLUMN correlated_at timestamptz;

-- Status reports waiting for the confirmer, per ISPB in arrival order. Rows
-- stored before this migration are correlated once, on the first passes.
CREATE INDEX inbox_uncorrelated ON inbox (ispb, id)
    WHERE correlated_at IS NULL AND status = 'received'
      AND (msg_def LIKE 'pacs.002%' OR msg_def LIKE 'admi.002%');
