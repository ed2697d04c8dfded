"""A real S3-compatible server for the archive tests: moto's standalone server on
127.0.0.1 with request signing enforced (it recomputes each request's SigV4 signature
with the caller's secret and refuses a mismatch), an IAM user whose keys the extension
uses, and a bucket. Also a small HTTP relay in front of it that can fail or stall chosen
PUTs, to cut an archive run off halfway."""
import http.client
import http.server
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import boto3
from botocore.config import Config

from conftest import env_cmd

ROOT = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
ALLOW_ALL = '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}'


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """moto's server; after start() every S3 request must be signed by the user's keys."""

    def __init__(self, log_dir):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = open(Path(log_dir) / f"moto-{self.port}.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self.log, stderr=subprocess.STDOUT)
        env_cmd("track", f"moto-{self.port}", str(self.proc.pid), check=False)
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=2).read()
                break
            except OSError:
                if time.time() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"moto did not start (log {self.log.name})")
                time.sleep(0.2)
        iam = boto3.client("iam", endpoint_url=self.endpoint, region_name=REGION,
                           aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
        iam.create_user(UserName="archiver")
        iam.put_user_policy(UserName="archiver", PolicyName="all", PolicyDocument=ALLOW_ALL)
        key = iam.create_access_key(UserName="archiver")["AccessKey"]
        self.access_key_id, self.secret_access_key = key["AccessKeyId"], key["SecretAccessKey"]
        # From here on moto checks every request's signature and the user's policy.
        urllib.request.urlopen(urllib.request.Request(
            self.endpoint + "/moto-api/reset-auth", data=b"0", method="POST",
            headers={"Content-Type": "text/plain"}), timeout=10).read()

    def client(self, secret=None):
        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=self.access_key_id,
                            aws_secret_access_key=secret or self.secret_access_key,
                            config=Config(s3={"addressing_style": "path"}))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class FaultyRelay:
    """An HTTP server on 127.0.0.1 that passes requests through to upstream unchanged
    (the signature still matches: the Host header is passed as sent) except that the
    PUTs numbered in fail_puts get a 503 and those in stall_puts get no answer for
    stall_seconds."""

    def __init__(self, upstream_port, fail_puts=(), stall_puts=(), stall_seconds=30):
        self.upstream_port = upstream_port
        self.fail_puts, self.stall_puts, self.stall_seconds = set(fail_puts), set(stall_puts), stall_seconds
        self.puts = 0
        self.lock = threading.Lock()
        relay = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.command == "PUT":
                    with relay.lock:
                        relay.puts += 1
                        n = relay.puts
                    if n in relay.stall_puts:
                        time.sleep(relay.stall_seconds)
                    if n in relay.fail_puts:
                        msg = b"<Error><Code>SlowDown</Code><Message>injected failure</Message></Error>"
                        self.send_response(503)
                        self.send_header("Content-Length", str(len(msg)))
                        self.end_headers()
                        self.wfile.write(msg)
                        return
                conn = http.client.HTTPConnection("127.0.0.1", relay.upstream_port, timeout=60)
                conn.request(self.command, self.path, body=body, headers=dict(self.headers))
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


class SelfSignedHttps:
    """An HTTPS server on 127.0.0.1 whose certificate no CA vouches for; it answers 200
    to anything, so only certificate verification can refuse it."""

    def __init__(self, directory):
        import datetime
        import ipaddress
        import ssl

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                               critical=False)
                .sign(key, hashes.SHA256()))
        cert_file, key_file = Path(directory) / "cert.pem", Path(directory) / "key.pem"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        self.requests = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_PUT(self):
                server.requests += 1
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.endpoint = f"https://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
