# shellcheck shell=bash
# bench/deliver/connect_sink.sh: Kafka Connect with an open-source HTTP sink connector, the
# third consumer of bench/deliver/run (sourced by it; uses its say, die, LOGS, ROOT and
# KAFKA_BOOTSTRAP).
#
# The connector: io.github.clescot:kafka-connect-http-connectors 0.8.84 (Apache License 2.0,
# class io.github.clescot.kafka.connect.http.sink.HttpSinkConnector, okhttp client), the
# newest version on Maven Central, in its Confluent-Hub style zip (every dependency in lib/;
# no Confluent-licensed jar among them). Kafka Connect: the 4.3.0 standalone worker that
# bench/anchors/debezium uses, resolved with Maven (bench/deliver/pom.xml, profile connect).
# The zip is fetched from Maven Central with curl and checked against Central's .sha1: Maven
# cannot resolve it, because its pom names a parent (io.github.clescot:kafka-connect-http
# 0.8.84) that was never published there (Central has that parent only at 0.2.148 to
# 0.8.119, none of them a version of the connectors artifact).
#
# The JVM (as bench/anchors/debezium runs Connect): -Xms256m -Xmx1g, G1, exit on
# OutOfMemoryError, plus bytecode verification of plugin classes off (below); one standalone worker on 127.0.0.1 with its REST port on loopback,
# StringConverter for keys and values (the record value reaches the connector as the JSON
# text the relay wrote), offsets in a file. Started afresh for each measured run (so its
# peak RSS and CPU are that run's), with no connector; the clock starts when the
# connectors are created.
#
# One connector per destination: the connector maps one record to one request (its JEXL
# request mapper's url is one expression), so fanning a topic out to 3 URLs takes 3
# connectors, each with its own consumer group (connect-<name>) reading the topic from the
# beginning, like the worker's 3 subscriptions. Each: tasks.max 1, POST of the record's
# value with Content-Type: application/json to a fixed URL (mapper mode JEXL: url, method
# and headers are constant expressions, body sinkRecord.value()). Requests in flight: the
# task hands each request of a batch to a thread pool that waits for the answer, so the
# pool's size (httpclient.async.fixed.thread.pool.size) is the number in flight; IN_FLIGHT,
# like the worker's max_in_flight (left unset, ~4 were in flight at 200 ms). okhttp's
# dispatcher gets the same limit (its defaults: 64, 5 per host), a pool of IN_FLIGHT idle
# connections kept 60 s (its default keeps none: a new connection per request), request
# logging off.
#
# A 503 (found on this version, 2026-12-05): the exchange is marked failed and the record
# is done; the offset is committed past it. Not retried: not by default (no retry policy)
# and not with the documented config.default.retry.policy.* settings and retry code regex
# ^5[0-9][0-9]$ set either (the sink still got exactly one request per record). Not sent
# to Connect's dead letter queue with errors.tolerance=all and
# errors.deadletterqueue.topic.name set (the topic stayed empty). So a 503'd copy is lost;
# the connector can also publish every exchange to a topic (publish.mode PRODUCER), which
# needs Confluent's schema-registry client, not in its zip nor on Maven Central.
#
# -XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote: without it the sink task
# fails to start with NoClassDefFoundError io/confluent/kafka/schemaregistry/client/
# SchemaRegistryClient: verifying its publish code loads that class, which is missing for
# the reason above; unverified, the class is loaded only if that code runs, and with
# publish.mode NONE (the default) it does not.

CONNECT_LIBS=$ROOT/.cache/connect-sink/libs
CONNECT_HTTPSINK_VERSION=0.8.84
CONNECT_PID='' CONNECT_PORT=''

