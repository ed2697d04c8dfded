-- Roles and privileges, last, once every object exists. Nothing in the schema is PUBLIC's:
--   wal_delivery_writer     applications: enqueue, and read the status of their own records
--   wal_delivery_admin      operators: the control plane, dead letters, and the routines
--                           the workers call
--   wal_delivery_processor  what SQL processors run as (settings.processing_role): nothing
--                           here; the DBA grants it what the processors need
--   wal_delivery_ingest     `wal-worker ingest` (below): a writer and its own config
--   wal_delivery_worker     `wal-worker consume|retry|dlq|process` (below): the routines
--                           they call, no config table
--   wal_delivery_oncall     on-call people (below): read dead letters and status, replay,
--                           resolve, pause, resume; no secrets, no config
-- The extension's owner (a superuser) runs the background workers. Granting a role to a
-- login role is left to the database's administrator.

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'wal_delivery_writer') THEN
        CREATE ROLE wal_delivery_writer NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'wal_delivery_admin') THEN
        CREATE ROLE wal_delivery_admin NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'wal_delivery_processor') THEN
        CREATE ROLE wal_delivery_processor NOLOGIN;
    END IF;
END $$;
-- The workers (admin members) SET ROLE to it around each SQL processor call.
GRANT wal_delivery_processor TO wal_delivery_admin;
-- SQL processors run inside call_sql_processor, owned by the processing role (processing.sql).
ALTER FUNCTION wal_delivery.call_sql_processor(text, bytea) OWNER TO wal_delivery_processor;

