# Demo part: a failed delivery is retried by wal-worker retry; dead letters land in SQL.
# (Sourced by demo/run.) The retry worker runs at --time-scale 10: step 1 waits 1 s.
# shellcheck shell=bash
demo_step "starting wal-worker retry and wal-worker dlq (time scale 10: retry step 1 waits 1 s)"
start_in_background retry "$WAL_ENV_DIR/retry.log" \
  bin/wal-worker retry --db "$WORKER_DB" --admin-port 0 --time-scale 10 -X "bootstrap.servers=$KAFKA_BOOTSTRAP"
start_in_background dlq "$WAL_ENV_DIR/dlq.log" \
  bin/wal-worker dlq --db "$WORKER_DB" --admin-port 0 -X "bootstrap.servers=$KAFKA_BOOTSTRAP"
# shellcheck disable=SC2034  # demo/run declares ADMIN_PORTS and reads it
ADMIN_PORTS["retry"]=$(admin_port_of "$WAL_ENV_DIR/retry.log")
# shellcheck disable=SC2034  # demo/run declares ADMIN_PORTS and reads it
ADMIN_PORTS["dlq"]=$(admin_port_of "$WAL_ENV_DIR/dlq.log")
sleep 3 # both join their consumer groups

demo_step "the sample destination answers 503 once, then 400 for a refund: a retry and a dead letter"
curl -s -X POST "$DEST_URL/_control/behaviour" -d '{"path": "/orders", "status": 503, "times": 1}' >/dev/null
psql -X -q -v ON_ERROR_STOP=1 -c \
  "SELECT wal_enqueue('orders.events', '{\"order_id\": 4, \"event\": \"created\"}'::jsonb, 'order-4-created')" >/dev/null
for _ in $(seq 1 100); do
  [ "$(grep -c '"order-4-created"' "$WAL_ENV_DIR/destination.jsonl")" -ge 2 ] && break
  sleep 0.2
done
curl -s -X POST "$DEST_URL/_control/behaviour" -d '{"path": "/orders", "status": 400, "times": 1}' >/dev/null
psql -X -q -v ON_ERROR_STOP=1 -c \
  "SELECT wal_enqueue('orders.events', '{\"order_id\": 4, \"event\": \"refund\"}'::jsonb, 'order-4-refund')" >/dev/null
for _ in $(seq 1 100); do
  [ "$(psql -X -A -t -c "SELECT count(*) FROM wal_delivery.dead_letters")" -ge 1 ] && break
  sleep 0.2
done
sleep 1.5 # the retry worker reports its counters every second
echo "attempts of order-4-created (1 = main consumer, 2 = retry step 1):"
python3 - "$WAL_ENV_DIR/destination.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    h = r["headers"]
    # Idempotency-Key is "<topic>:<key>": keys are unique per topic.
    if h.get("idempotency-key", "").split(":", 1)[-1] in ("order-4-created", "order-4-refund"):
        print(f'  {h["idempotency-key"]}  x-wal-attempt={h.get("x-wal-attempt")}  answered {r.get("status")}')
PY
psql -X -q <<'SQL'
SELECT id, destination, idempotency_key, last_error FROM wal_delivery.unresolved_dead_letters;
SELECT destination, breaker, delivered, failed, backlog FROM wal_delivery.destination_status;
SQL
echo "on-call would now run: SELECT wal_delivery.replay_dead_letter(<id>);  or  resolve_dead_letter(<id>, 'note')"
