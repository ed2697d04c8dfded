# Demo part: the consumer delivers from Kafka to the sample destination. (Sourced by demo/run.)
# shellcheck shell=bash
demo_step "starting wal-worker consume; it delivers every record to every subscribed destination"
start_in_background consume "$WAL_ENV_DIR/consume.log" \
  bin/wal-worker consume --db "$WORKER_DB" --admin-port 0 -X "bootstrap.servers=$KAFKA_BOOTSTRAP"
ADMIN_PORTS["consume"]=$(admin_port_of "$WAL_ENV_DIR/consume.log")
for _ in $(seq 1 300); do
  [ "$(wc -l <"$WAL_ENV_DIR/destination.jsonl" 2>/dev/null || echo 0)" -ge 3 ] && break
  sleep 0.2
done
echo "requests the sample destination received:"
python3 - "$WAL_ENV_DIR/destination.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    h = r["headers"]
    print(f'  {r["method"]} {r["path"]}  idempotency-key={h.get("idempotency-key")}'
          f'  x-wal-topic={h.get("x-wal-topic")}  body={r.get("body")}')
PY
echo "consumer metrics (http://127.0.0.1:${ADMIN_PORTS[consume]}/metrics):"
curl -s "http://127.0.0.1:${ADMIN_PORTS[consume]}/metrics" |
  grep -E '^wal_(delivered_total|open_records|config_version)' | sed 's/^/  /'
echo "consumer log: $WAL_ENV_DIR/consume.log"
