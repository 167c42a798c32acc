"""quorum.migration.zk against a real ZooKeeper (see conftest.py): parsing, reading, Kafka's
ZooKeeper-mode allocation loop with unknown outcomes, rollback placeholders, bridge reservations."""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from kazoo.client import KazooClient

from quorum.localcluster import free_ports

from quorum.migration.zk import (
    LONG_MAX,
    ZK_BLOCK_PATH,
    LegacyAllocator,
    ZkBlock,
    ZkBlockError,
    ZkBlockMissing,
    ZkBlocksExhausted,
    ZkConflict,
    ZkUnavailable,
    connect,
    describe_placeholder,
    parse_block,
    read_block,
    reserve_block,
    write_placeholder,
)

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


# ------------------------------------------------------------------ parsing
def test_parse_reference_example():
    block = parse_block(REFERENCE, "export.json")
    assert block == ZkBlock(version=1, broker=35, block_start=4000, block_end=4999)
    assert block.next_start == 5000 and block.length == 1000
    assert block.to_json() == REFERENCE  # byte-for-byte what Kafka writes


@pytest.mark.parametrize("data, expected", [
    (b"", None),
    (None, None),
    (doc(broker=-1), ZkBlock(1, -1, 4000, 4999)),                       # placeholder written by a dual write
    (doc(block_start="0", block_end="0"), ZkBlock(1, 35, 0, 0)),
    (doc(block_end=str(LONG_MAX)), ZkBlock(1, 35, 4000, LONG_MAX)),
    (doc(extra="ignored"), ZkBlock(1, 35, 4000, 4999)),                 # unknown fields are ignored
    (b' {\n  "version": 1,\n  "broker": 35,\n  "block_start": "4000",\n  "block_end": "4999"\n}\n',
     ZkBlock(1, 35, 4000, 4999)),                                        # a pretty-printed export
])
def test_parse_accepts(data, expected):
    assert parse_block(data, "export.json") == expected


MALFORMED = [
    ("invalid-json", b'{"version":1,', "data"),
    ("whitespace-only", b"  \n", "data"),
    ("not-utf8", b'{"version":1,"broker":35,"block_start":"4000","block_end":"\xff"}', "data"),
    ("array", b"[1, 2]", "data"),
    ("string", b'"4000"', "data"),
    ("null", b"null", "data"),
    ("nan", doc(version=1).replace(b'"version": 1', b'"version": NaN'), "data"),
    ("missing-version", doc(version=DROP), "version"),
    ("missing-broker", doc(broker=DROP), "broker"),
    ("missing-block_start", doc(block_start=DROP), "block_start"),
    ("missing-block_end", doc(block_end=DROP), "block_end"),
    ("version-2", doc(version=2), "version"),
    ("version-0", doc(version=0), "version"),
    ("version-string", doc(version="1"), "version"),
    ("version-float", doc(version=1.0), "version"),
    ("version-bool", doc(version=True), "version"),
    ("broker-string", doc(broker="35"), "broker"),
    ("broker-float", doc(broker=35.5), "broker"),
    ("broker-null", doc(broker=None), "broker"),
    ("broker-below-minus-1", doc(broker=-2), "broker"),
    ("broker-beyond-int32", doc(broker=2**31), "broker"),
    ("start-number", doc(block_start=4000), "block_start"),
    ("start-float-string", doc(block_start="4000.0"), "block_start"),
    ("start-exponent", doc(block_start="4e3"), "block_start"),
    ("start-plus", doc(block_start="+4000"), "block_start"),
    ("start-leading-space", doc(block_start=" 4000"), "block_start"),
    ("start-trailing-newline", doc(block_start="4000\n"), "block_start"),
    ("start-leading-junk", doc(block_start="x4000"), "block_start"),
    ("start-trailing-junk", doc(block_start="4000abc"), "block_start"),
    ("start-hex", doc(block_start="0x4000"), "block_start"),
    ("start-underscore", doc(block_start="4_000"), "block_start"),
    ("start-fullwidth-digits", doc(block_start="\uff14\uff10\uff10\uff10"), "block_start"),
    ("start-empty", doc(block_start=""), "block_start"),
    ("start-leading-zeros", doc(block_start="04000"), "block_start"),
    ("start-negative", doc(block_start="-1"), "block_start"),
    ("start-negative-zero", doc(block_start="-0"), "block_start"),
    ("start-beyond-long", doc(block_start=str(LONG_MAX + 1), block_end=str(LONG_MAX + 2)), "block_start"),
    ("start-huge", doc(block_start="9" * 5000), "block_start"),
    ("end-number", doc(block_end=4999), "block_end"),
    ("end-null", doc(block_end=None), "block_end"),
    ("end-float-string", doc(block_end="4999.5"), "block_end"),
    ("end-negative", doc(block_end="-5"), "block_end"),
    ("end-beyond-long", doc(block_end=str(LONG_MAX + 1)), "block_end"),
    ("end-below-start", doc(block_end="3999"), "block_end"),
    ("duplicate-block_end", b'{"version":1,"broker":35,"block_start":"4000","block_end":"4999","block_end":"9"}',
     "block_end"),
]


