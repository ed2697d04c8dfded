# Demo part: dead-letter archival to S3, scheduled with pg_cron. The S3 server is moto's,
# from .cache/venv, on 127.0.0.1; it checks every request's SigV4 signature against the
# keys of a user it made. (Sourced by demo/run.)
# shellcheck shell=bash
demo_step "archiving an old dead letter to a local S3-compatible server (moto); pg_cron schedules the job"
S3_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
S3_URL="http://127.0.0.1:$S3_PORT"
start_in_background s3 "$WAL_ENV_DIR/s3.log" .cache/venv/bin/python -m moto.server -H 127.0.0.1 -p "$S3_PORT"
for _ in $(seq 1 300); do
  curl -sf "$S3_URL/moto-api/" >/dev/null && break
  sleep 0.2
done
# A user with keys and a bucket; from then on the server refuses unsigned or badly signed requests.
read -r S3_KEY S3_SECRET < <(.cache/venv/bin/python - "$S3_URL" <<'PY'
import sys, urllib.request
import boto3
url = sys.argv[1]
iam = boto3.client("iam", endpoint_url=url, region_name="us-east-1",
                   aws_access_key_id="setup", aws_secret_access_key="setup")
iam.create_user(UserName="archiver")
iam.put_user_policy(UserName="archiver", PolicyName="all", PolicyDocument=
    '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}')
key = iam.create_access_key(UserName="archiver")["AccessKey"]
urllib.request.urlopen(urllib.request.Request(url + "/moto-api/reset-auth", data=b"0", method="POST",
                                              headers={"Content-Type": "text/plain"}))
boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id=key["AccessKeyId"],
             aws_secret_access_key=key["SecretAccessKey"]).create_bucket(Bucket="demo-dead-letters")
print(key["AccessKeyId"], key["SecretAccessKey"])
PY
)
[ -n "${S3_SECRET:-}" ] || demo_die "could not set up the S3 server (log: $WAL_ENV_DIR/s3.log)"
echo "S3 server at $S3_URL, bucket demo-dead-letters"
psql -X -q -v ON_ERROR_STOP=1 -v endpoint="$S3_URL" -v key="$S3_KEY" -v secret="$S3_SECRET" <<'SQL'
UPDATE wal_delivery.settings
   SET archive_s3_endpoint = :'endpoint', archive_s3_region = 'us-east-1',
       archive_s3_bucket = 'demo-dead-letters',
       archive_s3_path_style = true, archive_s3_allow_http = true;  -- a local test server
INSERT INTO wal_delivery.archive_credentials (access_key_id, secret_access_key) VALUES (:'key', :'secret');
-- Dead letters go after dead_letter_archive_after (10 days); the demo cannot wait that
-- long, so the refund's dead letter is made 11 days old.
UPDATE wal_delivery.dead_letters SET failed_at = failed_at - interval '11 days'
 WHERE idempotency_key = 'order-4-refund';
SQL
# Daily at 03:17 (pg_cron is preloaded, cron.database_name is this database). A Postgres
# of tests/deps/postgres may have no pg_cron (docs/operations.md, "From source").
if [ "$(psql -X -Atc "SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_cron'")" = 1 ]; then
  psql -X -q -v ON_ERROR_STOP=1 <<'SQL'
CREATE EXTENSION IF NOT EXISTS pg_cron;
SELECT wal_delivery.schedule_dead_letter_archival() AS cron_job;
SELECT jobname, schedule, command FROM cron.job;
SQL
else
  echo "this Postgres has no pg_cron: the daily job is not scheduled"
fi
echo "running the job's command now, by hand:"
psql -X -q -v ON_ERROR_STOP=1 <<'SQL'
CALL wal_delivery.archive_dead_letters();
SELECT count(*) AS dead_letters_left FROM wal_delivery.dead_letters;
SQL
echo "the archive object, read back from S3 with boto3:"
.cache/venv/bin/python - "$S3_URL" "$S3_KEY" "$S3_SECRET" <<'PY'
import gzip, json, sys
import boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1", aws_access_key_id=sys.argv[2],
                  aws_secret_access_key=sys.argv[3], config=Config(s3={"addressing_style": "path"}))
for obj in s3.list_objects_v2(Bucket="demo-dead-letters").get("Contents", []):
    print(f'  s3://demo-dead-letters/{obj["Key"]} ({obj["Size"]} bytes)')
    body = s3.get_object(Bucket="demo-dead-letters", Key=obj["Key"])["Body"].read()
    for line in gzip.decompress(body).decode().splitlines():
        e = json.loads(line)
        print(f'    id={e["id"]} topic={e["topic"]} idempotency_key={e["idempotency_key"]} last_error={e["last_error"]!r}')
PY
echo "restore it with: SELECT * FROM wal_delivery.restore_dead_letters('<object key>');"
