"""pidctl: ``pidctl <noun> <verb>``, thin commands over library calls.

Exit codes: 0 ok, 1 error, 2 usage, 3 unavailable or timed out, 4 refused by
the quorum, 130 interrupted.  User mistakes print one line, no traceback.
"""
from __future__ import annotations

import asyncio
import functools
import glob
import json
import os
import sys
import uuid

import click

from quorum.audit import iter_blocks
from client.quorum import QuorumClient, RetryPolicy
from quorum.config import ConfigError
from quorum.localcluster import ClusterError, LocalCluster
from storage.disk import CorruptFileError
from wire.errors import Errors, PidQuorumError, RequestTimedOutError

from . import render

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_REFUSED, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130

log_format_option = click.option("--log-format", type=click.Choice(["human", "json"]), envvar="PIDQUORUM_LOG_FORMAT",
                                 help="Log lines as text (default) or one JSON object per line.")
output_option = click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table",
                             show_default=True, help="Output format.")


class Ctx:
    def __init__(self, data_dir: str, quorum: str | None, timeout: float, security=None):
        self.data_dir = data_dir
        self.quorum = quorum
        self.timeout = timeout
        self.security = security  # security.client.ClientSecurity, None: PLAINTEXT

    @property
    def cluster(self) -> LocalCluster:
        return LocalCluster(self.data_dir)

    def addresses(self) -> list[str]:
        if self.quorum:
            return [a.strip() for a in self.quorum.split(",") if a.strip()]
        return self.cluster.client_addresses()

    def client(self) -> QuorumClient:
        return QuorumClient(self.addresses(), RetryPolicy(timeout=self.timeout, attempt_timeout=min(2.0, self.timeout)),
                            client_id="pidctl", security=self.security)


def _chaos_errors() -> tuple[type[Exception], ...]:
    """The chaos and migration packages' user-facing errors (imported lazily: they are heavy)."""
    out: list[type[Exception]] = []
    try:
        from chaos.history import HistoryError
        from chaos.runner import RunError
        out += [HistoryError, RunError]
    except ImportError:  # pragma: no cover - chaos not installed
        pass
    try:
        from migration.zk import ZkMigrationError
        out.append(ZkMigrationError)
    except ImportError:  # pragma: no cover
        pass
    return tuple(out)


def _audit_errors() -> tuple[type[Exception], ...]:
    """The audit pipeline's user-facing errors (imported lazily: pyarrow is heavy)."""
    out: list[type[Exception]] = []
    try:
        from audit.export import ExportError
        out.append(ExportError)
    except ImportError:  # pragma: no cover - audit not installed
        pass
    return tuple(out)


def _security_errors() -> tuple[type[Exception], ...]:
    from security.acl import AclError
    from security.credentials import CredentialsError
    from security.tls import TlsConfigError

    return (AclError, CredentialsError, TlsConfigError)


def handle_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PidQuorumError as e:
            render.error(e.message)
            code = EXIT_UNAVAILABLE if e.code in (Errors.REQUEST_TIMED_OUT, Errors.NOT_CONTROLLER) else EXIT_REFUSED
            sys.exit(code)
        except (ClusterError, ConfigError, CorruptFileError, *_chaos_errors(), *_audit_errors(),
                *_security_errors()) as e:
            render.error(str(e))
            sys.exit(EXIT_UNAVAILABLE if type(e).__name__ == "ZkUnavailable" else EXIT_ERROR)
        except KeyboardInterrupt:
            sys.exit(EXIT_INTERRUPTED)
    return wrapper


def run(coro_fn):
    """Run an async function taking a QuorumClient, closing the client afterwards."""
    async def go(client):
        try:
            return await coro_fn(client)
        finally:
            await client.close()
    return go


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--data-dir", envvar="PIDQUORUM_DIR", default=".pidquorum", show_default=True,
              help="Directory of the local cluster (pidctl cluster ...).")
@click.option("--quorum", envvar="PIDQUORUM_QUORUM", help="Client addresses host:port,... (default: the local cluster's).")
@click.option("--timeout", type=float, default=10.0, show_default=True, help="Deadline of one call, in seconds.")
@click.option("--security-protocol", envvar="PIDQUORUM_SECURITY_PROTOCOL", default="PLAINTEXT", show_default=True,
              type=click.Choice(["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]),
              help="How to reach the quorum (as Kafka's security.protocol).")
@click.option("--sasl-mechanism", envvar="PIDQUORUM_SASL_MECHANISM", default="PLAIN", show_default=True,
              type=click.Choice(["PLAIN", "SCRAM-SHA-256"]))
@click.option("--sasl-username", envvar="PIDQUORUM_SASL_USERNAME", help="SASL user (env PIDQUORUM_SASL_USERNAME).")
@click.option("--sasl-password", envvar="PIDQUORUM_SASL_PASSWORD",
              help="SASL password; prefer the environment variable PIDQUORUM_SASL_PASSWORD.")
@click.option("--tls-cafile", envvar="PIDQUORUM_TLS_CAFILE", type=click.Path(dir_okay=False),
              help="CA that signed the quorum's certificates (default: the system's trust store).")
@click.pass_context
def cli(ctx, data_dir, quorum, timeout, security_protocol, sasl_mechanism, sasl_username, sasl_password, tls_cafile):
    """pidquorum: producer-ID blocks from a Raft quorum."""
    security = None
    if security_protocol != "PLAINTEXT":
        from security.client import ClientSecurity

        try:
            security = ClientSecurity(security_protocol, sasl_mechanism, sasl_username, sasl_password, tls_cafile)
        except ValueError as e:
            raise click.UsageError(str(e)) from None
    ctx.obj = Ctx(data_dir, quorum, timeout, security)


# ------------------------------------------------------------------ cluster
@cli.group()
def cluster():
    """A local three-node quorum on 127.0.0.1 (background processes)."""


@cluster.command("up")
@click.option("--nodes", type=click.IntRange(1, 9), default=3, show_default=True)
@click.option("--block-size", type=click.IntRange(1, 2**31 - 1), default=1000, show_default=True)
@click.option("--metrics", is_flag=True, help="Each node serves Prometheus metrics on a free 127.0.0.1 port.")
@click.pass_obj
@handle_errors
def cluster_up(obj: Ctx, nodes, block_size, metrics=False):
    lc = obj.cluster
    lc.up(size=nodes, block_size=block_size, metrics=metrics)
    addresses = lc.client_addresses()
    asyncio.run(_wait_leader(obj))
    render.line(f"cluster up in {lc.dir}: {len(addresses)} nodes, client addresses {','.join(addresses)}")
    endpoints = [n.metrics_address for n in lc.nodes() if n.metrics_address]
    if endpoints:
        render.line(f"metrics: {', '.join(f'http://{a}/metrics' for a in endpoints)}")


async def _wait_leader(obj: Ctx) -> None:
    """Wait until some node leads and has committed (DescribeState); bounded by --timeout."""
    client = obj.client()
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + obj.timeout
        while loop.time() < deadline:
            for a in obj.addresses():
                try:
                    d = await client.describe(a)
                except Exception:  # noqa: BLE001 - still starting
                    continue
                if d["raft"]["state"] == "leader":
                    return
            await asyncio.sleep(0.05)
        raise ClusterError(f"no leader within {obj.timeout:.0f}s")
    finally:
        await client.close()


@cluster.command("new-id")
def cluster_new_id():
    """Print a new cluster id, for cluster_id in every node's config of a new deployment."""
    from quorum.identity import new_cluster_id
    render.line(new_cluster_id())


@cluster.command("down")
@click.pass_obj
@handle_errors
def cluster_down(obj: Ctx):
    lc = obj.cluster
    lc.load()
    lc.down()
    render.line(f"cluster in {lc.dir} stopped")


@cluster.command("status")
@output_option
@click.pass_obj
@handle_errors
def cluster_status(obj: Ctx, output):
    lc = obj.cluster
    nodes = asyncio.run(_quorum_status(obj))
    for n in nodes:
        n["pid"] = next((i.pid for i in lc.nodes() if i.client_address == n["client_address"]), None)
        n["process"] = "running" if any(lc.alive(i.node_id) for i in lc.nodes()
                                         if i.client_address == n["client_address"]) else "stopped"
    render.quorum_status(output, nodes)


async def _quorum_status(obj: Ctx) -> list[dict]:
    client = obj.client()
    out = []
    try:
        for i, a in enumerate(obj.addresses()):
            try:
                d = await client.describe(a)
                d.pop("error_code", None)
                out.append(d)
            except Exception as e:  # noqa: BLE001 - report the node as down
                out.append({"node_id": i + 1, "client_address": a, "error": str(e) or type(e).__name__})
    finally:
        await client.close()
    commit = max((n["raft"]["commit_index"] for n in out if "raft" in n), default=0)
    for n in out:
        if "raft" in n:
            n["lag"] = commit - n["raft"]["last_applied"]
    return out


# --------------------------------------------------------------------- node
@cli.group()
def node():
    """One node of a real deployment."""


@node.command("start")
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False))
@click.option("--log-level", default="INFO", show_default=True)
@click.option("--trust-own-log", is_flag=True,
              help="Your word that this data directory is the one the node last ran on, not a restored copy: "
                   "it counts without waiting for its peers to vouch.  Only when a peer is lost for good "
                   "(docs/operations.md).")
