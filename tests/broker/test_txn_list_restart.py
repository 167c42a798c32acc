"""ListTransactions after a broker restart (real quorum and broker processes): the broker lists every
transactional id the quorum knows, page after page (TransactionRequest list), so an id idle since before the
restart is listed at once, by ``pidctl txn list`` and by another tool, kafka-python's KafkaAdminClient."""
from __future__ import annotations

import asyncio
import json

from click.testing import CliRunner
from kafka.admin import KafkaAdminClient

from broker import txn_coordinator
from cli.common import EXIT_OK
from cli.main import cli
from quorum.client.quorum import QuorumClient
from tests.conftest import wait_for

from .test_txn_admin import admin_call, send, txn_producer


def pidctl_list(bootstrap: str) -> list[tuple[str, str]]:
    r = CliRunner().invoke(cli, ["--timeout", "15", "txn", "list", "--broker", bootstrap, "-o", "json"])
    assert r.exit_code == EXIT_OK, (r.exit_code, r.output)
    return [(t["transactional_id"], t["state"]) for t in json.loads(r.stdout)]


def kafka_python_list(bootstrap: str) -> list[tuple[str, str]]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        return sorted((t.transactional_id, t.state.value) for t in admin.list_transactions()[1])
    finally:
        admin.close()


def test_a_restarted_broker_lists_ids_idle_since_before_it(brokers):
    b = brokers(1, "--partitions", "2")
    done = txn_producer(b.bootstrap, "idle-done-tx")
    done.begin_transaction()
    send(done, "idle", 0)
    done.commit_transaction(30)
    txn_producer(b.bootstrap, "idle-fresh-tx")  # initialized, never began a transaction
    expected = [("idle-done-tx", "CompleteCommit"), ("idle-fresh-tx", "Empty")]
    wait_for(lambda: pidctl_list(b.bootstrap) == expected, 10, what="the commit to complete")  # after the answer

    b.stop()
    b.start()
    # Nothing since the restart has named either id on this broker: listed from the quorum's state.
    rows = wait_for(lambda: admin_call(b.bootstrap, "list_transactions")[0] or None, 30,
                    what="the restarted broker to answer ListTransactions")
    assert [(r["transactional_id"], r["state"]) for r in rows] == expected
    assert pidctl_list(b.bootstrap) == expected
    assert kafka_python_list(b.bootstrap) == expected
    (desc,) = admin_call(b.bootstrap, "describe_transactions", ["idle-fresh-tx"])
    assert (desc["state"], desc["producer_id"]) == ("Empty", rows[1]["producer_id"])


def test_more_ids_than_a_page_are_all_listed(brokers, monkeypatch):
    """A listing longer than a page: the coordinator (in this process, page size 2) against the test's real
    quorum reads every page, each after the last id of the one before, and the same ids as the broker."""
    b = brokers(1)
    names = [f"page-tx-{i}" for i in range(5)]
    for tid in names:
        txn_producer(b.bootstrap, tid)
    assert [t for t, _ in pidctl_list(b.bootstrap)] == names

    asked: list[str] = []

    async def listed() -> list[str]:
        quorum = QuorumClient(b.quorum)
        page = quorum.list_transactions

        async def counted(broker_id, after="", limit=1000):
            asked.append(after)
            return await page(broker_id, after, limit)
        quorum.list_transactions = counted
        try:
            coordinator = txn_coordinator.TxnCoordinator(1, quorum, None, None, lambda: None, None)
            return [t["transactional_id"] for t in await coordinator.list_transactions()]
        finally:
            await quorum.close()
    monkeypatch.setattr(txn_coordinator, "LIST_PAGE", 2)
    assert asyncio.run(listed()) == names
    assert asked == ["", "page-tx-1", "page-tx-3", "page-tx-4"]