@pytest.mark.parametrize("data, field", [(d, f) for _, d, f in MALFORMED], ids=[name for name, _, _ in MALFORMED])
def test_parse_refuses_naming_the_field(data, field):
    with pytest.raises(ZkBlockError) as info:
        parse_block(data, "export.json")
    e = info.value
    assert e.field == field
    assert e.origin == "export.json"
    assert str(e).startswith(f"export.json: field '{field}': ")


def test_parse_error_messages_say_what_is_wrong():
    def msg(data):
        with pytest.raises(ZkBlockError) as info:
            parse_block(data, "x")
        return info.value.problem
    assert "unknown version 2" in msg(doc(version=2))
    assert "negative" in msg(doc(block_start="-1"))
    assert "leading zeros" in msg(doc(block_start="04000"))
    assert "Long.MAX" in msg(doc(block_end=str(LONG_MAX + 1)))
    assert "below block_start" in msg(doc(block_end="3999"))
    assert "missing" in msg(doc(broker=DROP))


# ------------------------------------------------------------------ reading
def test_read_block_absent_empty_present(zk_client):
    with pytest.raises(ZkBlockMissing, match="does not exist"):
        read_block(zk_client)
    zk_client.create(ZK_BLOCK_PATH, b"")
    assert read_block(zk_client) == (None, 0)
    zk_client.set(ZK_BLOCK_PATH, REFERENCE)
    assert read_block(zk_client) == (ZkBlock(1, 35, 4000, 4999), 1)


def test_read_block_refuses_malformed_znode(zk_client):
    zk_client.create(ZK_BLOCK_PATH, doc(block_start="4000.0"))
    with pytest.raises(ZkBlockError) as info:
        read_block(zk_client)
    assert info.value.field == "block_start"
    assert ZK_BLOCK_PATH in info.value.origin


def test_connect_creates_chroot_only_when_asked(zk_chroot, zk_client):
    sub = f"{zk_chroot}/sub"
    zk = connect(sub, timeout=10)
    try:
        with pytest.raises(ZkBlockMissing):
            read_block(zk)
        assert zk_client.exists("/sub") is None
    finally:
        zk.stop(); zk.close()
    zk = connect(sub, timeout=10, ensure_chroot=True)
    try:
        assert zk_client.exists("/sub") is not None
        assert LegacyAllocator(zk, broker_id=1).allocate() == (0, 1000)
        assert zk_client.get("/sub" + ZK_BLOCK_PATH)[0] == kafka_json(1, 0, 999)
    finally:
        zk.stop(); zk.close()


def test_connect_unreachable_is_a_clear_error():
    port = free_ports(1)[0]  # nothing listens there
    began = time.monotonic()
    with pytest.raises(ZkUnavailable, match=f"127.0.0.1:{port}"):
        connect(f"127.0.0.1:{port}", timeout=1.0)
    assert time.monotonic() - began < 10


# ------------------------------------------------------------------ legacy allocation
def test_legacy_allocator_sequential_blocks_contiguous(zk_client):
    alloc = LegacyAllocator(zk_client, broker_id=7)
    blocks = [alloc.allocate() for _ in range(5)]
    assert blocks == [(0, 1000), (1000, 1000), (2000, 1000), (3000, 1000), (4000, 1000)]
    data, stat = zk_client.get(ZK_BLOCK_PATH)
    assert data == kafka_json(7, 4000, 4999) and stat.version == 4
    assert (alloc.writes, alloc.retries, alloc.unknown_outcomes, alloc.allocated) == (5, 0, 0, 5)


def test_legacy_allocator_continues_after_existing_and_empty(zk_client):
    zk_client.create(ZK_BLOCK_PATH, b"")  # Kafka creates the node without data at first
    assert LegacyAllocator(zk_client, broker_id=1).allocate() == (0, 1000)
    zk_client.set(ZK_BLOCK_PATH, REFERENCE)
    alloc = LegacyAllocator(zk_client, broker_id=2, block_size=10)
    assert alloc.allocate() == (5000, 10)
    assert zk_client.get(ZK_BLOCK_PATH)[0] == kafka_json(2, 5000, 5009)


