# Demo part: the consumer delivers from Kafka to the sample destination. (Sourced by demo/run.)
step "starting wal-worker consume; it delivers every record to every subscribed destination"
ADMIN_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
bin/wal-worker consume --admin-port "$ADMIN_PORT" -X "bootstrap.servers=$KAFKA_BOOTSTRAP" \
  >"$WAL_ENV_DIR/consume.log" 2>&1 &
tests/env track consume $!
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
echo "consumer metrics (http://127.0.0.1:$ADMIN_PORT/metrics):"
curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" | grep -E '^wal_(delivered_total|open_records|config_version)' | sed 's/^/  /'
echo "consumer log: $WAL_ENV_DIR/consume.log"
