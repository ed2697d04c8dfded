"""A TCP relay: accepts on one address and joins each connection to a target, in a
thread per direction. close() drops the listener and every open connection, as a cut
cable would; freeze() keeps every connection open and passes nothing more (a new one is
let in by the kernel and never answered), as a link that drops packets does, until
thaw(). Tests import TcpRelay; run as a program it relays until killed (used inside
a network namespace):

    tcp_relay.py LISTEN_HOST LISTEN_PORT TARGET_HOST TARGET_PORT   prints "relaying"
"""
import socket
import sys
import threading
import time


class TcpRelay:
    """Accepts on (listen_host, listen_port) and joins each connection to target. close()
    drops the listener and every open connection, as a cut cable would; freeze() passes
    nothing until thaw()."""

    def __init__(self, listen_host, target, listen_port=0):
        self.target = target
        self.server = socket.create_server((listen_host, listen_port))
        self.port = self.server.getsockname()[1]
        self.conns = []
        self.lock = threading.Lock()
        self.closed = False
        self.flowing = threading.Event()
        self.flowing.set()
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self):
        self.flowing.clear()

    def thaw(self):
        self.flowing.set()

    def _accept(self):
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.flowing.wait()
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()  # the service is down: the client sees its connection closed
                continue
            with self.lock:
                if self.closed:
                    client.close()
                    upstream.close()
                    return
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src, dst):
        try:
            while data := src.recv(65536):
                self.flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.flowing.set()
        with self.lock:
            self.closed = True
            conns, self.conns = self.conns, []
        try:
            self.server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        except OSError:
            pass
        self.server.close()
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


if __name__ == "__main__":
    lhost, lport, thost, tport = sys.argv[1:5]
    TcpRelay(lhost, (thost, int(tport)), int(lport))
    print("relaying", flush=True)
    while True:
        time.sleep(3600)