def test_legacy_allocator_exhaustion(zk_client):
    set_block(zk_client, kafka_json(3, LONG_MAX - 1999, LONG_MAX - 1000))
    alloc = LegacyAllocator(zk_client, broker_id=1)
    assert alloc.allocate() == (LONG_MAX - 999, 1000)  # the last block ends exactly at Long.MAX
    version = zk_client.get(ZK_BLOCK_PATH)[1].version
    with pytest.raises(ZkBlocksExhausted, match="exhausted"):
        alloc.allocate()
    assert zk_client.get(ZK_BLOCK_PATH)[1].version == version  # nothing written


def test_legacy_allocator_refuses_malformed_znode_and_writes_nothing(zk_client):
    zk_client.create(ZK_BLOCK_PATH, doc(version=2))
    with pytest.raises(ZkBlockError) as info:
        LegacyAllocator(zk_client, broker_id=1).allocate()
    assert info.value.field == "version"
    assert zk_client.get(ZK_BLOCK_PATH)[1].version == 0


def test_legacy_allocator_missing_chroot_is_an_error_not_a_loop(zookeeper):
    zk = connect(f"{zookeeper.hosts}/no-such-chroot-{time.monotonic_ns()}", timeout=10)
    try:
        began = time.monotonic()
        with pytest.raises(ZkBlockMissing):
            LegacyAllocator(zk, broker_id=1, timeout=20).allocate()
        assert time.monotonic() - began < 5
    finally:
        zk.stop(); zk.close()


def test_four_concurrent_allocators_disjoint_and_contiguous(zk_chroot):
    clients = [connect(zk_chroot, timeout=10) for _ in range(4)]
    allocators = [LegacyAllocator(zk, broker_id=i + 1) for i, zk in enumerate(clients)]
    results: dict[int, list[tuple[int, int]]] = {}
    errors = []
    barrier = threading.Barrier(4)

    def run(a: LegacyAllocator):
        try:
            barrier.wait()
            results[a.broker_id] = [a.allocate() for _ in range(50)]
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(a,)) for a in allocators]
    try:
        run_threads(threads, errors)
        blocks = [b for bs in results.values() for b in bs]
        assert len(blocks) == 200 and all(len(bs) == 50 for bs in results.values())
        assert_contiguous(blocks)
        retries = sum(a.retries for a in allocators)
        assert sum(a.writes for a in allocators) == 200 + retries  # every lost race cost one write
        print(f"4x50 blocks, {retries} lost races retried")
        data, _ = clients[0].get(ZK_BLOCK_PATH)
        assert parse_block(data, "znode").block_end == 200 * 1000 - 1
    finally:
        for zk in clients:
            zk.stop(); zk.close()


# ------------------------------------------------------------------ unknown outcomes
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


@pytest.fixture
def lossy(zookeeper, zk_chroot):
    proxy = LossyProxy(zookeeper.port)
    chroot = zk_chroot[len(zookeeper.hosts):]
    zk = connect(proxy.hosts + chroot, timeout=10)
    yield proxy, zk
    zk.stop(); zk.close()
    proxy.close()


@pytest.mark.parametrize("forward", [True, False], ids=["write-applied-answer-lost", "write-lost"])
def test_unknown_outcome_is_reread_never_assumed(zk_client, lossy, forward):
    proxy, zk = lossy
    alloc = LegacyAllocator(zk, broker_id=5, timeout=30)
    assert alloc.allocate() == (0, 1000)
    proxy.arm(b"block_start", forward=forward)
    assert alloc.allocate() == (1000, 1000)  # exactly once, whatever happened to the write
    assert proxy.cut.is_set()
    assert alloc.unknown_outcomes == 1
    # Applied: re-read finds our bytes at our version + 1 and claims them (no second write).
    # Lost: re-read finds the znode unchanged and writes the same block again.
    assert alloc.writes == (2 if forward else 3)
    data, stat = zk_client.get(ZK_BLOCK_PATH)
    assert data == kafka_json(5, 1000, 1999) and stat.version == 1
    assert alloc.allocate() == (2000, 1000)  # the next one follows: no block lost or doubled