REVOKE ALL ON ALL TABLES IN SCHEMA wal_delivery FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA wal_delivery FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA wal_delivery FROM PUBLIC;
REVOKE ALL ON PROCEDURE wal_delivery.purge_finished(integer, integer),
                        wal_delivery.archive_dead_letters(jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_catalog.wal_enqueue(text, jsonb, text, text, jsonb),
                       pg_catalog.wal_enqueue(text, bytea, text, text, jsonb),
                       pg_catalog.wal_enqueue(text, text, text, text, jsonb),
                       pg_catalog.wal_enqueue_batch(text, jsonb[], text[], text[], jsonb[]),
                       pg_catalog.wal_enqueue_batch(text, bytea[], text[], text[], jsonb[]),
                       pg_catalog.wal_enqueue_batch(text, text[], text[], text[], jsonb[]) FROM PUBLIC;
-- The exceptions: the log's order index is on log_order(lane, xid), and Postgres checks
-- EXECUTE on an index expression's function for whoever inserts (wal_enqueue's fast path
-- writes the log as its caller) and on a view's functions for whoever reads the view
-- (outbox, my_records, backlog, topic_status, and a monitoring role's queries), which is
-- also where log_acked and log_in_unacked_range are used (and only inlined when the reader
-- may execute them). Each computes a value from its arguments and reads nothing, so they
-- are everyone's, not doors.
GRANT EXECUTE ON FUNCTION wal_delivery.log_order(smallint, xid8),
                          wal_delivery.log_acked(xid8, bigint, wal_delivery.relay_cursors),
                          wal_delivery.log_in_unacked_range(smallint, xid8, wal_delivery.relay_cursors)
      TO PUBLIC;

GRANT USAGE ON SCHEMA wal_delivery TO wal_delivery_writer, wal_delivery_admin;

------------------------------------------------------------------------------ writer

-- The writer enqueues and reads its own records' status; nothing else. wal_enqueue*
-- (SECURITY DEFINER) are its only door: the routines behind them are granted to no one,
-- so no caller gets around their checks.
GRANT EXECUTE ON FUNCTION pg_catalog.wal_enqueue(text, jsonb, text, text, jsonb),
                          pg_catalog.wal_enqueue(text, bytea, text, text, jsonb),
                          pg_catalog.wal_enqueue(text, text, text, text, jsonb),
                          pg_catalog.wal_enqueue_batch(text, jsonb[], text[], text[], jsonb[]),
                          pg_catalog.wal_enqueue_batch(text, bytea[], text[], text[], jsonb[]),
                          pg_catalog.wal_enqueue_batch(text, text[], text[], text[], jsonb[])
    TO wal_delivery_writer, wal_delivery_admin;
GRANT SELECT ON wal_delivery.my_records TO wal_delivery_writer, wal_delivery_admin;

------------------------------------------------------------------------------ admin

-- The control plane. Signing secrets and S3 keys are the admin's only.
GRANT SELECT, INSERT, UPDATE, DELETE ON wal_delivery.topics, wal_delivery.destinations,
      wal_delivery.destination_secrets, wal_delivery.subscriptions,
      wal_delivery.archive_credentials TO wal_delivery_admin;
GRANT SELECT, UPDATE ON wal_delivery.settings TO wal_delivery_admin;
GRANT USAGE ON SEQUENCE wal_delivery.retry_partition_seq TO wal_delivery_admin;
-- The validation triggers of those tables run with the rights of whoever writes the row,
-- so the helpers they call must be the admin's too (they only inspect and raise). Kept
-- invoker-rights on purpose: a check never needs more than its caller may do.
GRANT EXECUTE ON FUNCTION wal_delivery.refuse_setting(text, text, text),
                          wal_delivery.is_string_map(jsonb)
    TO wal_delivery_admin;
GRANT EXECUTE ON FUNCTION wal_delivery.worker_config(),
                          wal_delivery.desired_kafka_topics(),
                          wal_delivery.library_version()
    TO wal_delivery_admin;

-- What operators read.
GRANT SELECT ON wal_delivery.outbox, wal_delivery.config_version, wal_delivery.backlog,
      wal_delivery.unresolved_dead_letters, wal_delivery.config_status,
      wal_delivery.kafka_topics, wal_delivery.reconcile_status,
      wal_delivery.destination_pauses, wal_delivery.destination_step_stats,
      wal_delivery.destination_status, wal_delivery.processing_status TO wal_delivery_admin;

-- Dead letters: on-call resolves them; the dlq worker ingests, alerts and replays.
GRANT SELECT, UPDATE (resolved_at, resolution) ON wal_delivery.dead_letters TO wal_delivery_admin;
GRANT EXECUTE ON FUNCTION wal_delivery.ingest_dead_letter(text, integer, bigint, text, text, text, bigint,
                                                          text, bytea, integer, text, jsonb),
                          wal_delivery.dead_letters_to_alert(integer),
                          wal_delivery.mark_dead_letter_alerted(bigint),
                          wal_delivery.inspect_dead_letter(bigint),
                          wal_delivery.replay_dead_letter(bigint),
                          wal_delivery.replay_dead_letters(text, text, timestamptz, timestamptz),
                          wal_delivery.dead_letters_to_replay(integer),
                          wal_delivery.complete_replay(bigint),
                          wal_delivery.resolve_dead_letter(bigint, text),
                          wal_delivery.resolve_dead_letters(text, text, text, timestamptz),
                          wal_delivery.replay_dead_letters_by_id(bigint[]),
                          wal_delivery.resolve_dead_letters_by_id(bigint[], text)
    TO wal_delivery_admin;

-- The relay's and the processors' routines, and retention.
GRANT EXECUTE ON FUNCTION wal_delivery.claim_ready_to_ship(integer),
                          wal_delivery.mark_stored(bigint[]),
                          wal_delivery.defer_shipping(bigint[], text, interval),
                          wal_delivery.mark_unshippable(bigint, text),
                          wal_delivery.relay_wakeups(),
                          wal_delivery.relay_passes(),
                          wal_delivery.relay_span_export(),
                          wal_delivery.claim_ready_to_process(integer, interval, text),
                          wal_delivery.complete_processing(bigint, bigint, bytea),
                          wal_delivery.fail_processing(bigint, bigint, text),
                          wal_delivery.expire_processing_leases(integer),
                          wal_delivery.claim_for_processor(integer, text),
                          wal_delivery.release_processing_rows(bigint[], bigint[]),
                          wal_delivery.hold_processing_row(bigint, bigint),
                          wal_delivery.processed_payload_problem(bytea, text, integer),
                          wal_delivery.record_attempt(bigint, bigint, bytea, text, text, integer),
                          wal_delivery.finish_processing(bigint, bigint, bytea, text),
                          wal_delivery.finish_processing_batch(bigint[], bigint[], bytea[], text[]),
                          wal_delivery.run_sql_processor(bigint[], bigint[]),
                          wal_delivery.run_sql_processor_row(bigint, bigint),
                          wal_delivery.start_processing_row(bigint, bigint),
                          wal_delivery.processing_role_problem(text),
                          wal_delivery.processing_session_problem(),
                          wal_delivery.sql_processor_call_problem(text),
                          wal_delivery.call_sql_processor(text, bytea),
                          wal_delivery.setting_changed_here(),
                          wal_delivery.hold_processing_rows(bigint[], bigint[]),
                          wal_delivery.purge_finished_rows(integer)
    TO wal_delivery_admin;
GRANT EXECUTE ON PROCEDURE wal_delivery.purge_finished(integer, integer) TO wal_delivery_admin;

-- The retry workers' shared pause state and counters, and on-call's resume.
GRANT EXECUTE ON FUNCTION wal_delivery.pause_destination(text, integer, text, interval),
                          wal_delivery.claim_probe(text, text, interval),
                          wal_delivery.finish_probe(text, text, text, text, interval),
                          wal_delivery.resume_destination(text),
                          wal_delivery.hold_destination(text, text),
                          wal_delivery.report_step_stats(text, jsonb)
    TO wal_delivery_admin;
-- Who replayed, resolved, paused and resumed what (written by those functions only).
GRANT SELECT ON wal_delivery.audit_log, wal_delivery.topic_status, wal_delivery.archive_objects,
      wal_delivery.delivery_stats, wal_delivery.delivery_rates
    TO wal_delivery_admin;

-- Dead-letter archival (the job runs as the role that scheduled it).
GRANT EXECUTE ON FUNCTION wal_delivery.archive_dead_letter_batch(),
                          wal_delivery.fetch_archive_object(text),
                          wal_delivery.restore_dead_letters(text),
                          wal_delivery.schedule_dead_letter_archival(text)
    TO wal_delivery_admin;
GRANT EXECUTE ON PROCEDURE wal_delivery.archive_dead_letters(jsonb) TO wal_delivery_admin;
-- schedule_dead_letter_archival calls cron.schedule, which needs USAGE on pg_cron's schema.
-- Granted here when pg_cron is installed first; otherwise a superuser grants it by hand
-- (docs/operations.md, "Archiving dead letters with pg_cron").
-- (pg_cron's objects are always in schema cron, whatever its extension's schema.)
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_cron') AND to_regnamespace('cron') IS NOT NULL THEN
        GRANT USAGE ON SCHEMA cron TO wal_delivery_admin;
    END IF;
END $$;

------------------------------------------------------------------------------ ingest

-- wal_delivery_ingest: what `wal-worker ingest` logs in as (through a LOGIN member). A
-- writer, so every outbox record it writes passes the writer's door; besides that only
-- its own config (hashes of tokens, topics' acks and limits: no signing secrets, no S3
-- keys, no other writer's records) and the door that keeps a request's content type.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'wal_delivery_ingest') THEN
        CREATE ROLE wal_delivery_ingest NOLOGIN;
    END IF;
END $$;
GRANT wal_delivery_writer TO wal_delivery_ingest;
GRANT EXECUTE ON FUNCTION wal_delivery.ingest_config(),
                          wal_delivery.ingest_enqueue_batch(text, text, bytea[], text[], text[], jsonb[])
    TO wal_delivery_ingest;
-- Tokens are control plane: the admin creates, scopes and revokes them.
GRANT SELECT, INSERT, UPDATE, DELETE ON wal_delivery.ingest_tokens TO wal_delivery_admin;
GRANT EXECUTE ON FUNCTION wal_delivery.create_ingest_token(text, text[]),
                          wal_delivery.ingest_config()
    TO wal_delivery_admin;

------------------------------------------------------------------------------ workers

-- wal_delivery_worker: what `wal-worker consume|retry|dlq|process` log in as (through a
-- LOGIN member, never a superuser). Exactly the routines the workers call and the one
-- table the pause state reads: no config table, no S3 credentials, no enqueue. The
-- config document (worker_config) carries the signing secrets the deliveries need.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'wal_delivery_worker') THEN
        CREATE ROLE wal_delivery_worker NOLOGIN;
    END IF;
