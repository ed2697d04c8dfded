-- Subscriptions: which destinations receive which topics.

CREATE TABLE wal_delivery.subscriptions (
    topic text NOT NULL REFERENCES wal_delivery.topics ON DELETE CASCADE ON UPDATE CASCADE,
    destination text NOT NULL REFERENCES wal_delivery.destinations ON DELETE CASCADE ON UPDATE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, destination)
);
CREATE INDEX subscriptions_destination ON wal_delivery.subscriptions (destination);

-- Names the missing side of a subscription instead of a bare foreign-key error.
CREATE FUNCTION wal_delivery.check_subscription() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM wal_delivery.topics WHERE name = NEW.topic) THEN
        RAISE EXCEPTION 'cannot subscribe destination "%" to topic "%": the topic does not exist', NEW.destination, NEW.topic
            USING ERRCODE = 'foreign_key_violation',
                  HINT = format('Create it first: INSERT INTO wal_delivery.topics (name) VALUES (%L).', NEW.topic);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM wal_delivery.destinations WHERE name = NEW.destination) THEN
        RAISE EXCEPTION 'cannot subscribe destination "%" to topic "%": the destination does not exist', NEW.destination, NEW.topic
            USING ERRCODE = 'foreign_key_violation',
                  HINT = format('Create it first: INSERT INTO wal_delivery.destinations (name, endpoint) VALUES (%L, ''https://...'').', NEW.destination);
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER check_subscription BEFORE INSERT OR UPDATE ON wal_delivery.subscriptions
    FOR EACH ROW EXECUTE FUNCTION wal_delivery.check_subscription();
CREATE TRIGGER bump_config_version AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON wal_delivery.subscriptions
    FOR EACH STATEMENT EXECUTE FUNCTION wal_delivery.bump_config_version();

SELECT pg_catalog.pg_extension_config_dump('wal_delivery.subscriptions', '');
