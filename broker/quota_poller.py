"""Keeps a broker's producer-ID quotas in step with the quorum's client quotas (polled), and the quota stats file
that ``pidctl quota status`` reads (``read_stats``)."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Any, Iterable, Protocol

from quorum.client.quorum import ConnectionFailed
from records.wire.errors import PidQuorumError

# The quotas' logger: log settings name it, whichever of their modules writes the line.
log = logging.getLogger("broker.quota")

STATS_FILE = "quota-stats.json"


class QuotaManager(Protocol):
    """What the poller uses of ``broker.quota.ProducerIdQuotaManager``."""

    unlimited_checks: int

    def configure(self, entries: Iterable[dict[str, Any]]) -> None: ...

    def sweep(self, now: float | None = None) -> int: ...

    def stats(self, now: float | None = None) -> dict[str, dict[str, Any]]: ...

    def config(self) -> dict[str, Any]: ...


class QuotaConfigPoller:
    """Keeps a broker's ProducerIdQuotaManager in step with the quorum's client quotas.

    Every ``interval_s`` it reads DescribeClientQuotas from a quorum node that follows
    a leader (no log entry), so a change reaches the broker within ``interval_s`` plus
    the node's replication lag.  When the quorum cannot be read the last configuration
    stays in force (and the stats say how old it is).  Each round also forgets idle
    principals and writes the stats to ``stats_path`` (for ``pidctl quota status``).
    """

    def __init__(self, manager: QuotaManager, quorum: Any, interval_s: float = 1.0,
                 stats_path: str | None = None):
        self.manager = manager
        self.quorum = quorum
        self.interval_s = interval_s
        self.stats_path = stats_path
        self.last_ok: float | None = None  # monotonic time of the last successful read
        self.last_ok_wall: float | None = None
        self.source = ""
        self.last_error: str | None = None
        self.polls = 0

    async def refresh(self) -> bool:
        try:
            entries, node = await self.quorum.describe_client_quotas()
        except (PidQuorumError, ConnectionFailed, OSError) as e:
            error = f"{type(e).__name__}: {e}"
            if error != self.last_error:
                log.warning("reading client quotas from the quorum failed (%s); the last ones stay in force", error)
            self.last_error = error
            return False
        self.manager.configure(entries)
        self.polls += 1
        if self.last_error is not None:
            log.info("client quotas read from %s again", node)
        self.last_ok, self.last_ok_wall, self.source, self.last_error = time.monotonic(), time.time(), node, None
        return True

    def freshness(self) -> dict[str, Any]:
        return {"read_from": self.source or None, "age_s": None if self.last_ok is None
                else round(time.monotonic() - self.last_ok, 3), "read_at": self.last_ok_wall,
                "interval_s": self.interval_s, "last_error": self.last_error}

    def snapshot(self) -> dict[str, Any]:
        return {"config": self.manager.config(), "freshness": self.freshness(),
                "unlimited_checks": self.manager.unlimited_checks, "principals": self.manager.stats()}

    def write_stats(self) -> None:
        if not self.stats_path:
            return
        tmp = f"{self.stats_path}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump({"written_at": time.time(), **self.snapshot()}, f, indent=1, sort_keys=True)
            os.replace(tmp, self.stats_path)
        except OSError as e:
            log.warning("cannot write %s: %s", self.stats_path, e)

    async def run(self) -> None:
        while True:
            await self.refresh()
            self.manager.sweep()
            self.write_stats()
            await asyncio.sleep(self.interval_s)


def read_stats(broker_dir: str) -> dict[str, Any]:
    """The stats a broker with data dir ``broker_dir`` last wrote (``pidctl quota status``)."""
    path = os.path.join(broker_dir, STATS_FILE)
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no quota stats (is a broker running with data dir {broker_dir}?)") from None
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: unreadable quota stats: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("principals"), dict):
        raise ValueError(f"{path}: not a quota stats file")
    data["file_age_s"] = round(time.time() - float(data.get("written_at", 0)), 3)
    return data
