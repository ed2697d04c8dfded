-- Deleting a topic or destination must not silently drop records still on their way:
-- it is refused (2BP01) while the topic, or a topic the destination subscribes to, has
-- undelivered records, or the destination has unresolved dead letters, unless the
-- transaction forces it with SET LOCAL wal_delivery.force_delete = on.

CREATE FUNCTION wal_delivery.refuse_delete_with_undelivered() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    undelivered bigint;
    dead bigint := 0;
    what text := CASE TG_TABLE_NAME WHEN 'topics' THEN 'topic' ELSE 'destination' END;
BEGIN
    IF TG_TABLE_NAME = 'topics' THEN
        SELECT count(*) INTO undelivered FROM wal_delivery.outbox
         WHERE topic = OLD.name AND state IN ('pending', 'processing', 'processed');
    ELSE
        SELECT count(*) INTO undelivered FROM wal_delivery.outbox o
         WHERE o.state IN ('pending', 'processing', 'processed')
           AND o.topic IN (SELECT topic FROM wal_delivery.subscriptions WHERE destination = OLD.name);
        SELECT count(*) INTO dead FROM wal_delivery.dead_letters
         WHERE destination = OLD.name AND resolved_at IS NULL;
    END IF;
    IF undelivered + dead = 0 THEN
        RETURN OLD;
    END IF;
    IF NOT current_setting('wal_delivery.force_delete')::boolean THEN
        RAISE EXCEPTION '% "%" still has % undelivered records and % unresolved dead letters', what, OLD.name, undelivered, dead
            USING ERRCODE = 'dependent_objects_still_exist',
                  HINT = format('Wait until wal_delivery.backlog shows none, or force it: BEGIN; SET LOCAL wal_delivery.force_delete = on; DELETE ...; COMMIT;%s',
                                CASE WHEN TG_TABLE_NAME = 'topics' THEN ' (its undelivered records are deleted with it)' ELSE '' END);
    END IF;
    IF TG_TABLE_NAME = 'topics' THEN
        DELETE FROM wal_delivery.outbox_rows WHERE topic = OLD.name AND state IN ('pending', 'processing', 'processed');
        -- The log's unacknowledged records of the topic (the relay has not passed them).
        DELETE FROM wal_delivery.outbox_log l USING wal_delivery.relay_cursors c
         WHERE l.topic = OLD.name AND c.lane = l.lane
           AND NOT wal_delivery.log_acked(l.xid, l.id, c);
    END IF;
    RETURN OLD;
END $$;

CREATE TRIGGER refuse_delete_with_undelivered BEFORE DELETE ON wal_delivery.topics
    FOR EACH ROW EXECUTE FUNCTION wal_delivery.refuse_delete_with_undelivered();
CREATE TRIGGER refuse_delete_with_undelivered BEFORE DELETE ON wal_delivery.destinations
    FOR EACH ROW EXECUTE FUNCTION wal_delivery.refuse_delete_with_undelivered();
