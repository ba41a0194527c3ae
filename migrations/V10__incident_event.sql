-- What the incident report cannot read from the inbox and outbound tables:
-- failovers, lease quarantines and breaker openings, one row each (written in
-- the background by the pod that saw it; repeats within seconds are folded).
CREATE TABLE incident_event (
    id       bigserial   PRIMARY KEY,
    ispb     text        NOT NULL,
    pod      text        NOT NULL,
    kind     text        NOT NULL CHECK (kind IN ('failover', 'quarantine', 'breaker_opened')),
    channel  text,
    slot     smallint,
    detail   text        NOT NULL,
    at       timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX incident_event_at ON incident_event (ispb, at);
