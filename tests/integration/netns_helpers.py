"""Separate hosts on one machine for tests: network namespaces on a bridge the test
creates, with private addresses (10.213.N.0/24) that nothing routes off the machine, and
TCP relays that make services listening on 127.0.0.1 (tests/env's Postgres and Kafka,
a tests/destination.py) reachable from those hosts. Everything is removed at teardown.

The relays, rather than new listen addresses, keep tests/env as it is: its Postgres
trusts 127.0.0.1 only and its broker advertises 127.0.0.1:PORT, so inside each namespace
a relay on 127.0.0.1:PORT leads to a root-side relay on the bridge, which leads to the
broker. Closing a host's Postgres relay cuts that host off from the database alone.
"""
import os
import random
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from consumer_helpers import Worker
from tcp_relay import TcpRelay  # noqa: F401 (the tests take it from here)

RELAY = str(Path(__file__).with_name("tcp_relay.py"))


def run(*cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {out.returncode}: {out.stderr.strip()}")
    return out.stdout


class Hosts:
    """A bridge with address .1 in the root namespace and hosts .11, .12, ... each in its
    own namespace with a veth port on that bridge."""

    def __init__(self, count):
        tag = f"{os.getpid() % 10000:04d}{random.randrange(100):02d}"
        self.bridge = f"wdpbr{tag}"
        self.subnet = self._free_subnet()
        self.gateway = f"10.213.{self.subnet}.1"
        self.names, self.addrs, self.procs = [], [], []
        try:
            run("ip", "link", "add", self.bridge, "type", "bridge")
            run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            run("ip", "link", "set", self.bridge, "up")
            for i in range(count):
                self._add_host(tag, i)
        except Exception:
            self.remove()
            raise

    @staticmethod
    def _free_subnet():
        used = run("ip", "-4", "-o", "addr")
        for _ in range(100):
            n = random.randrange(1, 255)
            if f"10.213.{n}." not in used:
                return n
        raise RuntimeError("no free 10.213.N.0/24 subnet on this machine")

    def _add_host(self, tag, i):
        ns, outside = f"wdp{tag}-{i}", f"wdp{tag}h{i}"
        addr = f"10.213.{self.subnet}.{11 + i}"
        run("ip", "netns", "add", ns)
        self.names.append(ns)
        run("ip", "link", "add", outside, "type", "veth", "peer", "name", f"wdp{tag}n{i}")
        run("ip", "link", "set", f"wdp{tag}n{i}", "netns", ns)
        run("ip", "link", "set", outside, "master", self.bridge, "up")
        run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{addr}/24", "dev", f"wdp{tag}n{i}")
        run("ip", "netns", "exec", ns, "ip", "link", "set", f"wdp{tag}n{i}", "up")
        self.addrs.append(addr)

    def relay_inside(self, i, listen_port, target_port):
        """A relay in host i on 127.0.0.1:listen_port to the root's gateway:target_port."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.names[i], sys.executable, RELAY,
                                 "127.0.0.1", str(listen_port), self.gateway,
                                 str(target_port)], stdout=subprocess.PIPE, text=True)
        self.procs.append(proc)
        if proc.stdout.readline().strip() != "relaying":
            raise RuntimeError(f"the relay in {self.names[i]} did not start")

    def remove(self):
        for proc in self.procs:
            proc.kill()
            proc.wait()
        for ns in self.names:
            # Whatever still runs in the namespace goes with it.
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            for pid in pids.stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


class HostWorker(Worker):
    """A wal-worker in one of the hosts, its admin port on the host's address."""

    def __init__(self, tmp_path, hosts, i, *args, **kw):
        self.addr = hosts.addrs[i]
        super().__init__(tmp_path, "consume", "--admin-listen", self.addr, *args,
                         wrapper=("ip", "netns", "exec", hosts.names[i]), **kw)

    def url(self, path):
        return f"http://{self.addr}:{self.admin_port}{path}"


def http_get(url, token=None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return None, ""
