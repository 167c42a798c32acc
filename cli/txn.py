"""``pidctl txn ...``: an operator's transaction tools, as Kafka's kafka-transactions.sh (KIP-664).

Each command asks one broker (``--broker HOST:PORT``, reached with pidctl's global security options) through
``quorum.client.broker_admin``.  Exit codes: 0 done, 2 usage, 3 the broker (or its quorum) unreachable, 4 the broker
refused (the line says why: not authorized, unknown id, nothing to abort, the transaction moved on).
"""
from __future__ import annotations

import asyncio
import functools
import sys
import time

import click

from quorum.client.broker_admin import (
    BrokerAdmin,
    BrokerRefused,
    BrokerUnavailable,
    abort_transaction,
    find_hanging,
)
from records.wire.errors import Errors

from . import render
from .common import EXIT_REFUSED, EXIT_UNAVAILABLE, Ctx, pidctl_command

STATES = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort", "Dead",
          "PrepareEpochFence")
_UNAVAILABLE_CODES = {int(Errors.COORDINATOR_NOT_AVAILABLE), int(Errors.COORDINATOR_LOAD_IN_PROGRESS),
                      int(Errors.NOT_COORDINATOR), int(Errors.REQUEST_TIMED_OUT)}

broker_option = click.option("--broker", "broker", required=True, metavar="HOST:PORT",
                             envvar="PIDQUORUM_BROKER", help="The broker to ask (env PIDQUORUM_BROKER).")


@click.group()
def txn():
    """Transactions on a broker: list, describe, find hanging ones, abort one (kafka-transactions.sh)."""


def _ask(obj: Ctx, broker: str, fn):
    """Run ``fn(admin)`` against the broker; its refusals and unreachability as one line and an exit code."""
    try:
        admin = BrokerAdmin(broker, obj.timeout, security=obj.security)
    except ValueError as e:
        raise click.UsageError(str(e)) from None

    async def go():
        try:
            return await fn(admin)
        finally:
            await admin.close()
    try:
        return asyncio.run(go())
    except BrokerUnavailable as e:
        render.error(e.message)
        sys.exit(EXIT_UNAVAILABLE)
    except BrokerRefused as e:
        render.error(e.message)
        sys.exit(EXIT_UNAVAILABLE if e.code in _UNAVAILABLE_CODES else EXIT_REFUSED)


def _command(name: str):
    """A ``txn`` subcommand with --broker and -o, the context, one-line errors."""
    def wrap(fn):
        @txn.command(name)
        @broker_option
        @pidctl_command
        @functools.wraps(fn)
        def command(*args, **kwargs):
            return fn(*args, **kwargs)
        return command
    return wrap


def _time(ms: int) -> str:
    return "-" if ms < 0 else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _partitions(d: dict) -> str:
    return ", ".join(f"{p['topic']}-{p['partition']}" for p in d["partitions"]) or "-"


@_command("list")
@click.option("--state", "states", multiple=True, type=click.Choice(STATES),
              help="Only transactions in this state (repeatable).")
@click.option("--producer-id", "producer_ids", multiple=True, type=click.IntRange(0),
              help="Only the transaction of this producer id (repeatable).")
def txn_list(obj: Ctx, broker, output, states, producer_ids):
    """The transactions the broker coordinates (ListTransactions): id, producer id, state."""

    rows, _ = _ask(obj, broker, lambda a: a.list_transactions(list(states), list(producer_ids)))
    render.listing(output, rows, None, ["transactional id", "producer id", "state"],
                   [(r["transactional_id"], r["producer_id"], r["state"]) for r in rows])


@_command("describe")
@click.option("--transactional-id", required=True, help="The transactional id.")
def txn_describe(obj: Ctx, broker, output, transactional_id):
    """One transactional id's transaction (DescribeTransactions): state, producer, start, timeout, partitions."""

    (d,) = _ask(obj, broker, lambda a: a.describe_transactions([transactional_id]))
    if d["code"]:
        render.error(f"transactional id {transactional_id!r}: {d['error']}")
        sys.exit(EXIT_UNAVAILABLE if d["code"] in _UNAVAILABLE_CODES else EXIT_REFUSED)
    d = {k: v for k, v in d.items() if k not in ("code", "error")}
    render.listing(output, d, None,
                   ["transactional id", "state", "producer id", "epoch", "started", "timeout ms", "partitions"],
                   [(d["transactional_id"], d["state"], d["producer_id"], d["producer_epoch"],
                     _time(d["start_time_ms"]), d["timeout_ms"], _partitions(d))])


