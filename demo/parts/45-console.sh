# Demo part: the on-call console, signed in to as a Postgres role of wal_delivery_oncall.
# (Sourced by demo/run.) The demo's Postgres trusts every login, and the console signs in
# only roles whose password the server checks, so the demo's on-call login gets a
# scram-sha-256 line at the top of pg_hba.conf.
# shellcheck shell=bash
demo_step "starting wal-worker console (sign in as oncall_demo, password oncall-demo)"
psql -X -q -v ON_ERROR_STOP=1 <<'SQL'
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'oncall_demo') THEN
        CREATE ROLE oncall_demo LOGIN;
    END IF;
END $$;
ALTER ROLE oncall_demo PASSWORD 'oncall-demo';
GRANT wal_delivery_oncall TO oncall_demo;
SQL
HBA_FILE=$(psql -X -A -t -c "SHOW hba_file")
if ! grep -q '^host all oncall_demo ' "$HBA_FILE"; then
  { printf 'host all oncall_demo 127.0.0.1/32 scram-sha-256\n'; cat "$HBA_FILE"; } >"$HBA_FILE.new"
  cat "$HBA_FILE.new" >"$HBA_FILE" && rm -f "$HBA_FILE.new"
  psql -X -q -c "SELECT pg_reload_conf()" >/dev/null
fi
start_in_background console "$WAL_ENV_DIR/console.log" \
  bin/wal-worker console --listen 127.0.0.1:0 --admin-port 0 \
  --db "host=127.0.0.1 port=$PGPORT dbname=$PGDATABASE"
# shellcheck disable=SC2034  # demo/run declares ADMIN_PORTS and reads it
ADMIN_PORTS["console"]=$(admin_port_of "$WAL_ENV_DIR/console.log")
CONSOLE_PORT=""
for _ in $(seq 1 50); do
  CONSOLE_PORT=$(sed -n 's/.*event=started .*port=\([0-9]*\).*/\1/p' "$WAL_ENV_DIR/console.log" | head -1)
  [ -n "$CONSOLE_PORT" ] && break
  sleep 0.2
done
[ -n "$CONSOLE_PORT" ] || demo_die "the console did not start (see $WAL_ENV_DIR/console.log)"
# shellcheck disable=SC2034  # read by demo/run's "where to look"
CONSOLE_URL="http://127.0.0.1:$CONSOLE_PORT/"
echo "the on-call console: $CONSOLE_URL  (role oncall_demo, password oncall-demo)"
