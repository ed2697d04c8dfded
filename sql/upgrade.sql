-- Updates: an install of each released version (its frozen script in sql/releases/),
-- updated with ALTER EXTENSION UPDATE with data in its tables, keeps the data and ends
-- with exactly what a fresh install of the current version has: the same objects,
-- function and view definitions, columns in the same order, constraints, indexes,
-- triggers, privileges and comments.
\pset format unaligned

-- What an install of wal_delivery left in the catalogs, as rows that name objects and
-- hold no OIDs, so two installs compare with EXCEPT. Definitions are compared by md5.
CREATE FUNCTION regress.extension_catalog() RETURNS TABLE (kind text, object text, detail text)
LANGUAGE sql AS $$
WITH ext AS (SELECT * FROM pg_extension WHERE extname = 'wal_delivery'),
-- Members less the types that come with another object (a table's row type, array
-- types: an internal dependency on it), which Postgres 17 lists as members and 15 does
-- not, so that the catalog reads the same on both.
members AS (
    SELECT d.classid, d.objid, d.objsubid FROM pg_depend d, ext
     WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'
       AND NOT (d.classid = 'pg_type'::regclass AND EXISTS (
           SELECT FROM pg_depend i
            WHERE i.classid = d.classid AND i.objid = d.objid AND i.deptype = 'i'))),
rels AS (SELECT c.* FROM pg_class c JOIN members m ON m.classid = 'pg_class'::regclass AND m.objid = c.oid),
procs AS (SELECT p.* FROM pg_proc p JOIN members m ON m.classid = 'pg_proc'::regclass AND m.objid = p.oid)
SELECT 'member', pg_describe_object(classid, objid, objsubid), '' FROM members
UNION ALL
SELECT 'extension', extname, format('relocatable=%s config=%s condition=%s',
       extrelocatable, extconfig::regclass[], extcondition) FROM ext
UNION ALL
SELECT 'function', p.oid::regprocedure::text,
       md5(pg_get_functiondef(p.oid)) || ' acl=' || coalesce(p.proacl::text, 'default') FROM procs p
UNION ALL
SELECT 'relation', r.oid::regclass::text,
       format('kind=%s options=%s acl=%s', r.relkind, r.reloptions, coalesce(r.relacl::text, 'default'))
  FROM rels r
UNION ALL
SELECT 'view', r.oid::regclass::text, md5(pg_get_viewdef(r.oid)) FROM rels r WHERE r.relkind = 'v'
UNION ALL
SELECT 'column', format('%s.%s', a.attrelid::regclass, a.attname),
       format('#%s %s notnull=%s default=%s identity=%s acl=%s',
              row_number() OVER (PARTITION BY a.attrelid ORDER BY a.attnum),
              format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(ad.adbin, ad.adrelid),
              a.attidentity, a.attacl)
  FROM pg_attribute a JOIN rels r ON r.oid = a.attrelid
  LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
 WHERE a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'constraint', format('%s on %s', c.conname, c.conrelid::regclass), pg_get_constraintdef(c.oid)
  FROM pg_constraint c JOIN rels r ON r.oid = c.conrelid
UNION ALL
SELECT 'index', i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
  FROM pg_index i JOIN rels r ON r.oid = i.indrelid
UNION ALL
SELECT 'trigger', format('%s on %s', t.tgname, t.tgrelid::regclass), pg_get_triggerdef(t.oid) || ' ' || t.tgenabled::text
  FROM pg_trigger t JOIN rels r ON r.oid = t.tgrelid WHERE NOT t.tgisinternal
UNION ALL
SELECT 'sequence', s.seqrelid::regclass::text,
       format('%s start=%s increment=%s min=%s max=%s cache=%s cycle=%s', format_type(s.seqtypid, NULL),
              s.seqstart, s.seqincrement, s.seqmin, s.seqmax, s.seqcache, s.seqcycle)
  FROM pg_sequence s JOIN rels r ON r.oid = s.seqrelid
UNION ALL
SELECT 'enum', t.oid::regtype::text, string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
  FROM pg_type t JOIN members m ON m.classid = 'pg_type'::regclass AND m.objid = t.oid
  JOIN pg_enum e ON e.enumtypid = t.oid GROUP BY t.oid
UNION ALL
SELECT 'schema', nspname, nspacl::text FROM pg_namespace WHERE nspname = 'wal_delivery'
UNION ALL
SELECT 'comment', pg_describe_object(d.classoid, d.objoid, d.objsubid), d.description
  FROM pg_description d
 WHERE (d.classoid, d.objoid) IN (SELECT classid, objid FROM members)
    OR (d.classoid = 'pg_namespace'::regclass AND d.objoid = 'wal_delivery'::regnamespace)