# connect_fetch: Kafka Connect and the connector into .cache/connect-sink, once per pom
connect_fetch() {
  local stamp=$CONNECT_LIBS/pom.sha256 want url zip sha
  want=$(cat "$HERE/pom.xml" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return 0; fi
  say "resolving Kafka Connect with Maven ($HERE/pom.xml) and fetching the HTTP sink connector"
  rm -rf "$CONNECT_LIBS" && mkdir -p "$CONNECT_LIBS/plugins"
  mvn -B -q -f "$HERE/pom.xml" -P connect \
    org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$CONNECT_LIBS/connect" >"$LOGS/mvn.log" 2>&1 ||
    { tail -20 "$LOGS/mvn.log" >&2; die "Maven could not resolve Kafka Connect (log: $LOGS/mvn.log)"; }
  url=https://repo.maven.apache.org/maven2/io/github/clescot/kafka-connect-http-connectors
  url+=/$CONNECT_HTTPSINK_VERSION/kafka-connect-http-connectors-$CONNECT_HTTPSINK_VERSION.zip
  zip=$CONNECT_LIBS/httpsink.zip
  curl -sfSL -o "$zip" "$url" || die "could not fetch $url"
  sha=$(curl -sfSL "$url.sha1") || die "could not fetch $url.sha1"
  [ "$(sha1sum "$zip" | cut -d' ' -f1)" = "${sha:0:40}" ] || die "$zip does not match Maven Central's .sha1"
  # The zip's top directory (lib/ with every jar) is the plugin: one class loader of its own.
  (cd "$CONNECT_LIBS/plugins" && unzip -q "$zip") || die "could not unpack $zip"
  rm -f "$zip"
  echo "$want" >"$stamp"
}

# connect_start: a fresh Connect standalone worker with no connector; sets CONNECT_PID, CONNECT_PORT
connect_start() {
  read -r CONNECT_PORT <<<"$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
  rm -f "$LOGS/connect.offsets"
  cat >"$LOGS/connect-worker.properties" <<EOF
bootstrap.servers=$KAFKA_BOOTSTRAP
listeners=http://127.0.0.1:$CONNECT_PORT
plugin.path=$CONNECT_LIBS/plugins
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.storage.StringConverter
offset.storage.file.filename=$LOGS/connect.offsets
EOF
  java -Xms256m -Xmx1g -XX:+UseG1GC -XX:+ExitOnOutOfMemoryError -XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$HERE/connect-log4j2.xml" -cp "$CONNECT_LIBS/connect/*" \
    org.apache.kafka.connect.cli.ConnectStandalone "$LOGS/connect-worker.properties" >>"$LOGS/connect.log" 2>&1 &
  CONNECT_PID=$!
  "$ROOT/tests/env" track connect "$CONNECT_PID" 2>/dev/null || true
  local deadline=$((SECONDS + 120))
  until curl -s -f "http://127.0.0.1:$CONNECT_PORT/connectors" >/dev/null 2>&1; do
    kill -0 "$CONNECT_PID" 2>/dev/null || { tail -30 "$LOGS/connect.log" >&2; die "Kafka Connect exited (log: $LOGS/connect.log)"; }
    [ $SECONDS -ge $deadline ] && { tail -30 "$LOGS/connect.log" >&2; die "Kafka Connect's REST API did not answer in 120 s"; }
    sleep 0.5
  done
}

# connect_create NAME TOPIC URL IN_FLIGHT: an HTTP sink connector POSTing each record of
# TOPIC to URL, from the topic's beginning (a new name is a new consumer group)
connect_create() {
  local name=$1 topic=$2 url=$3 in_flight=$4
  cat >"$LOGS/connector-$name.json" <<EOF
{
  "connector.class": "io.github.clescot.kafka.connect.http.sink.HttpSinkConnector",
  "tasks.max": "1",
  "topics": "$topic",
  "consumer.override.auto.offset.reset": "earliest",
  "http.request.mapper.default.mode": "JEXL",
  "http.request.mapper.default.url": "'$url'",
  "http.request.mapper.default.method": "'POST'",
  "http.request.mapper.default.body": "sinkRecord.value()",
  "http.request.mapper.default.headers": "{'Content-Type': ['application/json', ...]}",
  "httpclient.async.fixed.thread.pool.size": "$in_flight",
  "config.default.okhttp.dispatcher.max.requests": "$in_flight",
  "config.default.okhttp.dispatcher.max.requests.per.host": "$in_flight",
  "config.default.okhttp.connection.pool.max.idle.connections": "$in_flight",
  "config.default.okhttp.connection.pool.keep.alive.duration": "60000",
  "config.default.okhttp.interceptor.logging.activate": "false"${CONNECT_EXTRA:+,
  $CONNECT_EXTRA}
}
EOF
  curl -s -f -X PUT "http://127.0.0.1:$CONNECT_PORT/connectors/$name/config" \
    -H 'Content-Type: application/json' --data @"$LOGS/connector-$name.json" >/dev/null ||
    die "Kafka Connect refused connector $name (log: $LOGS/connect.log)"
}

# connect_stop: the worker gone (SIGTERM: it stops its connectors; SIGKILL after 30 s)
connect_stop() {
  local i
  [ -n "$CONNECT_PID" ] || return 0
  kill -TERM "$CONNECT_PID" 2>/dev/null || true
  for ((i = 0; i < 300; i++)); do kill -0 "$CONNECT_PID" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$CONNECT_PID" 2>/dev/null || true
  wait "$CONNECT_PID" 2>/dev/null || true
  CONNECT_PID=''
}