@pytest.mark.parametrize("forward", [True, False], ids=["write-applied-answer-lost", "write-lost"])
def test_unknown_outcome_with_another_writer_in_between(zk_client, lossy, forward):
    """While our client is cut off after an unknown-outcome write, another broker allocates.

    If our write was lost, the other broker gets the very range we tried to write: assuming
    success would issue it twice. If it was applied, the other broker builds on it and our
    block is skipped (wasted, never issued). Either way: no overlap.
    """
    proxy, zk = lossy
    ours = LegacyAllocator(zk, broker_id=5, timeout=30)
    other = LegacyAllocator(zk_client, broker_id=6)
    got = [ours.allocate()]
    proxy.arm(b"block_start", forward=forward, hold=True)
    result: list = []
    t = threading.Thread(target=lambda: result.append(ours.allocate()))
    t.start()
    try:
        assert proxy.cut.wait(10)
        theirs = other.allocate()
    finally:
        proxy.release()
    t.join(30)
    assert not t.is_alive() and len(result) == 1
    got.append(result[0])
    assert ours.unknown_outcomes == 1
    if forward:
        assert theirs == (2000, 1000)  # ours landed at 1000 first
        assert got == [(0, 1000), (3000, 1000)]  # [1000, 1999] was written but never returned: wasted
    else:
        assert theirs == (1000, 1000)  # the range our lost write named
        assert got == [(0, 1000), (2000, 1000)]
    everything = got + [theirs]
    for i, (s1, l1) in enumerate(everything):
        for s2, l2 in everything[i + 1:]:
            assert s1 + l1 <= s2 or s2 + l2 <= s1, f"overlap: {everything}"


def test_allocation_across_zookeeper_crashes(zookeeper, zk_chroot):
    """The ZooKeeper server is SIGKILLed right after the allocator sends a write (twice), then
    restarted on the same port and data: the write may have been applied or not, answered or
    not. Every block is returned once and the sequence stays contiguous."""
    zk = connect(zk_chroot, timeout=10)
    alloc = LegacyAllocator(zk, broker_id=9, timeout=60, op_timeout=3)
    writing = threading.Event()
    real_set_async = zk.set_async

    def set_async(*args, **kwargs):
        result = real_set_async(*args, **kwargs)
        writing.set()  # the request is on its way: the main thread kills the server now
        return result

    zk.set_async = set_async
    blocks: list[tuple[int, int]] = []
    errors = []
    stop = threading.Event()

    def run():
        try:
            while not stop.is_set():
                blocks.append(alloc.allocate())
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def progress(n: int, within: float = 30.0) -> bool:
        target, deadline = len(blocks) + n, time.monotonic() + within
        while len(blocks) < target and time.monotonic() < deadline and not errors:
            time.sleep(0.02)
        return len(blocks) >= target

    t = threading.Thread(target=run)
    t.start()
    try:
        assert progress(5)
        for _ in range(2):
            writing.clear()
            assert writing.wait(10)
            zookeeper.stop(kill=True)
            time.sleep(0.5)
            zookeeper.start()
            assert progress(10), "no progress after the restart"
    finally:
        zookeeper.ensure_running()
        stop.set()
        t.join(60)
    try:
        assert not errors, errors
        assert_contiguous(blocks)
        # A single writer: every applied write was returned, none skipped.
        block, _ = read_block(zk)
        assert block.block_end == max(s + n for s, n in blocks) - 1
        print(f"{len(blocks)} blocks across 2 crashes; writes {alloc.writes}, "
              f"unknown outcomes {alloc.unknown_outcomes}, retries {alloc.retries}")
    finally:
        zk.stop(); zk.close()


# ------------------------------------------------------------------ rollback placeholder
def test_write_placeholder_creates_and_moves_forward_only(zk_client):
    r = write_placeholder(zk_client, 7000, 1000)
    assert r.written and r.version == 0
    assert zk_client.get(ZK_BLOCK_PATH)[0] == kafka_json(-1, 7000, 7999)
    assert "wrote placeholder block [7000, 7999]" in describe_placeholder(r, 7000, 1000)

    # Legacy allocation resumes above it.
    assert LegacyAllocator(zk_client, broker_id=3).allocate() == (8000, 1000)

    # Below or equal to what is there: left alone, and said so.
    for start, length in [(3000, 1000), (7500, 500), (8000, 1000)]:
        r = write_placeholder(zk_client, start, length)
        assert not r.written and r.block == ZkBlock(1, 3, 8000, 8999) and r.version == 1
        assert "left /latest_producer_id_block as it is" in describe_placeholder(r, start, length)
    assert zk_client.get(ZK_BLOCK_PATH)[1].version == 1

    # Above: written (the end moves forward even if the start overlaps).
    r = write_placeholder(zk_client, 8500, 1000)
    assert r.written and zk_client.get(ZK_BLOCK_PATH)[0] == kafka_json(-1, 8500, 9499)


