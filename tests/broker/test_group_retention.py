"""Offsets retention (Kafka's offsets.retention.minutes) of the broker's group coordinator, with no processes:
a real groups file in a temp directory, the coordinator's clocks given by the test."""
from __future__ import annotations

import asyncio
import time

from broker.groups.coordinator import GroupCoordinator, OffsetIn
from broker.groups.membership import GroupSettings
from broker.groups.store import GroupStore

MINUTE_MS = 60_000


async def _verify(*args) -> None:
    return None


def coordinator(path, clock: list[float], retention_ms: int = 10 * MINUTE_MS) -> GroupCoordinator:
    settings = GroupSettings(initial_rebalance_delay_ms=0, offsets_retention_ms=retention_ms)
    c = GroupCoordinator(GroupStore(str(path)), settings, lambda t, p: True, _verify, clock=lambda: clock[0])
    c.load()
    c.start()
    return c


def test_an_empty_groups_offsets_expire_after_the_retention_and_the_group_goes(tmp_path):
    async def main() -> None:
        clock = [1000.0]
        c = coordinator(tmp_path, clock)
        now_ms = int(time.time() * 1000)  # the commits are stamped with the wall clock
        await c.commit("standalone", -1, "", None, [OffsetIn("t", 0, 5, -1, None), OffsetIn("t", 1, 6, -1, "m")])
        assert c.expire_offsets(now_ms) == 0  # just committed
        # Nine minutes on (wall and monotonic): nothing yet.
        clock[0] += 9 * 60
        assert c.expire_offsets(now_ms + 9 * MINUTE_MS) == 0
        # Past ten minutes since the commit and since the group became empty: the offsets and the group go.
        clock[0] += 2 * 60
        assert c.expire_offsets(now_ms + 11 * MINUTE_MS) == 1  # one entry: the group deleted
        await c.store.write([])  # the queued entries are written in order
        assert "standalone" not in c.store.state.offsets and "standalone" not in c.groups
        await c.close()
        again = coordinator(tmp_path, clock)  # the expiry is durable
        assert again.store.state.offsets == {} and again.fetch("standalone", [("t", 0)], False)[0][2] is None
        await again.close()
    asyncio.run(main())


def test_a_recent_commit_keeps_its_offset_and_the_group(tmp_path):
    async def main() -> None:
        clock = [1000.0]
        c = coordinator(tmp_path, clock)
        await c.commit("g", -1, "", None, [OffsetIn("t", 0, 5, -1, None)])
        clock[0] += 8 * 60
        await c.commit("g", -1, "", None, [OffsetIn("t", 1, 9, -1, None)])  # 8 minutes later
        clock[0] += 3 * 60
        base_ms = 5_000_000
        # Eleven minutes after the first commit, three after the second (the store stamps wall time: give it ours).
        for (t, p), committed in list(c.store.state.offsets["g"].items()):
            c.store.state.offsets["g"][(t, p)] = type(committed)(committed.offset, committed.leader_epoch,
                                                                 committed.metadata,
                                                                 base_ms if p == 0 else base_ms + 8 * MINUTE_MS)
        assert c.expire_offsets(base_ms + 11 * MINUTE_MS) == 1  # partition 0 only
        await c.store.write([])
        assert list(c.store.state.offsets["g"]) == [("t", 1)] and "g" in c.groups
        await c.close()
    asyncio.run(main())


def test_a_commit_on_its_way_is_never_expired(tmp_path):
    """An OffsetCommit queued (not yet durable) when the expiry runs: the group is left alone, so the expiry
    cannot be written after the commit and undo it."""
    async def main() -> None:
        clock = [1000.0]
        c = coordinator(tmp_path, clock, retention_ms=1)
        await c.commit("g", -1, "", None, [OffsetIn("t", 0, 5, -1, None)])
        clock[0] += 10
        pending = asyncio.ensure_future(c.commit("g", -1, "", None, [OffsetIn("t", 0, 6, -1, None)]))
        await asyncio.sleep(0)  # the commit is queued, not yet written
        assert c.expire_offsets(10**13) == 0
        await pending
        assert c.store.state.offsets["g"][("t", 0)].offset == 6
        await c.close()
    asyncio.run(main())
