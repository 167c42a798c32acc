"""Shared fixtures: a real three-node quorum on free loopback ports in tmp_path.

Safe under pytest-xdist (every cluster picks its own ports and directory).
When a test fails, the nodes' logs are printed.
"""
from __future__ import annotations

import asyncio
import time

import pytest

from quorum.client.quorum import QuorumClient, RetryPolicy
from quorum.localcluster import LocalCluster
from records.wire.errors import NotControllerError

# hypothesis' storage goes to a temp dir, never into the repo or a test's working directory: kio imports
# hypothesis when it is installed, so every pidctl or node process a test starts would otherwise create
# ./.hypothesis wherever it runs (the variable is inherited by those processes).
import os as _os  # noqa: E402
import tempfile as _tempfile  # noqa: E402

_os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = _os.path.join(_tempfile.gettempdir(), "pidquorum-hypothesis")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.02, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def run(coro):
    return asyncio.run(coro)


class ClusterHarness:
    def __init__(self, lc: LocalCluster):
        self.lc = lc

    def client(self, timeout: float = 10.0) -> QuorumClient:
        return QuorumClient(self.lc.client_addresses(), RetryPolicy(timeout=timeout, attempt_timeout=2.0))

    def describe_all(self) -> dict[int, dict]:
        async def go():
            c = self.client()
            out = {}
            for n in self.lc.nodes():
                if not self.lc.alive(n.node_id):
                    continue
                try:
                    out[n.node_id] = await c.describe(n.client_address)
                except Exception:  # noqa: BLE001 - a node may be starting or stopping
                    pass
            await c.close()
            return out
        return run(go())

    def leader(self, timeout: float = 10.0) -> int:
        """The node id of the leader (``QuorumClient.find_leader``), waiting up to ``timeout``."""
        return self.leader_state(timeout)[0]

    def leader_state(self, timeout: float = 10.0) -> tuple[int, dict]:
        """(node id, DescribeState) of the leader, waiting up to ``timeout``."""
        node_of = {n.client_address: n.node_id for n in self.lc.nodes()}

        async def go():
            c = self.client()
            try:
                return await c.find_leader(timeout, addresses=list(node_of))
            finally:
                await c.close()
        try:
            address, d = run(go())
        except NotControllerError as e:
            raise AssertionError(f"timed out after {timeout}s waiting for a leader ({e.message})") from None
        return node_of[address], d


def cluster_harness(tmp_path, request, commands: dict[int, list[str]] | None = None, **node_options):
    """A three-node LocalCluster with ``node_options`` as a ClusterHarness (a generator for fixtures);
    prints the nodes' logs when the test failed, and stops the nodes.  ``commands``: node id -> what runs
    that node instead of the cluster's node command (another version of the node)."""
    lc = LocalCluster(str(tmp_path / "cluster"))
    lc.up(3, commands=commands, **node_options)
    yield ClusterHarness(lc)
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        for n in lc.nodes():
            print(f"----- node {n.node_id} log -----\n{lc.tail_log(n.node_id, 60)}")
    lc.down(timeout=5)


@pytest.fixture
def cluster(tmp_path, request):
    yield from cluster_harness(tmp_path, request)


SUMMARY_PROPERTIES = ("fresh_simulation_seeds", "seeds_to_find", "explorer_found", "crash_states")


def pytest_terminal_summary(terminalreporter):
    """Print what the simulation tests recorded (fresh seeds, so a failure can be replayed; figures)."""
    lines = []
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) != "call":
                continue
            for name, value in getattr(report, "user_properties", ()):
                if name in SUMMARY_PROPERTIES:
                    lines.append(f"{report.nodeid.split('::')[-1]}: {name} = {value}")
    if lines:
        terminalreporter.section("simulation")
        for line in sorted(lines):
            terminalreporter.write_line(line)
