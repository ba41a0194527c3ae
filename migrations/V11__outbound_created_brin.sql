-- Outbound rows by acceptance time, for the timing report's window scans: a
-- BRIN index costs the intake next to nothing (rows arrive in time order).
CREATE INDEX outbound_created_brin ON outbound USING brin (created_at);
