-- The Reconciler's runs (one row per participant and window, re-runs reuse it)
-- and what each found. Discrepancies are only ever added: re-running a window
-- finds the same ones (same kind and EndToEndId) and changes nothing.
CREATE TABLE reconciliation (
    id               bigserial   PRIMARY KEY,
    ispb             text        NOT NULL,
    window_from      timestamptz NOT NULL,
    window_to        timestamptz NOT NULL,
    -- 'schedule': the Reconciler's own windows; 'operator': `cabine reconcile` / POST.
    origin           text        NOT NULL DEFAULT 'schedule' CHECK (origin IN ('schedule', 'operator')),
    -- The camt.060 of the last attempt, and the statement's entry count.
    request_msg_id   text,
    status           text        NOT NULL DEFAULT 'requested' CHECK (status IN ('requested', 'done', 'failed')),
    statement_entries integer,
    settled_sends    integer     NOT NULL DEFAULT 0,
    error            text,
    attempts         integer     NOT NULL DEFAULT 1,
    started_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    UNIQUE (ispb, window_from, window_to),
    CHECK (window_from < window_to)
);

CREATE INDEX reconciliation_by_window ON reconciliation (ispb, window_to);

CREATE TABLE reconciliation_discrepancy (
    id                bigserial   PRIMARY KEY,
    reconciliation_id bigint      NOT NULL REFERENCES reconciliation (id),
    kind              text        NOT NULL CHECK (kind IN ('missing_inbound', 'unknown_inbound', 'duplicate_inbound',
                          'unknown_outbound', 'settled_unconfirmed', 'not_settled', 'mismatch')),
    level             text        NOT NULL CHECK (level IN ('INFO', 'WARNING', 'CRITICAL')),
    end_to_end_id     text        NOT NULL,
    msg_id            text,
    -- What the Central Bank's statement and our records say, and what the Reconciler did.
    evidence          jsonb       NOT NULL,
    action            text,
    found_at          timestamptz NOT NULL DEFAULT now(),
    UNIQUE (reconciliation_id, kind, end_to_end_id)
);

-- Inbox rows by arrival time, for the window scans: a BRIN index costs the
-- inbound commit next to nothing (rows arrive in time order).
CREATE INDEX inbox_received_brin ON inbox USING brin (received_at);
