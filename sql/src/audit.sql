-- The audit log: every change on-call makes to delivery state (replay, resolve, pause,
-- resume), who made it and when. The functions that make those changes write it
-- themselves, so an action from psql is audited like one from `wal-worker console`.
--
-- Words used below:
--   who     session_user: the login that made the change (a SECURITY DEFINER function
--           and SET ROLE change current_user, never the login)
--   target  what the action was about, as jsonb: {"id": 12} for one dead letter, the
--           filters or the ids for a bulk action, {"destination": "billing"} for a pause
--   count   how many dead letters a bulk action changed (1 for the others)

CREATE TABLE wal_delivery.audit_log (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    who text NOT NULL,
    action text NOT NULL CHECK (action IN ('replay', 'resolve', 'pause', 'resume')),
    target jsonb NOT NULL,
    count bigint NOT NULL DEFAULT 1
);
-- A destination's page shows its pause history, newest first.
CREATE INDEX audit_log_destination ON wal_delivery.audit_log ((target->>'destination'), id);

-- One audit entry, written by the functions that change delivery state (they run as the
-- extension's owner; no role may write the log directly).
CREATE FUNCTION wal_delivery.write_audit(p_action text, p_target jsonb, p_count bigint) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO wal_delivery.audit_log (who, action, target, count)
    VALUES (session_user, p_action, p_target, p_count);
$$;
