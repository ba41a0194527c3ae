-- The confirmer finds outbound rows by EndToEndId (`end_to_end_ids @> ARRAY[…]`)
-- through the GIN index `outbound_e2e`. With GIN's default fast update, new
-- entries sit in a pending list that every lookup scans until a vacuum merges
-- it: under sustained sending a lookup grew from ~0.01 ms to ~1 ms and
-- confirmations lagged by tens of seconds. Insert straight into the index.
ALTER INDEX outbound_e2e SET (fastupdate = off);
SELECT gin_clean_pending_list('outbound_e2e'::regclass);
