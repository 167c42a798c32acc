"""``pidctl migrate ...``: from ZooKeeper to the quorum, bridge mode, rollback."""
from __future__ import annotations

import asyncio
import logging
import os
import sys

import click

from quorum.client.quorum import unreachable
from snapshots.storage.files import atomic_write
from records.wire.errors import RequestTimedOutError

from . import render
from .common import Addresses, Ctx, pidctl_command, run


class ZkHosts(click.ParamType):
    """ZooKeeper's connect string, ``HOST:PORT[,HOST:PORT...][/chroot]``: every port 1-65535 (kazoo would
    take ``127.0.0.1:99999`` and, in bridge mode, the quorum would then fail every allocation)."""

    name = "host:port,...[/chroot]"

    def convert(self, value, param, ctx):
        hosts, slash, chroot = str(value).partition("/")
        hosts = Addresses().convert(hosts, param, ctx)
        if slash and (not chroot or chroot.endswith("/") or "//" in chroot):
            self.fail(f"{value!r}: the chroot {'/' + chroot!r} is not a znode path", param, ctx)
        return hosts + (slash + chroot if slash else "")


ZK_HOSTS = ZkHosts()


@click.group()
def migrate():
    """Move producer-ID allocation from ZooKeeper to the quorum."""


@migrate.command("from-zk")
@click.option("--export", "export_file", type=click.Path(dir_okay=False),
              help="A JSON export of /latest_producer_id_block.")
@click.option("--zk", "zk_hosts", type=ZK_HOSTS, help="Live ZooKeeper: HOST:PORT[,HOST:PORT...][/chroot].")
@click.option("--dry-run", is_flag=True, help="Say what would be seeded; commit nothing.")
@click.option("--allow-empty", is_flag=True,
              help="A missing znode (or an empty one) is not an error: there is nothing to seed.")
@pidctl_command
def migrate_from_zk(obj: Ctx, export_file, zk_hosts, dry_run, allow_empty, output):
    """Seed the quorum so its next block starts at ZooKeeper's block_end + 1.

    Harmless to run twice; never moves the quorum's cursor backwards. Only a
    fresh quorum may be seeded: one that issued producer IDs in ZooKeeper's
    range (0..block_end) before any seed is refused (exit 4), dry run or not.
    """
    from quorum.migration.seed import read_zk_block, seed_from_block  # heavy (kazoo): imported when used

    if (export_file is None) == (zk_hosts is None):
        raise click.UsageError("give exactly one of --export FILE or --zk HOST:PORT[/chroot]")
    _quiet_kazoo()
    block, origin = read_zk_block(export_file=export_file, zk_hosts=zk_hosts, allow_empty=allow_empty,
                                  timeout=obj.timeout)
    result = asyncio.run(run(lambda c: seed_from_block(c, block, origin, dry_run=dry_run))(obj.client()))
    if output == "json":
        render.emit_json(result)
    else:
        render.line(result["message"])


def _migration_command(obj: Ctx, action: str, zk: str, output: str) -> None:
    result = asyncio.run(run(lambda c: c.migrate(action, zk))(obj.client()))
    if output == "json":
        render.emit_json(result)
    else:
        render.line(f"{result['message']}; the quorum's next producer ID is {result['next_producer_id']}")


@migrate.command("bridge")
@click.option("--zk", "zk_hosts", required=True, type=ZK_HOSTS, help="ZooKeeper of the legacy brokers: HOST:PORT[,...][/chroot].")
@pidctl_command
def migrate_bridge(obj: Ctx, zk_hosts, output):
    """Mixed fleet: reserve every quorum allocation in the znode before committing it."""
    _migration_command(obj, "bridge", zk_hosts, output)


@migrate.command("finalize")
@pidctl_command
def migrate_finalize(obj: Ctx, output):
    """End bridge mode once every broker allocates through the quorum (the znode is no longer written)."""
    _migration_command(obj, "finalize", "", output)


@migrate.command("rollback")
@pidctl_command
def migrate_rollback(obj: Ctx, output):
    """Back to ZooKeeper: the quorum stops issuing and a placeholder block at its next ID goes to the znode."""
    _migration_command(obj, "rollback", "", output)


@migrate.command("status")
@pidctl_command
def migrate_status(obj: Ctx, output):
    """The migration mode, the znode, and the quorum's next producer ID (from any node)."""
    async def go(client):
        errors: dict[str, str] = {}
        for address in client.addresses:
            try:
                return await client.describe(address)
            except Exception as e:  # noqa: BLE001 - try the next node
                errors[address] = str(e) or type(e).__name__
        raise RequestTimedOutError(unreachable("no quorum node answered", errors))
    d = asyncio.run(run(go)(obj.client()))
    m = d["state"].get("migration") or {}
    result = {"mode": m.get("mode"), "zk": m.get("zk"), "reserved_until": m.get("reserved_until"),
              "next_producer_id": d["state"]["next_producer_id"],
              "producer_ids_issued": d.get("producer_ids_issued")}
    if output == "json":
        render.emit_json(result)
    else:
        render.line(f"migration mode: {result['mode'] or 'none'}" + (f" (znode at {result['zk']})" if result["zk"] else "")
                    + f"; next producer ID {result['next_producer_id']}" + _issued(result["producer_ids_issued"]))


