-- bench/anchors/debezium: both outboxes in the one database, side by side.
-- wal_delivery: the extension and its bench topic (acks -1 = acks=all, 3 partitions, RF 1),
-- internal topics at replication factor 1 (the bench broker is a single node).
CREATE EXTENSION wal_delivery;
UPDATE wal_delivery.settings
   SET internal_topic_replication_factor = 1, internal_topic_min_insync_replicas = 1;
INSERT INTO wal_delivery.topics (name, acks, partitions, replication_factor, min_insync_replicas)
VALUES ('anchor.wal', -1, 3, 1, 1);

-- Debezium: the outbox table its outbox event router expects by default, and the
-- publication pgoutput streams (this table only).
CREATE TABLE public.outbox_events (
    id uuid PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid varchar(255) NOT NULL,
    type varchar(255) NOT NULL,
    payload jsonb
);
CREATE PUBLICATION debezium_outbox FOR TABLE public.outbox_events;

-- The application side of Debezium's outbox pattern in one call, as wal_enqueue is one
-- call: insert the event and delete it again in the same transaction (the row never stays;
-- the connector reads the insert from the WAL, the router drops the delete).
CREATE FUNCTION public.outbox_emit(p_aggregatetype text, p_aggregateid text, p_type text, p_payload jsonb)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid := gen_random_uuid();
BEGIN
    INSERT INTO public.outbox_events (id, aggregatetype, aggregateid, type, payload)
    VALUES (v_id, p_aggregatetype, p_aggregateid, p_type, p_payload);
    DELETE FROM public.outbox_events WHERE id = v_id;
    RETURN v_id;
END $$;