def test_write_placeholder_over_empty_node_and_bad_input(zk_client):
    zk_client.create(ZK_BLOCK_PATH, b"")
    assert write_placeholder(zk_client, 0, 1000).written
    assert zk_client.get(ZK_BLOCK_PATH)[0] == kafka_json(-1, 0, 999)
    with pytest.raises(ValueError):
        write_placeholder(zk_client, -1, 1000)
    with pytest.raises(ValueError):
        write_placeholder(zk_client, 10, 0)
    with pytest.raises(ZkBlocksExhausted):
        write_placeholder(zk_client, LONG_MAX, 2)


def test_write_placeholder_unknown_outcome(zk_client, lossy):
    proxy, zk = lossy
    set_block(zk_client, REFERENCE)
    proxy.arm(b"block_start", forward=True)
    r = write_placeholder(zk, 6000, 1000)
    assert proxy.cut.is_set()
    assert r.written and r.version == 1  # claimed by re-reading, not reported as "left alone"
    assert zk_client.get(ZK_BLOCK_PATH)[0] == kafka_json(-1, 6000, 6999)


# ------------------------------------------------------------------ bridge-mode reservation
def test_reserve_block_semantics(zk_client):
    # Absent znode: the range starts at min_start.
    assert reserve_block(zk_client, 0, 1000, broker_id=101) == (0, 0)
    assert zk_client.get(ZK_BLOCK_PATH)[0] == kafka_json(101, 0, 999)
    # Above the znode's block: max(min_start, block_end + 1).
    assert reserve_block(zk_client, 500, 1000, broker_id=101) == (1000, 1)
    assert reserve_block(zk_client, 10_000, 1000, broker_id=102) == (10_000, 2)
    assert zk_client.get(ZK_BLOCK_PATH)[0] == kafka_json(102, 10_000, 10_999)
    # A legacy broker continues above the reservation.
    assert LegacyAllocator(zk_client, broker_id=1).allocate() == (11_000, 1000)
    assert reserve_block(zk_client, 0, 1000, broker_id=101) == (12_000, 4)


def test_reserve_block_expected_version(zk_client):
    set_block(zk_client, REFERENCE)
    with pytest.raises(ZkConflict) as info:
        reserve_block(zk_client, 0, 1000, expected_version=3, broker_id=101)
    assert (info.value.expected_version, info.value.actual_version) == (3, 0)
    assert zk_client.get(ZK_BLOCK_PATH)[1].version == 0  # nothing written
    assert reserve_block(zk_client, 0, 1000, expected_version=0, broker_id=101) == (5000, 1)
    with pytest.raises(ZkConflict):
        reserve_block(zk_client, 0, 1000, expected_version=0, broker_id=101)
    # -1: only if the znode is absent.
    zk_client.delete(ZK_BLOCK_PATH)
    assert reserve_block(zk_client, 42, 10, expected_version=-1, broker_id=101) == (42, 0)
    with pytest.raises(ZkConflict):
        reserve_block(zk_client, 42, 10, expected_version=-1, broker_id=101)


def test_reserve_block_bad_input_and_exhaustion(zk_client):
    with pytest.raises(ValueError):
        reserve_block(zk_client, -5, 1000, broker_id=1)
    with pytest.raises(ValueError):
        reserve_block(zk_client, 0, 0, broker_id=1)
    with pytest.raises(ValueError):
        reserve_block(zk_client, 0, 1000, broker_id=-2)
    set_block(zk_client, kafka_json(1, 0, LONG_MAX - 500))
    with pytest.raises(ZkBlocksExhausted):
        reserve_block(zk_client, 0, 1000, broker_id=1)
    assert zk_client.get(ZK_BLOCK_PATH)[1].version == 0


def test_reserve_block_races_legacy_allocators(zk_chroot):
    """Reservations interleaved with two legacy allocators: one disjoint, contiguous sequence."""
    clients = [connect(zk_chroot, timeout=10) for _ in range(3)]
    legacy = [LegacyAllocator(clients[i], broker_id=i + 1) for i in range(2)]
    got: list[tuple[int, int]] = []
    lock = threading.Lock()
    errors = []

    def legacy_run(a):
        try:
            for _ in range(30):
                b = a.allocate()
                with lock:
                    got.append(b)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def bridge_run():
        try:
            for _ in range(30):
                start, _ = reserve_block(clients[2], 0, 1000, broker_id=100)
                with lock:
                    got.append((start, 1000))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=legacy_run, args=(a,)) for a in legacy] + [threading.Thread(target=bridge_run)]
    try:
        run_threads(threads, errors)
        assert len(got) == 90
        assert_contiguous(got)
    finally:
        for zk in clients:
            zk.stop(); zk.close()