@_command("describe-producers")
@click.option("--topic", required=True)
@click.option("--partition", required=True, type=click.IntRange(0))
def txn_describe_producers(obj: Ctx, broker, output, topic, partition):
    """The producers of one partition (DescribeProducers): epoch, last sequence and write, open transaction."""

    (r,) = _ask(obj, broker, lambda a: a.describe_producers([(topic, partition)]))
    if r["code"]:
        render.error(f"{topic}-{partition}: {r['error']}")
        sys.exit(EXIT_UNAVAILABLE if r["code"] in _UNAVAILABLE_CODES else EXIT_REFUSED)
    producers = r["producers"]
    render.listing(output, producers, None,
                   ["producer id", "epoch", "last sequence", "last write", "coordinator epoch", "txn start offset"],
                   [(p["producer_id"], p["producer_epoch"], p["last_sequence"], _time(p["last_timestamp_ms"]),
                     p["coordinator_epoch"], p["current_txn_start_offset"]) for p in producers])
    if output == "table" and r["message"]:
        render.warn(r["message"])  # e.g. only the first describe_producers_limit producers shown


@_command("find-hanging")
@click.option("--max-transaction-timeout", "max_minutes", type=click.FloatRange(0), default=15.0, show_default=True,
              help="Minutes: only transactions whose producer last wrote longer ago than this "
                   "(Kafka's transaction.max.timeout.ms).")
@click.option("--topic", help="Only this topic's partitions (default: every topic of the broker).")
@click.option("--partition", type=click.IntRange(0), help="Only this partition of --topic.")
def txn_find_hanging(obj: Ctx, broker, output, max_minutes, topic, partition):
    """Open transactions on the broker's partitions older than --max-transaction-timeout, with what the
    coordinator says of each: unknown to it, another transaction, or open past its own timeout."""

    if partition is not None and topic is None:
        raise click.UsageError("--partition needs --topic")
    now_ms = int(time.time() * 1000)
    found = _ask(obj, broker, lambda a: find_hanging(a, int(max_minutes * 60_000), now_ms, topic, partition))
    if output == "json":
        render.emit_json(found)
        return
    if not found:
        render.line(f"no open transaction older than {max_minutes:g} min on {broker}")
        return
    render.table(None, ["partition", "start offset", "producer id", "epoch", "open s", "transactional id", "reason"],
                 [(f"{t['topic']}-{t['partition']}", t["start_offset"], t["producer_id"], t["producer_epoch"],
                   t["open_ms"] // 1000, t["transactional_id"], t["reason"]) for t in found])


@_command("abort")
@click.option("--transactional-id", help="The transaction of this id.")
@click.option("--topic", help="With --partition: the open transaction on that partition.")
@click.option("--partition", type=click.IntRange(0))
@click.option("--start-offset", type=click.IntRange(0), help="The one starting at this offset (find-hanging's).")
@click.option("--producer-id", type=click.IntRange(0), help="Refuse unless the transaction is this producer's.")
@click.option("--producer-epoch", type=click.IntRange(0), help="... and this epoch's.")
def txn_abort(obj: Ctx, broker, output, transactional_id, topic, partition, start_offset, producer_id, producer_epoch):
    """Abort an open transaction through its coordinator and fence its producer: the abort markers are written
    on its partitions and the producer's epoch is bumped, so its late writes and its EndTxn are refused.
    Refused (exit 4, nothing applied) when the transaction has moved on since you looked."""

    if (transactional_id is None) == (topic is None):
        raise click.UsageError("give --transactional-id, or --topic and --partition")
    if topic is not None and partition is None:
        raise click.UsageError("--topic needs --partition")
    if transactional_id is not None and start_offset is not None:
        raise click.UsageError("--start-offset goes with --topic and --partition")
    r = _ask(obj, broker, lambda a: abort_transaction(
        a, transactional_id=transactional_id, topic=topic, partition=partition, start_offset=start_offset,
        producer_id=producer_id, producer_epoch=producer_epoch))
    if output == "json":
        render.emit_json(r)
        return
    render.line(f"aborted the transaction of {r['transactional_id']!r} on {_partitions(r['aborted'])}: "
                f"producer {r['fenced_producer_id']} epoch {r['fenced_producer_epoch']} fenced (now "
                f"{r['producer_id']} epoch {r['producer_epoch']}); state {r['state']}")
