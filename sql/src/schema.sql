-- The schema every object of wal_delivery lives in (CREATE EXTENSION creates it, see
-- wal_delivery.control), and the small helpers the other files share.

COMMENT ON SCHEMA wal_delivery IS 'wal_delivery: outbox, control plane and delivery state';

-- The version of the loaded shared library, to spot a server that runs an old build.
CREATE FUNCTION wal_delivery.library_version() RETURNS text
LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'wal_delivery_library_version';

-- Raises a check_violation naming the setting, what it got and what to do.
CREATE FUNCTION wal_delivery.refuse_setting(what text, got text, hint text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION '%, got %', what, coalesce(got, 'NULL')
        USING ERRCODE = 'check_violation', HINT = hint;
END $$;

-- True when v is NULL or a JSON object whose values are all strings (Kafka/HTTP headers).
-- Inlinable on purpose: no SET clause (it calls only pg_catalog functions, qualified, and
-- its callers pin search_path); with one it was planned anew in every transaction
-- (bench/enqueue).
CREATE FUNCTION wal_delivery.is_string_map(v jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT v IS NULL
        OR (pg_catalog.jsonb_typeof(v) = 'object'
            AND NOT EXISTS (SELECT 1 FROM pg_catalog.jsonb_each(v) e
                             WHERE pg_catalog.jsonb_typeof(e.value) <> 'string'))
$$;

-- Why p_name is not a Kafka topic name the system may create, or NULL when it is. Kafka's
-- rules: 1 to 249 of [A-Za-z0-9._-], not "." or "..". Names starting with "__" are
-- refused too: Kafka keeps them for itself (__consumer_offsets, __transaction_state).
-- The rule is the record contract's (src/shared/record_contract.c), which the ingest
-- service applies to the topic in a request's path too.
CREATE FUNCTION wal_delivery.topic_name_problem(p_name text) RETURNS text
LANGUAGE c IMMUTABLE AS 'MODULE_PATHNAME', 'wal_delivery_topic_name_problem';

-- Two topic names Kafka treats as the same: it refuses a topic whose name differs from an
-- existing one only by "." against "_" (their metric names would collide).
CREATE FUNCTION wal_delivery.kafka_collision_key(p_name text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT translate(p_name, '.', '_')
$$;

-- Why p_url is not an acceptable http(s) URL for the workers to call, or NULL when it is.
-- The whole URL is checked, since libcurl and the servers behind it each parse it: printable
-- ASCII only (no spaces, CR, LF or other control characters), http or https, a host with an
-- optional port, no credentials (they would be logged and shown with the URL; use a header),
-- no fragment, only characters RFC 3986 allows unencoded, at most 2048 characters.
CREATE FUNCTION wal_delivery.http_url_problem(p_url text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE
        WHEN p_url IS NULL THEN 'it is NULL'
        WHEN length(p_url) > 2048 THEN 'it is longer than 2048 characters'
        WHEN p_url ~ '[^!-~]' THEN 'it contains a space, a control character (CR, LF, tab, ...) or a non-ASCII character; percent-encode them'
        WHEN p_url !~* '^https?://' THEN 'it must start with http:// or https://'
        WHEN p_url ~ '^[^:]+://[^/?#]*@' THEN 'it must not carry credentials (user:password@); send them in a header such as Authorization'
        WHEN p_url !~* '^https?://(\[[0-9a-f:.]+\]|[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?)(:[0-9]{1,5})?([/?].*)?$'
            THEN 'it needs a host (a DNS name, an IPv4 address or a bracketed IPv6 address) with an optional :port, then nothing or a path or query'
        WHEN coalesce(substring(p_url FROM '^[^:]+://[^/?]*:([0-9]{1,5})(?:[/?]|$)')::integer, 1) NOT BETWEEN 1 AND 65535
            THEN 'its port must be between 1 and 65535'
        WHEN p_url ~ '#' THEN 'it must not have a #fragment (servers never see it)'
        WHEN p_url ~ '[^A-Za-z0-9._~:/?@!$&''()*+,;=%\[\]-]' THEN 'it contains a character that must be percent-encoded (one of " < > \ ^ ` { | })'
        WHEN p_url ~ '%($|.$|[^0-9A-Fa-f]|.[^0-9A-Fa-f])' THEN 'a "%" must start a percent-encoding such as %20'
    END
$$;

-- A URL as error messages may show it: credentials masked, at most 200 characters.
CREATE FUNCTION wal_delivery.url_for_message(p_url text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN length(u) > 200 THEN left(u, 200) || '...' ELSE u END
      FROM (SELECT regexp_replace(p_url, '^([^:/]+://)[^/?#]*@', '\1***@') AS u) masked
$$;