UNION ALL
SELECT 'initial privileges', pg_describe_object(i.classoid, i.objoid, i.objsubid), i.initprivs::text
  FROM pg_init_privs i
 WHERE (i.classoid, i.objoid) IN (SELECT classid, objid FROM members)
    OR (i.classoid = 'pg_namespace'::regclass AND i.objoid = 'wal_delivery'::regnamespace)
UNION ALL
-- Everything else an object depends on (sequence ownership, defaults, foreign keys, ...),
-- with the OIDs that name toast tables and foreign-key triggers taken out.
SELECT 'depends', regexp_replace(x.obj, '_[0-9]+', '_N', 'g'), regexp_replace(x.ref, '_[0-9]+', '_N', 'g')
  FROM (SELECT pg_describe_object(classid, objid, objsubid) AS obj,
               pg_describe_object(refclassid, refobjid, refobjsubid) || ' ' || deptype::text AS ref
          FROM pg_depend) x
 WHERE x.obj ~ 'wal_delivery|wal_enqueue' OR x.ref ~ 'wal_delivery|wal_enqueue'
$$;

-- Every released version, oldest first: one per file in sql/releases/
-- (tests/integration/test_sql_sources.py checks).
CREATE TEMP TABLE releases (version text PRIMARY KEY);
INSERT INTO releases VALUES ('1.0');

CREATE TEMP TABLE updated (release text, kind text, object text, detail text);
CREATE TEMP TABLE kept (release text, what text, value text);
DROP EXTENSION wal_delivery CASCADE;
SET client_min_messages = warning;  -- "already installed" when a release is the current version
DO $$
DECLARE
    v text;
BEGIN
    FOR v IN SELECT version FROM releases ORDER BY string_to_array(version, '.')::int[] LOOP
        EXECUTE format('CREATE EXTENSION wal_delivery VERSION %L', v);
        -- Data written under the release.
        INSERT INTO wal_delivery.topics (name, replication_factor, min_insync_replicas) VALUES ('old.events', 1, 1);
        INSERT INTO wal_delivery.destinations (name, endpoint) VALUES ('old-b', 'http://b.test/'), ('old-a', 'http://a.test/');
        PERFORM wal_enqueue('old.events', '{"kept": true}'::jsonb, 'kept-1');

        ALTER EXTENSION wal_delivery UPDATE;

        INSERT INTO kept
        SELECT v, 'at the current version',
               (extversion = (SELECT default_version FROM pg_available_extensions WHERE name = 'wal_delivery'))::text
          FROM pg_extension WHERE extname = 'wal_delivery'
        UNION ALL
        SELECT v, 'outbox row', concat_ws(' ', topic, idempotency_key, state) FROM wal_delivery.outbox
        UNION ALL
        SELECT v, 'retry partition', name || ' ' || retry_partition FROM wal_delivery.destinations;
        -- A new destination takes the next retry partition, which cannot change.
        INSERT INTO wal_delivery.destinations (name, endpoint) VALUES ('new-c', 'http://c.test/');
        INSERT INTO kept
        SELECT v, 'retry partition', name || ' ' || retry_partition FROM wal_delivery.destinations WHERE name = 'new-c'
        UNION ALL
        SELECT v, 'changing it', t.sqlstate || ' ' || t.message
          FROM regress.try($q$UPDATE wal_delivery.destinations SET retry_partition = 7 WHERE name = 'new-c'$q$) t;

        INSERT INTO updated SELECT v, c.* FROM regress.extension_catalog() c;
        DROP EXTENSION wal_delivery;
    END LOOP;
END $$;
RESET client_min_messages;
CREATE EXTENSION wal_delivery;
CREATE TEMP TABLE fresh AS SELECT * FROM regress.extension_catalog();

SELECT release, what, value FROM kept ORDER BY release, what, value;
SELECT count(*) AS objects FROM fresh WHERE kind = 'member';
-- Nothing only on one side.
SELECT r.version AS release, 'only after update' AS side, x.kind, x.object, x.detail
  FROM releases r, LATERAL (SELECT kind, object, detail FROM updated u WHERE u.release = r.version
                            EXCEPT ALL SELECT * FROM fresh) x
UNION ALL
SELECT r.version, 'only in a fresh install', y.kind, y.object, y.detail
  FROM releases r, LATERAL (SELECT * FROM fresh
                            EXCEPT ALL SELECT kind, object, detail FROM updated u WHERE u.release = r.version) y
ORDER BY 1, 2, 3, 4;
