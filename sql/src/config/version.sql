-- The config version: one number that every committed change to the control plane bumps,
-- so workers know when to reload. NOTIFY wal_delivery_config carries it at commit.
--
-- Words used below:
--   version            bumped by every committed change to the control-plane tables
--   published version  the version the reconciler has matched in Kafka (reconcile.sql);
--                      workers follow this one

CREATE TABLE wal_delivery.config_version (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version bigint NOT NULL DEFAULT 1,
    published_version bigint NOT NULL DEFAULT 0,
    changed_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO wal_delivery.config_version DEFAULT VALUES;

-- Every committed change to the control plane gets a new version; NOTIFY is delivered
-- at commit only, so a rolled-back change tells nobody. Each control-plane table has a
-- statement trigger of this name (in its own file).
CREATE FUNCTION wal_delivery.bump_config_version() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v bigint;
BEGIN
    UPDATE wal_delivery.config_version SET version = version + 1, changed_at = now()
        RETURNING version INTO v;
    PERFORM pg_notify('wal_delivery_config', v::text);
    RETURN NULL;
END $$;

-- Whether Kafka and the workers have caught up with the latest change (in_sync).
CREATE VIEW wal_delivery.config_status AS
SELECT version, published_version, version = published_version AS in_sync, changed_at
  FROM wal_delivery.config_version;
