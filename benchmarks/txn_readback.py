"""Reading a topic of the transactions benchmark back (kafka-python, read_committed or not) and judging
it: every committed transaction seen whole and once, no aborted or abandoned one seen, nothing lost,
duplicated, partial or foreign."""
from __future__ import annotations

import re
import time
from collections import Counter

from kafka import KafkaConsumer
from kafka import TopicPartition as KTopicPartition

from .txn_producers import MESSAGES, PARTITIONS

SETTLE_TIMEOUT_S = 90.0       # until the last stable offsets reach the high watermarks (> transaction.timeout.ms)
READ_TIMEOUT_S = 60.0
VALUE_RE = re.compile(rb"^(\d+):(\d+)$")
EXPECT_ABSENT = ("aborted", "abandoned")
VIOLATIONS = ("lost", "duplicated", "aborted_visible", "partial", "foreign")  # each must be 0


def _consumer(bootstrap: str, committed: bool) -> KafkaConsumer:
    return KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                         auto_offset_reset="earliest",
                         isolation_level="read_committed" if committed else "read_uncommitted")


def end_offsets(bootstrap: str, topic: str, committed: bool, partitions: int = PARTITIONS) -> dict[int, int]:
    """ListOffsets latest: the high watermarks, or the last stable offsets for read_committed."""
    c = _consumer(bootstrap, committed)
    try:
        ends = c.end_offsets([KTopicPartition(topic, i) for i in range(partitions)])
        return {tp.partition: off for tp, off in ends.items()}
    finally:
        c.close()


def settle(bootstrap: str, topic: str, timeout: float, partitions: int = PARTITIONS) -> dict:
    """Wait until every partition's last stable offset equals its high watermark (no transaction left open)."""
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout
    while True:
        hw, lso = end_offsets(bootstrap, topic, False, partitions), end_offsets(bootstrap, topic, True, partitions)
        if hw == lso or time.monotonic() > deadline:
            return {"settled": hw == lso, "seconds": time.perf_counter() - t0, "high_watermarks": hw,
                    "last_stable_offsets": lso}
        time.sleep(0.2)


def read_back(bootstrap: str, topic: str, committed: bool, timeout: float = READ_TIMEOUT_S,
              partitions: int = PARTITIONS) -> dict:
    """Every data record a consumer of that isolation level sees, up to the end offsets taken at the start
    (the last stable offsets for read_committed): ``records`` [(partition, offset, value bytes)]."""
    c = _consumer(bootstrap, committed)
    tps = [KTopicPartition(topic, i) for i in range(partitions)]
    records: list[tuple[int, int, bytes]] = []
    try:
        c.assign(tps)
        c.seek_to_beginning()
        ends = c.end_offsets(tps)
        deadline = time.monotonic() + timeout
        while any(c.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                break
            for batch in c.poll(timeout_ms=500).values():
                records.extend((m.partition, m.offset, m.value) for m in batch)
        positions = {tp.partition: c.position(tp) for tp in tps}
    finally:
        c.close()
    ends_by = {tp.partition: off for tp, off in ends.items()}
    return {"records": records, "end_offsets": ends_by, "positions": positions,
            "complete": all(positions[p] >= e for p, e in ends_by.items())}


def exactly_once(records: list[tuple[int, int, bytes]], outcomes: dict[int, str], messages: int = MESSAGES) -> dict:
    """What a read_committed consumer saw against what the producer was told (transaction -> outcome),
    each transaction ``messages`` messages long.

    ``lost``: committed transactions not seen whole; ``duplicated``: (transaction, index) pairs seen more
    than once; ``aborted_visible``: aborted or abandoned transactions with any message seen; ``partial``:
    transactions of unknown outcome seen in part; ``foreign``: records that are no message of ours."""
    seen: dict[int, Counter] = {}
    where: dict[int, list] = {}
    foreign = []
    for part, off, v in records:
        m = VALUE_RE.match(v or b"")
        if not m:
            foreign.append((part, off, (v or b"")[:40].decode(errors="replace")))
            continue
        txn, i = int(m.group(1)), int(m.group(2))
        seen.setdefault(txn, Counter())[i] += 1
        where.setdefault(txn, []).append((part, off, i))
    lost, aborted_visible, partial, dups = [], [], [], []
    unknown_committed, unknown_absent = [], []
    for txn, outcome in sorted(outcomes.items()):
        got = seen.get(txn, Counter())
        whole = all(got[i] >= 1 for i in range(messages))
        if outcome == "committed" and not whole:
            lost.append(txn)
        elif outcome in EXPECT_ABSENT and got:
            aborted_visible.append(txn)
        elif outcome == "unknown":
            if whole:
                unknown_committed.append(txn)
            elif got:
                partial.append(txn)
            else:
                unknown_absent.append(txn)
    for txn, got in seen.items():
        for i, k in got.items():
            if k > 1:
                dups.append((txn, i, k))
        if txn not in outcomes:
            foreign.append(("txn", txn, "transaction number never sent"))
    return {"records": len(records), "transactions_seen": len(seen),
            "committed": sum(1 for o in outcomes.values() if o == "committed"),
            "lost": len(lost), "duplicated": sum(k - 1 for _, _, k in dups), "aborted_visible": len(aborted_visible),
            "partial": len(partial), "foreign": len(foreign),
            "unknown_seen_committed": len(unknown_committed), "unknown_absent": len(unknown_absent),
            "examples": {"lost": [{"txn": t, "seen": sorted(where.get(t, []))} for t in lost[:20]],
                         "duplicated": [{"txn": t, "index": i, "times": k, "seen": sorted(where[t])}
                                        for t, i, k in dups[:20]],
                         "aborted_visible": [{"txn": t, "outcome": outcomes[t], "seen": sorted(where[t])}
                                             for t in aborted_visible[:20]],
                         "partial": [{"txn": t, "seen": sorted(where[t])} for t in partial[:20]],
                         "foreign": foreign[:20]}}


def check_topic(bootstrap: str, topic: str, outcomes: dict[int, str], partitions: int = PARTITIONS,
                messages: int = MESSAGES) -> dict:
    """Settle, then read back read_committed (and read_uncommitted, for the aborted data kept in the log)
    the ``partitions`` partitions of ``topic``, whose units are ``messages`` messages long."""
    s = settle(bootstrap, topic, SETTLE_TIMEOUT_S, partitions)
    t = time.perf_counter()
    committed = read_back(bootstrap, topic, True, partitions=partitions)
    out = exactly_once(committed["records"], outcomes, messages)
    out["read_s"] = time.perf_counter() - t
    out["read_complete"] = committed["complete"]
    out["settle"] = s
    uncommitted = read_back(bootstrap, topic, False, partitions=partitions)
    out["read_uncommitted_records"] = len(uncommitted["records"])
    out["read_uncommitted_complete"] = uncommitted["complete"]
    return out