def _issued(issued: dict | None) -> str:
    """What the quorum issued, as the seed sees it (a fresh quorum has issued nothing)."""
    if issued is None:  # a node from before DescribeState said it
        return ""
    if issued["lowest"] is None:
        return "; seeded, no producer ID issued yet" if issued["seeded"] else (
            "; no producer ID issued yet (a fresh quorum: it may be seeded)")
    if issued["before_seed"]:
        return (f"; issued producer IDs from {issued['lowest']} before any seed (not fresh: a seed from a "
                f"ZooKeeper block ending at {issued['lowest']} or above is refused)")
    return f"; issued producer IDs from {issued['lowest']}, all after its seed"


def _quiet_kazoo() -> None:
    """Drop kazoo's own log lines (one per failed connection attempt): the outcome is reported
    as one line by handle_errors."""

    kazoo_log = logging.getLogger("kazoo")
    kazoo_log.addHandler(logging.NullHandler())
    kazoo_log.propagate = False


def _zk_call(zk_hosts: str, fn, *args):
    """Run a ``quorum.migration.zk`` function on ``zk_hosts`` with kazoo's own log lines dropped; a connect
    string kazoo cannot parse is a bad --zk."""
    from quorum.migration.zk import ZkMigrationError  # heavy (kazoo): imported when used

    _quiet_kazoo()
    try:
        return fn(zk_hosts, *args)
    except ZkMigrationError:
        raise
    except ValueError as e:  # kazoo's parsing of the connect string
        raise click.BadParameter(f"{zk_hosts!r}: {e}", param_hint="'--zk'") from None


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


@migrate.command("export")
@click.option("--zk", "zk_hosts", required=True, type=ZK_HOSTS, help="ZooKeeper: HOST:PORT[,HOST:PORT...][/chroot].")
@click.option("--out", "out_file", type=click.Path(dir_okay=False),
              help="Write the data to this file (atomically: temp file, fsync, rename). Default: stdout.")
@pidctl_command
def migrate_export(obj: Ctx, zk_hosts, out_file, output):
    """Export /latest_producer_id_block: the znode's data exactly as ZooKeeper holds it.

    The file is what `pidctl migrate from-zk --export FILE` reads. A missing,
    empty or malformed znode is refused and nothing is written. On stdout the
    data is followed by a newline. With -o json, stdout is one JSON object
    instead: the parsed block (numbers as numbers), the znode's version, its
    data as ZooKeeper holds it, and the file written (null without --out).
    """
    from quorum.migration.zk import ZK_BLOCK_PATH, export_block  # heavy (kazoo): imported when used

    data, block, version = _zk_call(zk_hosts, export_block, obj.timeout)
    if out_file is not None:
        try:
            atomic_write(out_file, data)
        except OSError as e:
            _remove_quietly(f"{out_file}.tmp")  # atomic_write's temp file, if it got that far
            raise click.FileError(out_file, hint=e.strerror or str(e)) from None
    if output == "json":
        render.emit_json({"zk": zk_hosts, "znode": ZK_BLOCK_PATH, "znode_version": version,
                          "version": block.version, "broker": block.broker, "block_start": block.block_start,
                          "block_end": block.block_end, "data": data.decode(), "out": out_file})
    elif out_file is None:
        sys.stdout.buffer.write(data + b"\n")
        sys.stdout.flush()
    else:
        render.line(f"exported {ZK_BLOCK_PATH} from {zk_hosts} (znode version {version}): block "
                    f"[{block.block_start}, {block.block_end}] of broker {block.broker} -> {out_file}")


@migrate.command("zk-allocate")
@click.option("--zk", "zk_hosts", required=True, type=ZK_HOSTS, help="ZooKeeper: HOST:PORT[,HOST:PORT...][/chroot].")
@click.option("--broker-id", type=click.IntRange(0, 2**31 - 1), required=True,
              help="Written into the znode; use an id no running broker uses.")
@click.option("--count", type=click.IntRange(1, 10_000), default=1, show_default=True, help="Blocks to allocate.")
@pidctl_command
def migrate_zk_allocate(obj: Ctx, zk_hosts, broker_id, count, output):
    """Allocate blocks the ZooKeeper way, as a broker that has not moved to the quorum does.

    Conditional setData on /latest_producer_id_block (block_end + 1, 1000 IDs);
    a write whose answer is lost is re-read, never assumed. Safe before the
    migration, in bridge mode, and after a rollback; NEVER after
    `migrate finalize` (the quorum no longer reserves in the znode).
    """
    from quorum.migration.zk import allocate_legacy  # heavy (kazoo): imported when used

    got: list[tuple[int, int]] = []
    try:
        _zk_call(zk_hosts, allocate_legacy, broker_id, count, obj.timeout, lambda *block: got.append(block))
    finally:
        if got:  # blocks taken before a failure are shown too (they are spent in ZooKeeper either way)
            blocks = [{"broker_id": broker_id, "producer_id_start": start, "producer_id_len": length,
                       "next_producer_id": start + length, "block_end": start + length - 1} for start, length in got]
            render.listing(output, blocks, "allocated through ZooKeeper", ["broker", "start", "end (excl.)", "len"],
                           [[b["broker_id"], b["producer_id_start"], b["next_producer_id"], b["producer_id_len"]]
                            for b in blocks])