@log_format_option
@handle_errors
def node_start(config_path, log_level, log_format, trust_own_log):
    """Run a node in the foreground until SIGTERM."""
    from migration.bridge import ZooKeeperBridge
    from quorum.config import load
    from quorum.node import run_node, setup_logging

    setup_logging(log_level, log_format or "human")
    cfg = load(config_path)
    if log_format is None and cfg.log_format != "human":
        setup_logging(log_level, cfg.log_format)
    sys.exit(run_node(cfg, trust_own_log=trust_own_log, zookeeper=ZooKeeperBridge()))


# ------------------------------------------------------------------- broker
@cli.group()
def broker():
    """Brokers: registrations, and the Kafka-protocol front end."""


@broker.command("start")
@click.option("--broker-id", type=click.IntRange(0, 2**31 - 1), required=True)
@click.option("--quorum", "quorum_opt", help="Quorum client addresses host:port,... (default: the local cluster's).")
@click.option("--listen", default="127.0.0.1:9092", show_default=True, help="host:port to serve Kafka clients on.")
@click.option("--advertised", help="host:port put in Metadata (default: --listen).")
@click.option("--data-dir", "broker_dir", help="Where partitions live (default: ./.pidquorum-broker-N).")
@click.option("--partitions", type=click.IntRange(1, 10_000), default=1, show_default=True,
              help="Partitions of an auto-created topic.")
@click.option("--no-dedup", is_flag=True, help="Turn idempotence checks off (only to show what they prevent).")
@click.option("--producer-id-expiration-ms", type=click.IntRange(1), default=24 * 3600 * 1000, show_default=True)
@click.option("--producer-id-quota-window-num", type=click.IntRange(1, 1000), default=11, show_default=True,
              help="KIP-936 producer.id.quota.window.num: windows a producer ID is remembered (and the burst).")
@click.option("--producer-id-quota-window-size-s", type=click.FloatRange(0, 7 * 86400, min_open=True), default=3600.0,
              show_default=True, help="KIP-936 producer.id.quota.window.size.seconds.")
@click.option("--quota-refresh-s", type=click.FloatRange(0, 3600, min_open=True), default=1.0, show_default=True,
              help="How often the client quotas are read from the quorum.")
@click.option("--ready-file", type=click.Path(dir_okay=False), help="Written with 'pid port' once serving.")
@click.option("--log-level", default="INFO", show_default=True)
@log_format_option
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Serve Prometheus metrics on this port (0 = off).")
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="Address the metrics port binds to.")
@click.option("--sasl-credentials-file", type=click.Path(dir_okay=False),
              help="Require SASL (PLAIN, SCRAM-SHA-256) from clients, with these users; ACLs are then enforced.")
@click.option("--sasl-mechanism", "sasl_mechanisms", multiple=True, type=click.Choice(["PLAIN", "SCRAM-SHA-256"]),
              help="Enabled mechanisms (repeat; default: both).")
@click.option("--super-user", "super_users", multiple=True, help="User:<name> the ACLs never refuse (repeat).")
@click.option("--acl-refresh-ms", type=click.IntRange(10), default=1000, show_default=True,
              help="How often the ACLs are read from the quorum.")
