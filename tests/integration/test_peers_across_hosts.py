"""Peers across hosts: `wal-worker consume` instances as separate hosts (network
namespaces on a bridge the test creates), HAProxy in front of their admin ports. With
Postgres stopped, a new consume instance on a fourth host, given only the load balancer
as --peer, takes the newest config any peer holds and delivers the records waiting in
Kafka; a peer left behind on an older version is never preferred, and while the database
stays away the new instance moves up to a newer version a peer gets, never back down.
/config needs the fleet's bearer token across hosts: without it the instance says why,
keeps asking and does not crash."""
import json
import os
import re
import shutil
import socket
import subprocess
import urllib.request

import pytest

from conftest import Destination, connect, env_cmd, record_key
from consumer_helpers import PEER_TOKEN, add_destination, ensure_worker_login, wait_published
from netns_helpers import HostWorker, Hosts, TcpRelay, http_get
from relay_helpers import make_topic, report, wait_all_stored, wait_until

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"

pytestmark = pytest.mark.usefixtures("clean_destinations")


@pytest.fixture
def hosts():
    # CI runs as root like this machine: a namespace that cannot be made is a failure.
    try:
        h = Hosts(4)
    except (RuntimeError, OSError) as e:
        pytest.fail(f"cannot make network namespaces (the test needs root and `ip netns`): {e}")
    yield h
    h.remove()


def start_haproxy(tmp_path, bind_host, backends):
    """Round-robin over the peers' admin ports, with health checks, on bind_host."""
    if not os.path.exists(HAPROXY):
        pytest.fail("haproxy is not installed (tests/setup installs it)")
    with socket.socket() as s:
        s.bind((bind_host, 0))
        port = s.getsockname()[1]
    servers = "\n".join(f"    server peer{i} {b} check inter 300ms fall 2 rise 1"
                        for i, b in enumerate(backends))
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(f"""global
    maxconn 200
defaults
    mode http
    timeout connect 1s
    timeout client 10s
    timeout server 10s
frontend peers
    bind {bind_host}:{port}
    default_backend peers
backend peers
    balance roundrobin
    http-response set-header X-Peer %s
{servers}
""")
    proc = subprocess.Popen([HAPROXY, "-f", str(cfg), "-db"], stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / "haproxy.log", "w"))
    return proc, f"http://{bind_host}:{port}"


def http_headers(url, token):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.headers  # case-insensitive: HAProxy sends names in lower case


def config_version(conn):
    return conn.execute("SELECT version FROM wal_delivery.config_version").fetchone()[0]


def peer_versions(worker):
    """The versions the worker took from a peer, in order (its event=config_from_peer lines)."""
    return [int(v) for v in re.findall(r"event=config_from_peer peer=\S+ version=(\d+)",
                                       worker.output())]


