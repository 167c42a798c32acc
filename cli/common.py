"""What every ``pidctl`` command shares: exit codes, options, the context, error handling."""
from __future__ import annotations

import functools
import sys

import click

from client.quorum import QuorumClient, RetryPolicy
from quorum.localcluster import ClusterError, LocalCluster
from security.acl import AclError
from security.credentials import CredentialsError
from security.tls import TlsConfigError
from settings import ConfigError
from storage.disk import CorruptFileError
from wire.errors import Errors, PidQuorumError

from . import render

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_REFUSED, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
EXIT_ANOMALY = 5  # a checker found a violation
EXIT_DEGRADED = 6  # pidctl quorum status: serving, but a node is down, recovering or without a leader

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
        from chaos.history import HistoryError  # heavy (beside chaos.runner): imported when used
        from chaos.runner import RunError  # heavy (kazoo, for the nodes it starts): imported when used
        out += [HistoryError, RunError]
    except ImportError:  # pragma: no cover - chaos not installed
        pass
    try:
        from migration.zk import ZkMigrationError  # heavy (kazoo): imported when used
        out.append(ZkMigrationError)
    except ImportError:  # pragma: no cover
        pass
    return tuple(out)


def _audit_errors() -> tuple[type[Exception], ...]:
    """The audit pipeline's user-facing errors (imported lazily: pyarrow is heavy)."""
    out: list[type[Exception]] = []
    try:
        from audit.export import ExportError  # heavy (pyarrow): imported when used
        out.append(ExportError)
    except ImportError:  # pragma: no cover - audit not installed
        pass
    return tuple(out)


def _security_errors() -> tuple[type[Exception], ...]:
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


async def gather_status(obj: Ctx) -> list[dict]:
    """DescribeState of every node (a node that does not answer: its error), with each one's apply lag."""
    client = obj.client()
    addresses = obj.addresses()
    out = []
    try:
        answers = await client.describe_each(addresses)
    finally:
        await client.close()
    for i, a in enumerate(addresses):
        d = answers[a]
        if isinstance(d, Exception):  # report the node as down
            out.append({"node_id": i + 1, "client_address": a, "error": str(d) or type(d).__name__})
        else:
            d = dict(d)
            d.pop("error_code", None)
            out.append(d)
    commit = max((n["raft"]["commit_index"] for n in out if "raft" in n), default=0)
    for n in out:
        if "raft" in n:
            n["lag"] = commit - n["raft"]["last_applied"]
    return out


def quorum_health(nodes: list[dict]) -> tuple[int, str]:
    """(exit code, one line) for ``gather_status``'s answers, as ``etcdctl endpoint health`` does:
    EXIT_OK when every node answered, none is recovering and all name the same leader, which answered as
    leader; EXIT_DEGRADED when a majority answered and names that leader but some node is down, recovering
    or names another; EXIT_UNAVAILABLE when no majority of the nodes answered or they agree on no leader."""
    up = [n for n in nodes if "raft" in n]
    down = [n for n in nodes if "raft" not in n]
    leaders = {n["raft"]["self"] for n in up if n["raft"]["state"] == "leader"}
    majority = len(nodes) // 2 + 1
    if len(up) < majority or len(leaders) != 1:
        why = (f"{len(up)} of {len(nodes)} nodes answered" if len(up) < majority else
               "no leader" if not leaders else f"{len(leaders)} nodes claim to lead")
        return EXIT_UNAVAILABLE, f"unavailable: {why}"
    (leader,) = leaders
    agree = [n for n in up if n["raft"]["leader"] == leader]
    if len(agree) < majority:
        return EXIT_UNAVAILABLE, f"unavailable: only {len(agree)} of {len(nodes)} nodes follow the leader {leader}"
    problems = [f"node {n['node_id']} ({n['client_address']}) is down" for n in down]
    problems += [f"node {n['node_id']} is recovering" for n in up if n["raft"].get("recovering")]
    problems += [f"node {n['node_id']} names leader {n['raft']['leader']}" for n in up
                 if n["raft"]["leader"] != leader and not n["raft"].get("recovering")]
    if problems:
        return EXIT_DEGRADED, "degraded: " + "; ".join(problems)
    return EXIT_OK, f"healthy: {len(nodes)} of {len(nodes)} nodes up, leader {leader}"
