# Demo part: records into Kafka and back, read with kcat. (Sourced by demo/run.)
step "producing sample records to Kafka topic demo.events and reading them back"
for i in 1 2 3; do echo "{\"order_id\": $i, \"event\": \"created\"}"; done |
  kcat -P -b "$KAFKA_BOOTSTRAP" -t demo.events -H source=demo -X acks=all
kcat -C -b "$KAFKA_BOOTSTRAP" -t demo.events -o beginning -e -q \
  -f 'topic=%t partition=%p offset=%o headers=%h value=%s\n'
