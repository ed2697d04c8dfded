-- Destinations: the services records are delivered to (HTTP endpoints), with how to
-- deliver, when to retry and when to pause. Their signing secrets are a table of their own.

-- Each destination owns one partition of every retry topic, for good: numbers are
-- never reused or changed, so a message in a retry step always finds its destination.
CREATE SEQUENCE wal_delivery.retry_partition_seq MINVALUE 0 START 0;

-- Columns keep the order in which they were added before 1.0 (SELECT * shows them so).
CREATE TABLE wal_delivery.destinations (
    name text PRIMARY KEY,
    transport text NOT NULL DEFAULT 'http',
    endpoint text NOT NULL,
    method text NOT NULL DEFAULT 'POST',
    headers jsonb NOT NULL DEFAULT '{}',
    timeout interval NOT NULL DEFAULT '10 seconds',
    max_in_flight integer NOT NULL DEFAULT 16,
    dedicated boolean NOT NULL DEFAULT false,             -- its own consumer group
    transient_statuses text[] NOT NULL DEFAULT '{408,425,429,5xx}',
    retry_delays interval[] NOT NULL DEFAULT '{10 seconds,1 minute,5 minutes}',
    retry_jitter real NOT NULL DEFAULT 0.2,               -- fraction of each delay
    pause_after_failures integer NOT NULL DEFAULT 20,
    probe_interval interval NOT NULL DEFAULT '2 minutes',
    verify_tls boolean NOT NULL DEFAULT true,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    retry_partition integer NOT NULL DEFAULT nextval('wal_delivery.retry_partition_seq'),
    CHECK (transport = 'http'),
    CHECK (endpoint ~* '^https?://[^/[:space:]]+'),
    CONSTRAINT destinations_retry_partition UNIQUE (retry_partition)
);
ALTER SEQUENCE wal_delivery.retry_partition_seq OWNED BY wal_delivery.destinations.retry_partition;

