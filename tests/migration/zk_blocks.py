"""What the quorum.migration.zk tests write and check: /latest_producer_id_block documents as Kafka writes
them, contiguity of issued blocks, and LossyProxy, which loses one ZooKeeper request or its answer."""
from __future__ import annotations

import json
import socket
import threading

from kazoo.client import KazooClient

from quorum.migration.zk import ZK_BLOCK_PATH

REFERENCE = b'{"version":1,"broker":35,"block_start":"4000","block_end":"4999"}'


def doc(**fields) -> bytes:
    base = {"version": 1, "broker": 35, "block_start": "4000", "block_end": "4999"}
    for k, v in fields.items():
        if v is DROP:
            base.pop(k)
        else:
            base[k] = v
    return json.dumps(base).encode()


DROP = object()


def kafka_json(broker: int, start: int, end: int) -> bytes:
    return b'{"version":1,"broker":%d,"block_start":"%d","block_end":"%d"}' % (broker, start, end)


def set_block(zk: KazooClient, data: bytes) -> int:
    """Create or overwrite the znode; returns its version."""
    if zk.exists(ZK_BLOCK_PATH):
        return zk.set(ZK_BLOCK_PATH, data).version
    zk.create(ZK_BLOCK_PATH, data)
    return 0


def assert_contiguous(blocks: list[tuple[int, int]], start: int = 0) -> None:
    """Disjoint, and together exactly [start, start + total)."""
    expected = start
    for s, length in sorted(blocks):
        assert s == expected, f"block at {s}, expected {expected}: gap or overlap in {sorted(blocks)[:10]}..."
        expected = s + length


def run_threads(threads: list[threading.Thread], errors: list) -> None:
    """Start ``threads``, wait up to 120 s for each, and fail with what they put in ``errors``."""
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


class LossyProxy:
    """A 127.0.0.1 TCP proxy in front of ZooKeeper that can lose one request or its answer.

    ``arm(marker, forward=...)``: the next client chunk containing ``marker`` is either
    forwarded and its answer dropped (the write IS applied, the client never learns it), or
    not forwarded at all (the write is NOT applied); either way the connection is then cut,
    so the client sees ConnectionLoss: an unknown outcome. With ``hold=True`` the proxy then
    refuses connections until ``release()``.
    """

    def __init__(self, upstream_port: int):
        self.upstream = ("127.0.0.1", upstream_port)
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))  # a free port, chosen by the kernel
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.hosts = f"127.0.0.1:{self.port}"
        self._armed = None
        self.cut = threading.Event()
        self._refusing = threading.Event()
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, marker: bytes, *, forward: bool, hold: bool = False):
        self.cut.clear()
        self._armed = (marker, forward, hold)

    def release(self):
        self._refusing.clear()

    def close(self):
        self.listener.close()
        for s in self._socks:
            self._close(s)

    @staticmethod
    def _close(s: socket.socket):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self._refusing.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            self._socks += [client, upstream]
            state = {"drop": threading.Event(), "dropped": threading.Event()}
            threading.Thread(target=self._up, args=(client, upstream, state), daemon=True).start()
            threading.Thread(target=self._down, args=(client, upstream, state), daemon=True).start()

    def _up(self, client, upstream, state):
        did_cut = False
        try:
            while data := client.recv(65536):
                armed = self._armed
                if armed is not None and armed[0] in data:
                    self._armed = None
                    did_cut = True
                    _, forward, hold = armed
                    if hold:
                        self._refusing.set()
                    if forward:
                        state["drop"].set()
                        upstream.sendall(data)
                        state["dropped"].wait(5)  # ZooKeeper answered: the write was applied
                    break
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            self._close(client)
            self._close(upstream)
            if did_cut:
                self.cut.set()

    def _down(self, client, upstream, state):
        try:
            while data := upstream.recv(65536):
                if state["drop"].is_set():
                    state["dropped"].set()  # the answer is lost: the client never sees it
                    continue
                client.sendall(data)
        except OSError:
            pass
        finally:
            self._close(client)
            self._close(upstream)