def test_a_new_consumer_takes_the_newest_config_through_the_load_balancer(
        tmp_path, hosts, kafka_bootstrap, unique):
    topic, idle_topic = f"x.peers.{unique}", f"x.idle.{unique}"
    main, idle = f"main-{unique}", f"idle-{unique}"
    kafka_port = int(kafka_bootstrap.rsplit(":", 1)[1])
    relays, workers, pg_stopped, lb = [], [], False, None
    dest = Destination(tmp_path)

    def relay(port):
        r = TcpRelay(hosts.gateway, ("127.0.0.1", port))
        relays.append(r)
        return r

    def worker(i, *args, **kw):
        w = HostWorker(tmp_path, hosts, i, *args, kafka_bootstrap=kafka_bootstrap,
                       conninfo=f"host={hosts.gateway} port={db[i].port} "
                                f"dbname={os.environ['PGDATABASE']} connect_timeout=2", **kw)
        workers.append(w)
        return w

    try:
        # Each host reaches the broker at 127.0.0.1:PORT, which it advertises, through
        # the bridge; Postgres through a relay of its own, to cut one host off alone.
        kafka = relay(kafka_port)
        for i in range(4):
            hosts.relay_inside(i, kafka_port, kafka.port)
        db = [relay(int(os.environ["PGPORT"])) for _ in range(4)]
        dest_url = f"http://{hosts.gateway}:{relay(int(dest.url.rsplit(':', 1)[1])).port}"
        ensure_worker_login()
        with connect() as conn:
            make_topic(conn, topic)
            make_topic(conn, idle_topic)
            # The three peers serve a dedicated destination, so the records of `topic`
            # wait in Kafka for the shared consumer the test starts later.
            add_destination(conn, idle, dest_url + "/idle", [idle_topic], dedicated=True)
            add_destination(conn, main, dest_url + "/v1", [topic])
        peers = [worker(i, "--destination", idle) for i in range(3)]
        with connect() as conn:
            wait_published(conn)  # starting a worker may change the config (its login)
            v1 = config_version(conn)
        for w in peers:
            w.wait_ready()
            wait_until(lambda w=w: w.metric("wal_config_version") == v1, 30,
                       what=f"the peers to hold version {v1}")

        # The third peer loses its link to Postgres; the config changes without it.
        db[2].close()
        with connect() as conn:
            conn.execute("UPDATE wal_delivery.destinations SET endpoint = %s WHERE name = %s",
                         (dest_url + "/v2", main))
            wait_published(conn)
            v2 = config_version(conn)
        for w in peers[:2]:
            wait_until(lambda w=w: w.metric("wal_config_version") == v2, 30,
                       what=f"a peer to follow version {v2}")
        assert peers[2].metric("wal_config_version") == v1

        lb_proc, lb = start_haproxy(tmp_path, hosts.gateway, [f"{w.addr}:{w.admin_port}" for w in peers])
        wait_until(lambda: http_get(lb + "/config", PEER_TOKEN)[0] == 200, 30, what="HAProxy")
        # Across hosts as on loopback: /config only with the fleet's bearer token.
        assert http_get(lb + "/config")[0] == 401
        assert http_get(lb + "/config", "not-the-token")[0] == 401

        keys = [f"k{i}" for i in range(40)]
        with connect() as conn:
            conn.execute("SELECT wal_enqueue_batch(%s, %s::jsonb[], %s)",
                         (topic, [json.dumps({"k": k}) for k in keys], keys))
            wait_all_stored(conn, topic, len(keys))
        env_cmd("pg-stop")
        pg_stopped = True

        # On the fourth host, without the token or with a wrong one: refused, said, retried.
        outsiders = [worker(3, "--peer", lb, env={"WAL_PEER_TOKEN": t}) for t in ("", "a-guess")]
        for w in outsiders:
            wait_until(lambda w=w: w.output().count("event=peer_refused") >= 2
                       or w.proc.poll() is not None, 60, what="two refusals")
            assert w.proc.poll() is None, "a worker refused by its peers must wait, not exit"
            assert "status=401" in w.output() and "WAL_PEER_TOKEN" in w.output()
            assert "event=config_from_peer" not in w.output()
            assert w.stop(timeout=10) == 0

        # With the token: the newest version the peers hold, even when the load balancer
        # hands its first ask to the peer left behind (round robin: peer2 follows peer1).
        wait_until(lambda: http_headers(lb + "/config", PEER_TOKEN).get("X-Peer") == "peer1", 10,
                   what="HAProxy's round robin to point at the old peer")
        newcomer = worker(3, "--peer", lb)
        wait_until(lambda: peer_versions(newcomer), 60, what="config from a peer")
        assert peer_versions(newcomer) == [v2], newcomer.output()
        got = dest.wait_for(len(keys), path="/v2", timeout=60)
        assert sorted(record_key(r) for r in got) == sorted(keys)
        assert dest.requests("/v1") == []
        # The peer left behind was asked and ignored.
        wait_until(lambda: newcomer.metric("wal_peer_config_total", peer=lb, outcome="older") >= 1,
                   40, what="the older peer's answer to be ignored")
        assert f"event=peer_config_older peer={lb} version={v1}" in newcomer.output()
        assert newcomer.metric("wal_config_version") == v2

        # The newcomer stays cut off from Postgres; the database comes back for the
        # others and the config changes: it moves up through the load balancer.
        db[3].close()
        env_cmd("pg-start")
        pg_stopped = False
        with connect() as conn:
            conn.execute("UPDATE wal_delivery.destinations SET endpoint = %s WHERE name = %s",
                         (dest_url + "/v3", main))
            wait_published(conn)
            v3 = config_version(conn)
        wait_until(lambda: newcomer.metric("wal_config_version") == v3, 60,
                   what=f"the newcomer to move up to version {v3}")
        assert peer_versions(newcomer) == [v2, v3]
        later = [f"m{i}" for i in range(10)]
        with connect() as conn:
            conn.execute("SELECT wal_enqueue_batch(%s, %s::jsonb[], %s)",
                         (topic, [json.dumps({"k": k}) for k in later], later))
        got = dest.wait_for(len(later), path="/v3", timeout=60)
        assert sorted(record_key(r) for r in got) == sorted(later)
        # Still answered by the peer on the oldest version, it never moves back.
        assert newcomer.metric("wal_config_version") == v3
        assert newcomer.proc.poll() is None
        report(f"peers across hosts: config v{v2} through HAProxy from 3 peers (one on v{v1}), "
               f"{len(keys)} records delivered with Postgres down, moved up to v{v3}; asks "
               f"ignored as older: {newcomer.metric('wal_peer_config_total', peer=lb, outcome='older'):.0f}")
    finally:
        for w in workers:
            w.stop(timeout=10)
        if lb:
            lb_proc.terminate()
            lb_proc.wait(10)
        for r in relays:
            r.close()
        dest.stop()
        if pg_stopped:
            env_cmd("pg-start")