@click.option("--tls-certfile", type=click.Path(dir_okay=False), help="Serve TLS with this certificate (chain).")
@click.option("--tls-keyfile", type=click.Path(dir_okay=False))
@click.option("--tls-cafile", type=click.Path(dir_okay=False), help="CA of client certificates (--tls-client-auth).")
@click.option("--tls-client-auth", is_flag=True, help="Require client certificates (mutual TLS).")
@click.option("--quorum-security-protocol", default="PLAINTEXT", show_default=True,
              type=click.Choice(["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]), help="How to reach the quorum.")
@click.option("--quorum-sasl-mechanism", default="PLAIN", show_default=True,
              type=click.Choice(["PLAIN", "SCRAM-SHA-256"]))
@click.option("--quorum-sasl-username", envvar="PIDQUORUM_BROKER_SASL_USERNAME",
              help="The broker's user on the quorum (needs CLUSTER_ACTION).")
@click.option("--quorum-sasl-password", envvar="PIDQUORUM_BROKER_SASL_PASSWORD",
              help="Prefer the environment variable PIDQUORUM_BROKER_SASL_PASSWORD.")
@click.option("--quorum-tls-cafile", type=click.Path(dir_okay=False), help="CA of the quorum's certificates.")
@click.pass_obj
@handle_errors
def broker_start(obj: Ctx, broker_id, quorum_opt, listen, advertised, broker_dir, partitions, no_dedup,
                 producer_id_expiration_ms, producer_id_quota_window_num,
                 producer_id_quota_window_size_s, quota_refresh_s, ready_file, log_level, sasl_credentials_file,
                 sasl_mechanisms, super_users, acl_refresh_ms, tls_certfile, tls_keyfile, tls_cafile, tls_client_auth,
                 quorum_security_protocol, quorum_sasl_mechanism, quorum_sasl_username, quorum_sasl_password,
                 quorum_tls_cafile, log_format=None, metrics_port=0, metrics_host="127.0.0.1"):
    """Run a Kafka-protocol broker in the foreground until SIGTERM.

    Producer IDs come from quorum-allocated blocks; idempotent produce with
    sequence checks; InitProducerId with KIP-360 epochs for transactional ids.
    """
    from broker.frontend import BrokerConfig
    from broker.run import run_broker
    from quorum.node import setup_logging

    setup_logging(log_level, log_format or "human")
    quorum = [a.strip() for a in quorum_opt.split(",") if a.strip()] if quorum_opt else obj.addresses()
    try:
        quorum_security = obj.security
        if quorum_security_protocol != "PLAINTEXT":
            from security.client import ClientSecurity

            quorum_security = ClientSecurity(quorum_security_protocol, quorum_sasl_mechanism, quorum_sasl_username,
                                             quorum_sasl_password, quorum_tls_cafile)
        security = {"sasl_credentials_file": sasl_credentials_file, "super_users": tuple(super_users),
                    "acl_refresh_s": acl_refresh_ms / 1000, "tls_certfile": tls_certfile, "tls_keyfile": tls_keyfile,
                    "tls_cafile": tls_cafile, "tls_client_auth": tls_client_auth, "quorum_security": quorum_security}
        if sasl_mechanisms:
            security["sasl_mechanisms"] = tuple(sasl_mechanisms)
        cfg = BrokerConfig(broker_id=broker_id, quorum=quorum, listen=listen, advertised=advertised,
                           data_dir=broker_dir or f".pidquorum-broker-{broker_id}", default_partitions=partitions,
                           dedup=not no_dedup,
                           producer_id_expiration_ms=producer_id_expiration_ms, metrics_port=metrics_port,
                           metrics_host=metrics_host,
                           producer_id_quota_window_num=producer_id_quota_window_num,
                           producer_id_quota_window_size_s=producer_id_quota_window_size_s,
                           quota_refresh_s=quota_refresh_s, **security)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    sys.exit(run_broker(cfg, ready_file))


@broker.command("status")
@click.option("--metrics", "address", required=True, metavar="HOST:PORT",
              help="The broker's metrics endpoint (broker start --metrics-port).")
@output_option
@click.pass_obj
def broker_status(obj: Ctx, address, output):
    """A broker's figures, read from its metrics endpoint: PIDs issued, prefetch hits and misses,
    COORDINATOR_LOAD_IN_PROGRESS answers, duplicates, fenced producers, quotas per principal."""
    from telemetry.metrics import MetricsUnavailable, read_metrics

    try:
        figures = read_metrics(address, timeout=obj.timeout)
    except MetricsUnavailable as e:
        render.error(str(e))
        sys.exit(EXIT_UNAVAILABLE)
    if not any(name.startswith("pidquorum_broker") for name in figures):
        render.error(f"{address} serves no broker metrics (a quorum node's endpoint?)")
        sys.exit(EXIT_ERROR)
    render.metrics_status(output, address, figures)


@broker.command("register")
@click.option("--broker-id", type=int, required=True)
@click.option("--incarnation", type=click.UUID, help="Incarnation id (default: a new one).")
@click.option("--listener", default="", help="host:port the broker serves on.")
@output_option
@click.pass_obj
@handle_errors
def broker_register(obj: Ctx, broker_id, incarnation, listener, output):
    incarnation = incarnation or uuid.uuid4()
    epoch = asyncio.run(run(lambda c: c.register_broker(broker_id, incarnation, listener))(obj.client()))
    result = {"broker_id": broker_id, "broker_epoch": epoch, "incarnation_id": str(incarnation)}
    if output == "json":
        render.emit_json(result)
    else:
        render.line(str(epoch))


# ----------------------------------------------------------------- allocate
@cli.command("allocate")
@click.option("--broker-id", type=int, required=True)
@click.option("--broker-epoch", type=int, required=True)
@click.option("--count", type=click.IntRange(1, 1_000_000), default=1, show_default=True, help="Blocks to allocate.")
@output_option
@click.pass_obj
@handle_errors
def allocate(obj: Ctx, broker_id, broker_epoch, count, output):
    """Allocate producer-ID blocks for a broker (AllocateProducerIds)."""
    async def go(client):
        return [await client.allocate(broker_id, broker_epoch) for _ in range(count)]

    got = asyncio.run(run(go)(obj.client()))
    blocks = [{"broker_id": broker_id, "broker_epoch": broker_epoch, **b.to_dict()} for b in got]
    render.listing(output, blocks, "allocated", ["broker", "epoch", "start", "end (excl.)", "len", "throttle ms"],
                   [[b["broker_id"], b["broker_epoch"], b["producer_id_start"], b["next_producer_id"],
                     b["producer_id_len"], b["throttle_time_ms"]] for b in blocks])


# ------------------------------------------------------------------- blocks
@cli.group()
def blocks():
    """Producer-ID blocks."""


@blocks.command("latest")
@output_option
@click.pass_obj
@handle_errors
def blocks_latest(obj: Ctx, output):
    """The latest block and the next ID, as the leader sees them."""
    nodes = asyncio.run(_quorum_status(obj))
    live = [n for n in nodes if "raft" in n]
    if not live:
        raise RequestTimedOutError("no node answered")
    best = max(live, key=lambda n: (n["raft"]["state"] == "leader", n["applied_index"]))
    result = {"node_id": best["node_id"], "applied_index": best["applied_index"],
              "next_producer_id": best["state"]["next_producer_id"], "latest_block": best["state"]["latest_block"]}
    if output == "json":
        render.emit_json(result)
    else:
        lb = result["latest_block"]
        render.blocks("table", [lb] if lb else [], f"latest block (node {result['node_id']}, "
                                                    f"next producer ID {result['next_producer_id']})")


@blocks.command("history")
@click.option("--audit", "audit_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Audit file(s) to read (default: every node's audit.log in --data-dir).")
@click.option("--broker-id", type=int, help="Only this broker's blocks.")
@output_option
@click.pass_obj
@handle_errors
def blocks_history(obj: Ctx, audit_files, broker_id, output):
    """Every block ever issued, from the nodes' audit trails (kept across log compaction)."""
    paths = list(audit_files) or sorted(glob.glob(os.path.join(obj.data_dir, "node-*", "audit.log")))
    if not paths:
        raise ClusterError(f"no audit files in {obj.data_dir} (use --audit FILE)")
    rows = [b for b in iter_blocks(paths) if broker_id is None or b["broker_id"] == broker_id]
    render.blocks(output, rows, f"block history ({len(rows)} blocks)")


# ------------------------------------------------------------------- quorum
@cli.group()
def quorum():
    """The Raft quorum."""


@quorum.command("status")
@output_option
@click.pass_obj
@handle_errors
def quorum_status(obj: Ctx, output):
    """Leader, term, commit index and per-node lag."""
    render.quorum_status(output, asyncio.run(_quorum_status(obj)))


@quorum.command("remove-node")
@click.argument("raft_address")
@output_option
@click.pass_obj
@handle_errors
def quorum_remove_node(obj: Ctx, raft_address, output):
    """Remove a member (by Raft address) from the cluster; one change at a time."""
    from quorum import membership
    resp = asyncio.run(run(lambda c: membership.remove_node(c, obj.addresses(), raft_address, obj.timeout))(
        obj.client()))
    render.membership(output, resp, f"removed {raft_address}")


@quorum.command("add-node")
@click.argument("raft_address")
@click.option("--client-address", required=True, help="The new node's client address host:port (must be running).")
@click.option("--catch-up-timeout", type=click.FloatRange(0.1, 3600), default=60.0, show_default=True,
              help="Seconds to wait for the new node to hold the log.")
@output_option
@click.pass_obj
@handle_errors
def quorum_add_node(obj: Ctx, raft_address, client_address, catch_up_timeout, output):
    """Add a fresh, running node (empty data dir) as a member; waits until it has caught up."""
    from quorum import membership
    resp = asyncio.run(run(lambda c: membership.add_node(c, obj.addresses(), raft_address, client_address,
                                                         catch_up_timeout, obj.timeout))(obj.client()))
    render.membership(output, resp, f"added {raft_address}")
    if not resp["caught_up"]:
        render.error(f"{raft_address} is a member but has not caught up within {catch_up_timeout:g}s "
                     f"(match index {resp['match_index']}, target {resp['catch_up_index']}); is it running?")
        sys.exit(EXIT_UNAVAILABLE)


@quorum.command("transfer-leadership")
@click.argument("raft_address", required=False)
@output_option
@click.pass_obj
@handle_errors
def quorum_transfer_leadership(obj: Ctx, raft_address, output):
    """Hand leadership to RAFT_ADDRESS (default: the most caught-up follower), e.g. before maintenance."""
    from quorum import membership
    resp = asyncio.run(run(lambda c: membership.transfer_leadership(c, obj.addresses(), raft_address,
                                                                    obj.timeout))(obj.client()))
    render.membership(output, resp, f"leader {resp['previous_leader']} -> {resp['leader']} (term {resp['term']})")


# ----------------------------------------------------------------- snapshot
@cli.group()
def snapshot():
    """Snapshot files."""


@snapshot.command("take")
@click.pass_obj
@handle_errors
def snapshot_take(obj: Ctx):
    """Ask every node to write a snapshot now (log compaction) and wait for the files."""
    async def go(client):
        loop = asyncio.get_running_loop()
        done = {}
        for a in obj.addresses():
            before = await client.describe(a)
            await client.describe(a, action="snapshot")
            deadline = loop.time() + obj.timeout
            while loop.time() < deadline:
                d = await client.describe(a)
                if d["snapshot"]["bytes"] and d["snapshot"]["mtime_ns"] != before["snapshot"]["mtime_ns"]:
                    done[a] = d["snapshot"]
                    break
                await asyncio.sleep(0.05)
            else:
                raise RequestTimedOutError(f"{a}: no new snapshot within {obj.timeout:.0f}s")
        return done

    for a, snap in asyncio.run(run(go)(obj.client())).items():
        render.line(f"{a}: {snap['path']} ({snap['bytes']} bytes)")


@snapshot.command("inspect")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@output_option
@handle_errors
def snapshot_inspect(file, output):
    from snapshots import inspect_snapshot

    render.snapshot(output, inspect_snapshot(file))


# --------------------------------------------------------------------- demo
# ------------------------------------------------------------------ migrate
@cli.group()
def migrate():
    """Move producer-ID allocation from ZooKeeper to the quorum."""


@migrate.command("from-zk")
@click.option("--export", "export_file", type=click.Path(dir_okay=False),
              help="A JSON export of /latest_producer_id_block.")
@click.option("--zk", "zk_hosts", help="Live ZooKeeper: HOST:PORT[,HOST:PORT...][/chroot].")
@click.option("--dry-run", is_flag=True, help="Say what would be seeded; commit nothing.")
@click.option("--allow-empty", is_flag=True,
              help="A missing znode (or an empty one) is not an error: there is nothing to seed.")
@output_option
@click.pass_obj
@handle_errors
def migrate_from_zk(obj: Ctx, export_file, zk_hosts, dry_run, allow_empty, output):
    """Seed the quorum so its next block starts at ZooKeeper's block_end + 1.

    Harmless to run twice; never moves the quorum's cursor backwards.
    """
    from migration.seed import read_zk_block, seed_from_block

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
@click.option("--zk", "zk_hosts", required=True, help="ZooKeeper of the legacy brokers: HOST:PORT[,...][/chroot].")
@output_option
@click.pass_obj
@handle_errors
def migrate_bridge(obj: Ctx, zk_hosts, output):
    """Mixed fleet: reserve every quorum allocation in the znode before committing it."""
    _migration_command(obj, "bridge", zk_hosts, output)


@migrate.command("finalize")
@output_option
@click.pass_obj
@handle_errors
def migrate_finalize(obj: Ctx, output):
    """End bridge mode once every broker allocates through the quorum (the znode is no longer written)."""
    _migration_command(obj, "finalize", "", output)


@migrate.command("rollback")
@output_option
@click.pass_obj
@handle_errors
def migrate_rollback(obj: Ctx, output):
    """Back to ZooKeeper: the quorum stops issuing and a placeholder block at its next ID goes to the znode."""
    _migration_command(obj, "rollback", "", output)


@migrate.command("status")
@output_option
@click.pass_obj
@handle_errors
def migrate_status(obj: Ctx, output):
    """The migration mode, the znode, and the quorum's next producer ID (from any node)."""
    async def go(client):
        for address in client.addresses:
            try:
                return await client.describe(address)
            except Exception:  # noqa: BLE001 - try the next node
                continue
        raise PidQuorumError("no quorum node answered")
    d = asyncio.run(run(go)(obj.client()))
    m = d["state"].get("migration") or {}
    result = {"mode": m.get("mode"), "zk": m.get("zk"), "reserved_until": m.get("reserved_until"),
              "next_producer_id": d["state"]["next_producer_id"]}
    if output == "json":
        render.emit_json(result)
    else:
        render.line(f"migration mode: {result['mode'] or 'none'}" + (f" (znode at {result['zk']})" if result["zk"] else "")
                    + f"; next producer ID {result['next_producer_id']}")


# ------------------------------------------------------------------ quota (KIP-936)
@cli.group()
def quota():
    """Client quotas kept in the quorum: producer_ids_rate per user or the user default (KIP-936)."""


def _quota_entity(user: str | None, default: bool) -> str | None:
    from quorum.quotas import parse_user

    if (user is None) == (not default):
        raise click.UsageError("give exactly one of --user USER and --default")
    if default:
        return None
    try:
        return parse_user(user)
    except PidQuorumError as e:
        raise click.UsageError(e.message) from None


@quota.command("set")
@click.option("--user", help="The user (SASL name, or User:<name>; ANONYMOUS for unauthenticated clients).")
@click.option("--default", "default", is_flag=True, help="The default for every user without its own quota.")
@click.option("--producer-ids-rate", "rate", type=float, required=True,
              help="New producer IDs per second (averaged over the brokers' quota window).")
@click.option("--dry-run", is_flag=True, help="Let the quorum check it, commit nothing.")
@output_option
@click.pass_obj
@handle_errors
def quota_set(obj: Ctx, user, default, rate, dry_run, output):
    """Set producer_ids_rate for a user or the default (like kafka-configs --entity-type users)."""
    from quorum.quotas import PRODUCER_IDS_RATE, check_value, entity_name

    user = _quota_entity(user, default)
    try:
        rate = check_value(PRODUCER_IDS_RATE, rate)
    except PidQuorumError as e:
        raise click.UsageError(e.message) from None
    changed = asyncio.run(run(lambda c: c.alter_client_quota(user, PRODUCER_IDS_RATE, rate,
                                                             validate_only=dry_run))(obj.client()))
    result = {"user": user, "entity": entity_name(user), "key": PRODUCER_IDS_RATE, "value": rate, "changed": changed,
              "dry_run": dry_run}
    if output == "json":
        render.emit_json(result)
    else:
        verb = "would set" if dry_run else "set" if changed else "unchanged:"
        render.line(f"{verb} {PRODUCER_IDS_RATE}={rate:g} for {result['entity']}")


@quota.command("delete")
@click.option("--user", help="The user.")
@click.option("--default", "default", is_flag=True, help="The user default.")
@output_option
@click.pass_obj
@handle_errors
def quota_delete(obj: Ctx, user, default, output):
    """Remove producer_ids_rate from a user (the default applies again) or from the default."""
    from quorum.quotas import PRODUCER_IDS_RATE, entity_name

    user = _quota_entity(user, default)
    changed = asyncio.run(run(lambda c: c.alter_client_quota(user, PRODUCER_IDS_RATE, remove=True))(obj.client()))
    result = {"user": user, "entity": entity_name(user), "key": PRODUCER_IDS_RATE, "removed": changed}
    if output == "json":
        render.emit_json(result)
    else:
        render.line(f"{'removed' if changed else 'was not set:'} {PRODUCER_IDS_RATE} of {result['entity']}")


@quota.command("list")
@output_option
@click.pass_obj
@handle_errors
def quota_list(obj: Ctx, output):
    """The quotas as the quorum has committed them (read from any node that follows a leader)."""
    from quorum.quotas import entity_name

    entries, node = asyncio.run(run(lambda c: c.describe_client_quotas())(obj.client()))
    rows = [{"user": e["user"], "entity": entity_name(e["user"]), **e["values"]} for e in entries]
    render.quotas(output, rows, node)


@quota.command("status")
@click.option("--broker-dir", "broker_dirs", multiple=True, required=True, type=click.Path(file_okay=False),
              help="A broker's data dir (repeatable): the stats it writes every quota refresh.")
@output_option
@handle_errors
def quota_status(broker_dirs, output):
    """Per principal, on each broker: measured new-PID rate, tokens, throttle time, throttled requests."""
    from broker.quota import read_stats

    out = {}
    for d in broker_dirs:
        try:
            out[d] = read_stats(d)
        except (OSError, ValueError) as e:
            render.error(str(e))
            sys.exit(EXIT_ERROR)
    render.quota_status(output, out)


def _quiet_kazoo() -> None:
    """Drop kazoo's own log lines (one per failed connection attempt): the outcome is reported
    as one line by handle_errors."""
    import logging

    kazoo_log = logging.getLogger("kazoo")
    kazoo_log.addHandler(logging.NullHandler())
    kazoo_log.propagate = False


def _zk_session(zk_hosts: str, timeout: float):
    """A started kazoo client on ``zk_hosts`` (ZkUnavailable if no session within ``timeout``)."""
    from migration.zk import connect

    _quiet_kazoo()
    try:
        return connect(zk_hosts, timeout)
    except ValueError as e:  # kazoo's parsing of the connect string
        raise click.BadParameter(f"{zk_hosts!r}: {e}", param_hint="'--zk'") from None


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


@migrate.command("export")
@click.option("--zk", "zk_hosts", required=True, help="ZooKeeper: HOST:PORT[,HOST:PORT...][/chroot].")
@click.option("--out", "out_file", type=click.Path(dir_okay=False),
              help="Write the data to this file (atomically: temp file, fsync, rename). Default: stdout.")
@click.pass_obj
@handle_errors
def migrate_export(obj: Ctx, zk_hosts, out_file):
    """Export /latest_producer_id_block: the znode's data exactly as ZooKeeper holds it.

    The file is what `pidctl migrate from-zk --export FILE` reads. A missing,
    empty or malformed znode is refused and nothing is written. On stdout the
    data is followed by a newline.
    """
    from kazoo.exceptions import NoNodeError

    from migration.zk import UNKNOWN_OUTCOME_ERRORS, ZK_BLOCK_PATH, ZkMigrationError, ZkUnavailable, parse_block
    from storage.files import atomic_write

    zk = _zk_session(zk_hosts, obj.timeout)
    try:
        # One read, so the bytes written out are the bytes validated (parsed as read_block does).
        data, stat = zk.get_async(ZK_BLOCK_PATH).get(timeout=obj.timeout)
    except NoNodeError:
        data = stat = None
    except UNKNOWN_OUTCOME_ERRORS as e:
        raise ZkUnavailable(f"reading {ZK_BLOCK_PATH} at {zk_hosts} failed: {type(e).__name__}") from None
    finally:
        zk.stop()
        zk.close()
    if stat is None:
        raise ZkMigrationError(f"znode {ZK_BLOCK_PATH} does not exist at {zk_hosts}: ZooKeeper-mode Kafka has not "
                               f"allocated any producer-ID block there (wrong host or chroot?); nothing exported")
    block = parse_block(data, f"znode {ZK_BLOCK_PATH} ({zk_hosts})")
    if block is None:
        raise ZkMigrationError(f"znode {ZK_BLOCK_PATH} at {zk_hosts} holds no block (empty data); nothing exported")
    if out_file is None:
        sys.stdout.buffer.write(data + b"\n")
        sys.stdout.flush()
        return
    try:
        atomic_write(out_file, data)
    except OSError as e:
        _remove_quietly(f"{out_file}.tmp")  # atomic_write's temp file, if it got that far
        raise click.FileError(out_file, hint=e.strerror or str(e)) from None
    render.line(f"exported {ZK_BLOCK_PATH} from {zk_hosts} (znode version {stat.version}): block "
                f"[{block.block_start}, {block.block_end}] of broker {block.broker} -> {out_file}")


@migrate.command("zk-allocate")
@click.option("--zk", "zk_hosts", required=True, help="ZooKeeper: HOST:PORT[,HOST:PORT...][/chroot].")
@click.option("--broker-id", type=click.IntRange(0, 2**31 - 1), required=True,
              help="Written into the znode; use an id no running broker uses.")
@click.option("--count", type=click.IntRange(1, 10_000), default=1, show_default=True, help="Blocks to allocate.")
@output_option
@click.pass_obj
@handle_errors
def migrate_zk_allocate(obj: Ctx, zk_hosts, broker_id, count, output):
    """Allocate blocks the ZooKeeper way, as a broker that has not moved to the quorum does.

    Conditional setData on /latest_producer_id_block (block_end + 1, 1000 IDs);
    a write whose answer is lost is re-read, never assumed. Safe before the
    migration, in bridge mode, and after a rollback; NEVER after
    `migrate finalize` (the quorum no longer reserves in the znode).
    """
    from migration.zk import ZK_BLOCK_PATH, LegacyAllocator, ZkBlockMissing, ZkMigrationError

    got: list[tuple[int, int]] = []
    zk = _zk_session(zk_hosts, obj.timeout)
    try:
        allocator = LegacyAllocator(zk, broker_id, timeout=obj.timeout, op_timeout=min(2.0, obj.timeout))
        for _ in range(count):
            got.append(allocator.allocate())
    except ZkBlockMissing:
        raise ZkMigrationError(f"cannot create {ZK_BLOCK_PATH} at {zk_hosts}: the chroot does not exist "
                               f"(wrong chroot?)") from None
    finally:
        zk.stop()
        zk.close()
        if got:  # blocks taken before a failure are shown too (they are spent in ZooKeeper either way)
            blocks = [{"broker_id": broker_id, "producer_id_start": start, "producer_id_len": length,
                       "next_producer_id": start + length, "block_end": start + length - 1} for start, length in got]
            render.listing(output, blocks, "allocated through ZooKeeper", ["broker", "start", "end (excl.)", "len"],
                           [[b["broker_id"], b["producer_id_start"], b["next_producer_id"], b["producer_id_len"]]
                            for b in blocks])


# -------------------------------------------------------------------- chaos
@cli.group()
def chaos():
    """Fault injection with a checker: prove no ID was issued twice."""


EXIT_ANOMALY = 5  # the checker found a violation


def _seconds_range(value: str, name: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in value.split(":"))
    except ValueError:
        raise click.BadParameter(f"expected MIN:MAX seconds, got {value!r}", param_hint=name) from None
    if not 0 <= lo <= hi:
        raise click.BadParameter(f"need 0 <= MIN <= MAX, got {value!r}", param_hint=name)
    return lo, hi


@chaos.command("run")
@click.option("--scenario", required=True,
              type=click.Choice(["kill-leader", "pause-leader", "kill-all", "rolling-restart", "partition-leader",
                                 "slow-disk", "mixed"]))
@click.option("--duration", type=click.FloatRange(5, 7 * 24 * 3600), default=60, show_default=True,
              help="Seconds of faults and load.")
@click.option("--seed", type=int, default=0, show_default=True, help="Fixes the choice and timing of faults.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Run directory (default chaos-<scenario>-<seed>).")
@click.option("--brokers", type=click.IntRange(0, 64), default=2, show_default=True,
              help="Wire-protocol block allocators.")
@click.option("--block-rate", type=click.FloatRange(0.1, 10_000), default=20, show_default=True,
              help="AllocateProducerIds/s per broker.")
@click.option("--pid-managers", type=click.IntRange(0, 64), default=2, show_default=True)
@click.option("--pid-rate", type=click.FloatRange(1, 1_000_000), default=1000, show_default=True,
              help="PIDs/s asked of each ProducerIdManager.")
@click.option("--interval", default="2:4", show_default=True, callback=lambda c, p, v: _seconds_range(v, "--interval"),
              help="Quiet seconds before each fault, MIN:MAX (drawn with the seed).")
@click.option("--hold", default="0.5:1.5", show_default=True, callback=lambda c, p, v: _seconds_range(v, "--hold"),
              help="Seconds each fault lasts, MIN:MAX.")
@click.option("--keep-data", is_flag=True, help="Keep node data directories even if the run passes.")
@output_option
@handle_errors
def chaos_run(scenario, duration, seed, out_dir, brokers, block_rate, pid_managers, pid_rate, interval, hold,
              keep_data, output):
    """Run a three-node quorum under faults, record every operation, check the history."""
    from chaos.runner import RunConfig
    from chaos.runner import run as chaos_run_
    from chaos.workload import WorkloadConfig

    out_dir = out_dir or f"chaos-{scenario}-{seed}"
    cfg = RunConfig(scenario=scenario, duration_s=duration, seed=seed, out_dir=out_dir, keep_data=keep_data,
                    interval_s=interval, hold_s=hold,
                    workload=WorkloadConfig(brokers=brokers, block_rate=block_rate, pid_managers=pid_managers,
                                            pid_rate=pid_rate))
    with render.progress(f"chaos {scenario}") as update:
        verdict = asyncio.run(chaos_run_(cfg, update))
    _show_verdict(verdict, output, out_dir)


@chaos.command("check")
@click.argument("run_dir", type=click.Path())
@click.option("--allow-torn", is_flag=True,
              help="Drop a torn last history line (a copy of a running or crashed run) instead of refusing.")
@output_option
@handle_errors
def chaos_check(run_dir, allow_torn, output):
    """Re-check a saved run directory offline."""
    from chaos.runner import check_dir

    _show_verdict(check_dir(run_dir, write=False, allow_torn_tail=allow_torn), output, run_dir)


@chaos.command("simulate")
@click.option("--seeds", required=True, help="Seeds to run: A..B (inclusive), A, or A,B,C.")
@click.option("--steps", type=click.IntRange(100, 10_000_000), default=6000, show_default=True,
              help="Simulated events per seed (then the faults stop and the cluster must converge).")
@click.option("--nodes", type=click.Choice(["3", "5"]), default="3", show_default=True)
@click.option("--jobs", type=click.IntRange(1, 256), default=None,
              help="Worker processes (default: one per CPU).")
@click.option("--trace", is_flag=True, help="Print the last events of every failing seed.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Also write the figures as JSON here.")
@output_option
@handle_errors
def chaos_simulate(seeds, steps, nodes, jobs, trace, json_path, output):
    """Deterministic simulation of a whole quorum: the real node code on a simulated network, disks and
    clock, faults mixed by each seed; Raft's safety properties and no re-issued producer ID checked after
    every step.  A seed replays bit for bit.  Exit 5 if any seed finds a violation."""
    from chaos.sim.campaign import parse_seeds, run_campaign

    try:
        seed_list = parse_seeds(seeds)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--seeds") from None
    with render.progress(f"simulating {len(seed_list)} seed(s)") as update:
        def progress(done, total, result):
            update(done / total, f"seed {result.seed}: {'ok' if result.ok else 'VIOLATION'}")
        result = run_campaign(seed_list, steps, int(nodes), jobs, progress)
    if _figures(result.to_dict(), json_path, output):
        rates = result.rates()
        render.table("simulation", ["figure", "value"], [
            ["seeds", result.seeds], ["failed", len(result.failures)], ["nodes", nodes],
            ["simulated events", f"{result.steps:,}"], ["faults injected", f"{result.faults:,}"],
            ["messages", f"{result.messages:,}"], ["acknowledged requests", f"{result.acked:,}"],
            ["simulated hours", f"{result.sim_seconds / 3600:.2f}"],
            ["wall seconds", f"{result.wall_seconds:.1f} ({result.jobs} worker(s))"],
            ["events per wall minute", f"{rates['simulated_ops_per_wall_minute']:,}"],
            ["faults per wall minute", f"{rates['faults_per_wall_minute']:,}"],
            ["simulated hours per wall minute", rates["simulated_hours_per_wall_minute"]]])
        render.table("faults by kind", ["fault", "count"], sorted(result.faults_by_kind.items()))
        for f in result.failures:
            render.error(f"seed {f.seed}, step {f.step}: {f.violation}")
            render.line(f"  replay: {f.replay}")
            if trace:
                for event in f.trace:
                    render.line(f"    {event}")
    if result.failures:
        sys.exit(EXIT_ANOMALY)


@chaos.command("crash-states")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the scripted workload.")
@click.option("--steps", type=click.IntRange(500, 1_000_000), default=3000, show_default=True,
              help="Simulated events of the workload.")
@click.option("--node", "nodes", multiple=True, type=click.IntRange(1, 3),
              help="Node whose disk is cut (repeat; default: each of the three).")
@click.option("--max-ops", type=click.IntRange(1, 1_000_000), default=None,
              help="Cut at most this many file operations per node, spread evenly (default: every one).")
@click.option("--around", default=None,
              help="Only cut near operations on files whose name contains this (e.g. raft.snapshot: the windows "
                   "of compactions and installs).")
@click.option("--after-steps", type=click.IntRange(100, 1_000_000), default=1500, show_default=True,
              help="Simulated events run after each cut, before the cluster must converge.")
@click.option("--jobs", type=click.IntRange(1, 256), default=None, help="Crash states run at once (default: CPUs).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Also write the figures as JSON here.")
@output_option
@handle_errors
def chaos_crash_states(seed, steps, nodes, max_ops, around, after_steps, jobs, json_path, output):
    """Every crash state of a node's disk (ALICE): before each file operation of a scripted workload
    (compaction, a snapshot install, identity writes), each state POSIX allows a power loss to leave is
    started inside the running three-node cluster and checked.  Exit 5 if any loses a committed entry,
    re-issues a block or cannot start."""
    from chaos.sim.explore import explore

    with render.progress("crash states") as update:
        def progress(result):
            update(0.0, f"{result.states} states, {len(result.failures)} failing")
        result = explore(seed, steps, list(nodes) or None, after_steps, jobs, max_ops, progress, around)
        update(1.0, f"{result.states} states")
    if _figures(result.to_dict(), json_path, output):
        render.table("crash states", ["node", "file operations cut", "crash states", "failing"],
                     [[n, c["ops"], c["states"], c["failed"]] for n, c in sorted(result.by_node.items())]
                     + [["all", result.ops, result.states, len(result.failures)]])
        render.line(f"{result.wall_seconds:.1f} s; workload: seed {seed}, {steps} events"
                    + ("" if result.recording_ok else f"; the uncut run failed: {result.recording_violation}"))
        for f in result.failures:
            render.error(f"node {f.node}, power lost before {f.op} ({f.state}): {f.violation}")
    if result.failures or not result.recording_ok:
        sys.exit(EXIT_ANOMALY)


def _figures(figures: dict, json_path: str | None, output: str) -> bool:
    """Write ``figures`` to ``json_path`` (if given) and print them as JSON if asked; True if the caller
    should render its tables instead."""
    if json_path:
        from storage.files import atomic_write

        atomic_write(json_path, (json.dumps(figures, indent=1, default=str) + "\n").encode())
    if output == "json":
        render.emit_json(figures)
        return False
    return True


def _show_verdict(verdict, output: str, run_dir: str) -> None:
    from chaos.report import render_summary

    if output == "json":
        render.emit_json(verdict.to_dict())
    else:
        render_summary(verdict, render.console())
        render.line(f"run directory: {run_dir}")
    if not verdict.valid:
        sys.exit(EXIT_ANOMALY)


# -------------------------------------------------------------------- audit
@cli.group()
def audit():
    """The audit pipeline: audit trails and chaos histories as Parquet, checked on Spark."""


@audit.command("export")
@click.option("--from", "src", required=True, type=click.Path(),
              help="A local cluster, a node data directory, a chaos run directory, or a directory holding them.")
@click.option("--to", "dest", required=True, type=click.Path(),
              help="Output directory (new or empty): records/, gaps/, chaos/ and manifest.json.")
@click.option("--force", is_flag=True, help="Allow a non-empty --to; a previous export there is replaced.")
@output_option
@handle_errors
def audit_export(src, dest, force, output):
    """Convert audit trails (msgpack) and chaos histories to typed Parquet for `pidctl audit run`."""
    import time

    from audit.export import export

    t0 = time.monotonic()
    manifest = export(src, dest, force=force)
    elapsed = time.monotonic() - t0
    rows = sum(t["rows"] for t in manifest["tables"].values())
    for s in manifest["sources"]:
        if s["counts"].get("torn_tail_bytes"):
            render.warn(f"{s['path']}: an audit trail ends in a torn line ({s['counts']['torn_tail_bytes']} bytes, "
                        "not exported): a node crashed mid-append or is still running")
    if output == "json":
        render.emit_json({**manifest, "rows": rows, "elapsed_s": round(elapsed, 3)})
        return
    render.table(f"audit export to {dest}", ["source", "kind", "nodes", "audit lines", "gaps", "history ops",
                                              "allocate ok", "generate ok"],
                 [[s["name"], s["kind"], s["counts"].get("nodes"), s["counts"].get("audit_lines"),
                   s["counts"].get("gaps"), s["counts"].get("history_ops"), s["counts"].get("allocate_ok"),
                   s["counts"].get("generate_ok")] for s in manifest["sources"]])
    render.line(f"{len(manifest['tables'])} files, {rows} rows in {elapsed:.1f}s "
                f"({rows / max(elapsed, 1e-9):,.0f} rows/s); manifest {os.path.join(dest, 'manifest.json')}")


@audit.command("run")
@click.option("--input", "input_dir", required=True, type=click.Path(), help="An export of `pidctl audit export`.")
@click.option("--master", default="local[*]", show_default=True,
              help="Spark master: local[N] (embedded in this process) or spark://HOST:PORT.")
@click.option("--out", "out_dir", default="audit-report", show_default=True, type=click.Path(file_okay=False),
              help="Where audit.json and the PNG charts go.")
@click.option("--window-ms", type=click.IntRange(1000), default=60_000, show_default=True,
              help="Time window of the per-broker allocation rates.")
@click.option("--examples", type=click.IntRange(1, 10_000), default=10, show_default=True,
              help="Findings listed per check (every check also counts all of them).")
@click.option("--per-source", is_flag=True,
              help="Compare blocks only within each exported source (an export of several unrelated "
                   "clusters); by default all cluster and node sources are one ID space.")
@output_option
def audit_run(input_dir, master, out_dir, window_ms, examples, per_source, output):
    """Check the whole exported history on Spark: overlaps, duplicate PIDs, migration boundary, gaps,
    per-broker rates and restart loops, ID-space projection.  Exit 0 clean, 5 on violations, 1 on bad input."""
    from audit.job import AuditInputError, run_audit
    from audit.report import render_summary
    from audit.spark import SparkSetupError

    try:
        report = run_audit(input_dir, master=master, out_dir=out_dir, window_ms=window_ms, examples=examples,
                           id_spaces="source" if per_source else "cluster")
    except (AuditInputError, SparkSetupError) as e:
        render.error(str(e))
        sys.exit(EXIT_ERROR)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    if output == "json":
        render.emit_json(report)
    else:
        render_summary(report, render.console())
        render.line(f"report: {os.path.join(out_dir, 'audit.json')}")
    if not report["valid"]:
        sys.exit(EXIT_ANOMALY)


@cli.command("demo")
@click.option("--blocks", "count", type=click.IntRange(1, 1000), default=3, show_default=True,
              help="Blocks per broker.")
@click.pass_context
def demo(ctx, count):
    """Start the local cluster, register two brokers, allocate blocks, show the quorum."""
    obj: Ctx = ctx.obj
    ctx.invoke(cluster_up)

    async def go(client):
        epochs = {b: await client.register_broker(b) for b in (1, 2)}
        rows = []
        for _ in range(count):
            for b, e in epochs.items():
                blk = await client.allocate(b, e)
                rows.append([b, e, blk.start, blk.next_id, blk.length, blk.node])
        return epochs, rows

    epochs, rows = handle_errors(lambda: asyncio.run(run(go)(obj.client())))()
    render.line(f"registered brokers: {', '.join(f'{b} (epoch {e})' for b, e in epochs.items())}")
    render.table("allocated blocks", ["broker", "epoch", "start", "end (excl.)", "len", "via node"], rows)
    ctx.invoke(quorum_status, output="table")
    render.line(f"stop it with: pidctl --data-dir {obj.data_dir} cluster down")


@cli.command("bench")
@click.option("--systems", default="pidquorum,zookeeper,etcd", show_default=True,
              help="Comma-separated systems to compare (pidquorum, zookeeper, etcd).")
@click.option("--duration", type=click.FloatRange(0.5, 3600), default=10.0, show_default=True,
              help="Seconds per throughput scenario (workloads 1, 2 and 4).")
@click.option("--out", "out_dir", default="bench-results", show_default=True, type=click.Path(file_okay=False),
              help="Where bench.json and bench.png go.")
@click.option("--kills", type=click.IntRange(1, 100), default=5, show_default=True,
              help="Leader kills per system in workload 3.")
@click.option("--history", type=click.IntRange(11, 100_000_000), default=1_000_000, show_default=True,
              help="Large history for workload 5 (allocations).")
@click.option("--fill-cap", type=click.FloatRange(1, 36000), default=600.0, show_default=True,
              help="Cap on filling the large history, seconds (the output says when it was not reached).")
@click.option("--workloads", default="1,2,3,4,5", show_default=True, help="Comma-separated subset of 1-5.")
@click.option("--manager-rate", type=click.FloatRange(1, 10_000_000), default=20_000.0, show_default=True,
              help="IDs/s asked of the broker's ProducerIdManager in workload 4.")
@click.option("--install-peers", is_flag=True, help="apt-get install the missing peers' Debian packages first.")
@click.option("--keep", is_flag=True, help="Keep the clusters' directories.")
@click.option("--reserve-blocks", type=click.IntRange(0, 1024), default=32, show_default=True,
              help="pidquorum's allocate_reserve_blocks (leader-side reserve; 0 = the node default, off).")
@handle_errors
def bench(systems, duration, out_dir, kills, history, fill_cap, workloads, manager_rate, install_peers, keep,
          reserve_blocks):
    """Benchmark pidquorum against ZooKeeper and etcd (three-node clusters on loopback), in one run."""
    from benchmarks.run import BenchOptions, render_table, run_bench
    from benchmarks.systems import SYSTEMS

    names = [x.strip() for x in systems.split(",") if x.strip()]
    unknown = [x for x in names if x not in SYSTEMS]
    if unknown or not names:
        raise click.UsageError(f"--systems: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(SYSTEMS)}")
    try:
        wl = sorted({int(x) for x in workloads.split(",") if x.strip()})
    except ValueError:
        wl = []
    if not wl or any(not 1 <= x <= 5 for x in wl):
        raise click.UsageError(f"--workloads: expected numbers 1-5, got {workloads!r}")
    opts = BenchOptions(systems=names, duration=duration, out_dir=out_dir, kills=kills, history=history,
                        fill_cap=fill_cap, workloads=wl, manager_rate=manager_rate, install_peers=install_peers,
                        keep=keep, reserve_blocks=reserve_blocks)
    res = run_bench(opts)  # progress on stderr
    click.echo(render_table(res))
    if res["errors"]:
        sys.exit(EXIT_ERROR)


from .security_cmds import register as _register_security_commands  # noqa: E402

_register_security_commands(cli, handle_errors=handle_errors, output_option=output_option, run=run)


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(EXIT_INTERRUPTED)
    except click.UsageError as e:
        e.show()
        sys.exit(EXIT_USAGE)
    except click.ClickException as e:
        e.show()
        sys.exit(EXIT_ERROR)
    except SystemExit:
        raise


if __name__ == "__main__":
    main()