-- Why a destination may not set this header, or NULL. Refused: names that are not HTTP
-- tokens; framing and hop-by-hop headers (a second Content-Length or a Transfer-Encoding
-- lets one request smuggle another past a proxy; Host, Connection, Upgrade and the like
-- belong to the connection); the headers the workers set on every delivery
-- (Idempotency-Key, X-Wal-*, webhook-* and Content-Type and Content-Encoding, which
-- describe the body the workers send); values with a control character (CR or LF would
-- start a header of their own) or longer than 8192 characters.
CREATE FUNCTION wal_delivery.http_header_problem(p_name text, p_value text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE
        WHEN p_name !~ '^[-!#$%&''*+.^_`|~0-9A-Za-z]+$' OR length(p_name) > 256
            THEN format('header name "%s" is not an HTTP token (1 to 256 letters, digits or !#$%%&''*+-.^_`|~)', p_name)
        WHEN lower(p_name) IN ('content-length', 'transfer-encoding', 'host', 'connection', 'keep-alive',
                               'te', 'trailer', 'upgrade', 'expect')
             OR lower(p_name) LIKE 'proxy-%'
            THEN format('header "%s" frames the request or belongs to the connection; the workers set it', p_name)
        WHEN lower(p_name) IN ('idempotency-key', 'content-type', 'content-encoding')
             OR lower(p_name) LIKE 'x-wal-%' OR lower(p_name) LIKE 'webhook-%'
            THEN format('header "%s" is set by the workers on every delivery', p_name)
        WHEN p_value ~ '[[:cntrl:]]'
            THEN format('the value of header "%s" contains a control character (CR, LF, tab, ...)', p_name)
        WHEN length(p_value) > 8192
            THEN format('the value of header "%s" is longer than 8192 characters', p_name)
    END
$$;

-- Refuses a bad destination with a message naming the setting, the value and what to use.
-- SECURITY DEFINER: the admin role writes the row, the checks read settings.
CREATE FUNCTION wal_delivery.check_destination() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    bad text;
    retention interval;
BEGIN
    IF NEW.name IS NULL OR NEW.name !~ '^[A-Za-z0-9._-]{1,100}$' THEN
        RAISE EXCEPTION 'invalid destination name "%"', NEW.name
            USING ERRCODE = 'invalid_name', HINT = 'A destination name is 1 to 100 letters, digits, ".", "_" or "-".';
    END IF;
    IF NEW.transport IS DISTINCT FROM 'http' THEN
        PERFORM wal_delivery.refuse_setting(format('transport of destination "%s" must be ''http''', NEW.name), NEW.transport, 'HTTP is the only transport so far.');
    END IF;
    bad := wal_delivery.http_url_problem(NEW.endpoint);
    IF bad IS NOT NULL THEN
        PERFORM wal_delivery.refuse_setting(format('endpoint of destination "%s" must be an http:// or https:// URL: %s', NEW.name, bad), wal_delivery.url_for_message(NEW.endpoint),
            'For example https://billing.internal/hooks/orders.');
    END IF;
    IF NEW.method IS NULL OR NEW.method NOT IN ('POST', 'PUT', 'PATCH') THEN
        PERFORM wal_delivery.refuse_setting(format('method of destination "%s" must be POST, PUT or PATCH', NEW.name), NEW.method, 'The default is POST.');
    END IF;
    IF NEW.headers IS NULL OR NOT wal_delivery.is_string_map(NEW.headers) THEN
        PERFORM wal_delivery.refuse_setting(format('headers of destination "%s" must be a JSON object of strings', NEW.name), NEW.headers::text,
            'For example {"Authorization": "Bearer ..."}; put numbers in quotes.');
    END IF;
    -- The message names the header, never its value (it may be a credential).
    SELECT wal_delivery.http_header_problem(h.key, h.value) INTO bad FROM jsonb_each_text(NEW.headers) h
     WHERE wal_delivery.http_header_problem(h.key, h.value) IS NOT NULL ORDER BY h.key LIMIT 1;
    IF bad IS NOT NULL THEN
        PERFORM wal_delivery.refuse_setting(format('headers of destination "%s" are refused', NEW.name), bad,
            'Set only headers of your own, such as Authorization or X-Team; the workers set Content-Type, Content-Length, Host, Idempotency-Key, X-Wal-* and webhook-* themselves.');
    END IF;
    IF NEW.timeout IS NULL OR NEW.timeout NOT BETWEEN interval '1 millisecond' AND interval '5 minutes' THEN
        PERFORM wal_delivery.refuse_setting(format('timeout of destination "%s" must be between 1 millisecond and 5 minutes', NEW.name), NEW.timeout::text, 'The default is 10 seconds.');
    END IF;
    IF NEW.max_in_flight IS NULL OR NEW.max_in_flight NOT BETWEEN 1 AND 10000 THEN
        PERFORM wal_delivery.refuse_setting(format('max_in_flight of destination "%s" must be between 1 and 10000', NEW.name), NEW.max_in_flight::text, 'The default is 16.');
    END IF;
    SELECT string_agg(s, ', ') INTO bad FROM unnest(NEW.transient_statuses) s WHERE s IS NULL OR s !~ '^[1-5]([0-9][0-9]|xx)$';
    IF NEW.transient_statuses IS NULL OR bad IS NOT NULL THEN
        PERFORM wal_delivery.refuse_setting(format('transient_statuses of destination "%s" must be HTTP statuses such as 429 or classes such as 5xx', NEW.name),
            coalesce(bad, 'NULL'), 'The default is {408,425,429,5xx}; every other non-2xx status is permanent.');
    END IF;
    IF NEW.retry_delays IS NULL OR cardinality(NEW.retry_delays) <> 3 OR array_position(NEW.retry_delays, NULL) IS NOT NULL
       OR EXISTS (SELECT 1 FROM unnest(NEW.retry_delays) d WHERE d <= interval '0') THEN
        PERFORM wal_delivery.refuse_setting(format('retry_delays of destination "%s" must be three positive intervals, one per retry step', NEW.name),
            NEW.retry_delays::text, 'The default is {10 seconds,1 minute,5 minutes}.');
    END IF;
    IF NEW.retry_jitter IS NULL OR NEW.retry_jitter NOT BETWEEN 0 AND 1 THEN
        PERFORM wal_delivery.refuse_setting(format('retry_jitter of destination "%s" must be a fraction between 0 and 1', NEW.name), NEW.retry_jitter::text, 'The default is 0.2 (up to 20%% of each delay).');
    END IF;
    SELECT retry_dlq_retention INTO retention FROM wal_delivery.settings;
    IF wal_delivery.longest_retry_wait(NEW.retry_delays, NEW.retry_jitter) >= retention THEN
        PERFORM wal_delivery.refuse_setting(format('retry_delays of destination "%s" with retry_jitter must stay shorter than the retry topics'' retention (settings.retry_dlq_retention, %s): the longest wait is %s',
                NEW.name, retention, wal_delivery.longest_retry_wait(NEW.retry_delays, NEW.retry_jitter)),
            NEW.retry_delays::text, 'Kafka would delete a retry message before it is due. Shorten the delays or raise settings.retry_dlq_retention.');
    END IF;
    IF NEW.pause_after_failures IS NULL OR NEW.pause_after_failures NOT BETWEEN 1 AND 1000000 THEN
        PERFORM wal_delivery.refuse_setting(format('pause_after_failures of destination "%s" must be between 1 and 1000000', NEW.name), NEW.pause_after_failures::text,
            'The default is 20. The retry workers count consecutive failures up to it, and a larger count would overflow.');
    END IF;
    IF NEW.probe_interval IS NULL OR NEW.probe_interval NOT BETWEEN interval '1 second' AND interval '1 day' THEN
        PERFORM wal_delivery.refuse_setting(format('probe_interval of destination "%s" must be between 1 second and 1 day', NEW.name), NEW.probe_interval::text,
            'The default is 2 minutes. Each probe counts in destination_pauses.probes, and a paused destination is tried at least daily.');
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END $$;

CREATE TRIGGER check_destination BEFORE INSERT OR UPDATE ON wal_delivery.destinations
    FOR EACH ROW EXECUTE FUNCTION wal_delivery.check_destination();

-- A destination's retry partition is assigned once (see retry_partition_seq).
CREATE FUNCTION wal_delivery.keep_retry_partition() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.retry_partition IS DISTINCT FROM OLD.retry_partition THEN
        RAISE EXCEPTION 'retry_partition of destination "%" cannot change (it is %)', OLD.name, OLD.retry_partition
            USING ERRCODE = 'check_violation',
                  HINT = 'Messages waiting in the retry steps are found by this partition; it is assigned once.';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER keep_retry_partition BEFORE UPDATE ON wal_delivery.destinations
    FOR EACH ROW EXECUTE FUNCTION wal_delivery.keep_retry_partition();
CREATE TRIGGER bump_config_version AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON wal_delivery.destinations
    FOR EACH STATEMENT EXECUTE FUNCTION wal_delivery.bump_config_version();

SELECT pg_catalog.pg_extension_config_dump('wal_delivery.destinations', '');

------------------------------------------------------------------------------ signing secrets

-- Kept apart from destinations so the signing secret is readable by the admin role only.
CREATE TABLE wal_delivery.destination_secrets (
    destination text PRIMARY KEY REFERENCES wal_delivery.destinations ON DELETE CASCADE ON UPDATE CASCADE,
    signing_secret text NOT NULL CHECK (length(signing_secret) >= 16)
);

-- Refuses a signing secret shorter than 16 characters, with a hint to make a good one.
CREATE FUNCTION wal_delivery.check_destination_secret() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.signing_secret IS NULL OR length(NEW.signing_secret) < 16 THEN
        PERFORM wal_delivery.refuse_setting(format('signing_secret of destination "%s" must be at least 16 characters', NEW.destination),
            coalesce(length(NEW.signing_secret)::text || ' characters', 'NULL'),
            'Use a random secret of 24 bytes or more, e.g. ''whsec_'' || encode(gen_random_bytes(24), ''base64'') from pgcrypto.');
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER check_destination_secret BEFORE INSERT OR UPDATE ON wal_delivery.destination_secrets
    FOR EACH ROW EXECUTE FUNCTION wal_delivery.check_destination_secret();
CREATE TRIGGER bump_config_version AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON wal_delivery.destination_secrets
    FOR EACH STATEMENT EXECUTE FUNCTION wal_delivery.bump_config_version();

SELECT pg_catalog.pg_extension_config_dump('wal_delivery.destination_secrets', '');
