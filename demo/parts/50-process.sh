# Demo part: a processing topic. Its records are transformed by a SQL processor, run by
# wal-worker process, before the relay ships them. (Sourced by demo/run.)
# shellcheck shell=bash
demo_step "a processing topic: wal-worker process runs a SQL processor before the relay ships"
psql -X -q -v ON_ERROR_STOP=1 -v dest="$DEST_URL/invoices" <<'SQL'
CREATE SCHEMA demo;
-- A SQL processor takes the payload and returns the one to ship (bytea in, bytea out). It
-- never runs with the extension owner's rights, so its schema must be usable by others.
CREATE FUNCTION demo.add_total(payload bytea) RETURNS bytea LANGUAGE sql AS $$
    SELECT convert_to(jsonb_set(r, '{total_with_vat}', to_jsonb(round((r->>'amount')::numeric * 1.2, 2)))::text, 'UTF8')
      FROM (SELECT convert_from(payload, 'UTF8')::jsonb AS r) AS record
$$;
GRANT USAGE ON SCHEMA demo TO PUBLIC;
INSERT INTO wal_delivery.topics (name, partitions, replication_factor, min_insync_replicas, processor_kind, processor)
VALUES ('orders.invoiced', 1, 1, 1, 'sql', 'demo.add_total');
INSERT INTO wal_delivery.destinations (name, endpoint) VALUES ('sample-invoicing', :'dest');
INSERT INTO wal_delivery.subscriptions (topic, destination) VALUES ('orders.invoiced', 'sample-invoicing');
SELECT wal_enqueue('orders.invoiced', '{"order_id": 5, "amount": 10.00}'::jsonb, 'order-5-invoiced') AS outbox_id;
-- Nothing processes it yet: it waits in the outbox, unshipped.
SELECT id, topic, state FROM wal_delivery.outbox WHERE topic = 'orders.invoiced';
SQL

echo "starting wal-worker process (logged in as wal_worker, not a superuser)"
start_in_background process "$WAL_ENV_DIR/process.log" \
  bin/wal-worker process --db "$WORKER_DB" --admin-port 0
# shellcheck disable=SC2034  # demo/run declares ADMIN_PORTS and reads it
ADMIN_PORTS["process"]=$(admin_port_of "$WAL_ENV_DIR/process.log")
for _ in $(seq 1 150); do
  [ "$(psql -X -A -t -c "SELECT count(*) FROM wal_delivery.outbox WHERE topic = 'orders.invoiced' AND state = 'stored'")" = 1 ] && break
  sleep 0.2
done
psql -X -q <<'SQL'
SELECT id, state, attempts, convert_from(payload, 'UTF8') AS payload,
       convert_from(processed_payload, 'UTF8') AS processed_payload
  FROM wal_delivery.outbox WHERE topic = 'orders.invoiced';
SELECT topic, pending, processing, processed, dead FROM wal_delivery.processing_status;
SQL
for _ in $(seq 1 150); do
  grep -q '"/invoices"' "$WAL_ENV_DIR/destination.jsonl" && break
  sleep 0.2
done
echo "the processed record, delivered by wal-worker consume:"
python3 - "$WAL_ENV_DIR/destination.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["path"] == "/invoices":
        print(f'  {r["method"]} {r["path"]}  idempotency-key={r["headers"].get("idempotency-key")}  body={r.get("body")}')
PY
