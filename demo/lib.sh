# What demo/run, demo/stop and the demo's parts share. (Sourced, from the checkout's root.)
#
# The demo's state directory: one per checkout (like tests/env's, but its own, so a demo
# never stops the checkout's test environment); WAL_ENV_DIR overrides it. Ports are free
# ones, picked at start. $WAL_ENV_DIR/demo marks a directory as the demo's; the pid of the
# demo/run that is running for it is in $WAL_ENV_DIR.pid, beside it, from its first step
# on (tests/env up recreates the directory).
# shellcheck shell=bash
export WAL_ENV_DIR=${WAL_ENV_DIR:-/tmp/wal_delivery-demo-$(printf %s "$PWD" | sha256sum | cut -c1-8)}
DEMO_MARKER=$WAL_ENV_DIR/demo
DEMO_PID_FILE=$WAL_ENV_DIR.pid

# Bold headings on a terminal only, and not when NO_COLOR is set (no-color.org).
if [ -t 1 ] && [ -z "${NO_COLOR:-}" ]; then
  step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
else
  step() { printf '\n== %s\n' "$*"; }
fi

demo_die() { echo "demo: $*" >&2; exit 1; }

# demo_run_pid: the pid of the demo/run of this state directory, if it runs (a zombie
# its parent has not reaped yet does not).
demo_run_pid() {
  local pid
  pid=$(cat "$DEMO_PID_FILE" 2>/dev/null) || return 1
  [ -n "$pid" ] && ps -o args= -p "$pid" 2>/dev/null | grep -q 'demo/run' && echo "$pid"
}

# An environment in WAL_ENV_DIR that the demo did not start (a test environment, say)
# is never the demo's to stop.
demo_refuse_foreign_env() {
  if [ -f "$WAL_ENV_DIR/env.sh" ] && [ ! -f "$DEMO_MARKER" ]; then
    demo_die "$WAL_ENV_DIR holds an environment the demo did not start (tests/env's?); unset WAL_ENV_DIR or point it elsewhere"
  fi
}

# start_in_background NAME LOG COMMAND...: runs COMMAND with its output in LOG, tracked
# so that teardown stops it. Disowned: its end is not this shell's to report.
start_in_background() {
  local name=$1 log=$2
  shift 2
  "$@" >"$log" 2>&1 &
  BACKGROUND_PID=$!
  disown "$BACKGROUND_PID"
  tests/env track "$name" "$BACKGROUND_PID"
}

# admin_port_of LOG: the port a worker started with --admin-port 0 logged.
admin_port_of() {
  local port
  for _ in $(seq 1 150); do
    port=$(sed -n 's/.*event=admin_server_started .*port=\([0-9]*\).*/\1/p' "$1" 2>/dev/null | head -1)
    [ -n "$port" ] && { echo "$port"; return 0; }
    sleep 0.2
  done
  demo_die "no admin port in $1"
}

# demo_teardown: SIGTERM to every tracked process (workers finish what is in flight and
# exit 0), up to 20 s for all of them to go, then tests/env down stops Postgres and Kafka
# and removes the state directory.
demo_teardown() {
  local f pid pids=() alive
  for f in "$WAL_ENV_DIR"/pids/*.pid; do
    [ -f "$f" ] && pids+=("$(cat "$f")")
  done
  if [ ${#pids[@]} -gt 0 ]; then
    kill -TERM "${pids[@]}" 2>/dev/null || true
    # One by one: `kill -0 a b` fails as soon as one of them has gone.
    for _ in $(seq 1 100); do
      alive=()
      for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive+=("$pid"); done
      [ ${#alive[@]} -eq 0 ] && break
      sleep 0.2
    done
  fi
  tests/env down
}