END $$;
GRANT USAGE ON SCHEMA wal_delivery TO wal_delivery_worker;
-- The process role runs SQL processors under SET LOCAL ROLE processing_role.
GRANT wal_delivery_processor TO wal_delivery_worker;
GRANT SELECT ON wal_delivery.destination_pauses TO wal_delivery_worker;
GRANT EXECUTE ON FUNCTION
    wal_delivery.worker_config(),
    -- retry and consume: the shared pause, the probe, the step counters
    wal_delivery.pause_destination(text, integer, text, interval),
    wal_delivery.claim_probe(text, text, interval),
    wal_delivery.finish_probe(text, text, text, text, interval),
    wal_delivery.report_step_stats(text, jsonb),
    -- consume and retry: deliveries per minute, topic and destination (theirs only: not
    -- the admin's, the on-call's or a writer's, who could make up rates)
    wal_delivery.add_delivery_stats(jsonb),
    -- dlq: ingestion, alerts, replays
    wal_delivery.ingest_dead_letter(text, integer, bigint, text, text, text, bigint, text, bytea,
                                    integer, text, jsonb),
    wal_delivery.dead_letters_to_alert(integer),
    wal_delivery.mark_dead_letter_alerted(bigint),
    wal_delivery.dead_letters_to_replay(integer),
    wal_delivery.complete_replay(bigint),
    -- process: leases, holding, results
    wal_delivery.expire_processing_leases(integer),
    wal_delivery.claim_for_processor(integer, text),
    wal_delivery.hold_processing_rows(bigint[], bigint[]),
    wal_delivery.run_sql_processor_row(bigint, bigint),
    wal_delivery.release_processing_rows(bigint[], bigint[]),
    wal_delivery.finish_processing_batch(bigint[], bigint[], bytea[], text[]),
    -- what run_sql_processor_row, which runs with the worker's rights (it must SET ROLE),
    -- calls for its row
    wal_delivery.start_processing_row(bigint, bigint),
    wal_delivery.processing_role_problem(text),
    wal_delivery.processing_session_problem(),
    wal_delivery.sql_processor_call_problem(text),
    wal_delivery.call_sql_processor(text, bytea),
    wal_delivery.setting_changed_here(),
    wal_delivery.processed_payload_problem(bytea, text, integer),
    wal_delivery.record_attempt(bigint, bigint, bytea, text, text, integer)
    TO wal_delivery_worker;

------------------------------------------------------------------------------ on-call

-- wal_delivery_oncall: the people woken by a dead-letter alert (`wal-worker console` or
-- psql, through a LOGIN member). They read dead letters and the delivery status, replay,
-- resolve, pause and resume; every such change goes to audit_log with their login. They
-- read no config table (destinations' headers and the config document may hold tokens;
-- signing secrets and S3 keys are the admin's) and change no config.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'wal_delivery_oncall') THEN
        CREATE ROLE wal_delivery_oncall NOLOGIN;
    END IF;
END $$;
GRANT USAGE ON SCHEMA wal_delivery TO wal_delivery_oncall;
GRANT SELECT ON wal_delivery.dead_letters, wal_delivery.unresolved_dead_letters,
      wal_delivery.topic_status, wal_delivery.backlog, wal_delivery.destination_status,
      wal_delivery.destination_pauses, wal_delivery.destination_step_stats,
      wal_delivery.config_status, wal_delivery.reconcile_status, wal_delivery.processing_status,
      wal_delivery.audit_log, wal_delivery.archive_objects, wal_delivery.delivery_stats,
      wal_delivery.delivery_rates
    TO wal_delivery_oncall;
GRANT EXECUTE ON FUNCTION wal_delivery.inspect_dead_letter(bigint),
                          wal_delivery.replay_dead_letter(bigint),
                          wal_delivery.replay_dead_letters(text, text, timestamptz, timestamptz),
                          wal_delivery.replay_dead_letters_by_id(bigint[]),
                          wal_delivery.resolve_dead_letter(bigint, text),
                          wal_delivery.resolve_dead_letters(text, text, text, timestamptz),
                          wal_delivery.resolve_dead_letters_by_id(bigint[], text),
                          wal_delivery.hold_destination(text, text),
                          wal_delivery.resume_destination(text),
                          wal_delivery.library_version()
    TO wal_delivery_oncall;
