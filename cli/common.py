"""What every ``pidctl`` command shares: exit codes, options, the context, error handling."""
from __future__ import annotations

import functools
import math
import sys

import click

from chaos.history import HistoryError
from quorum.client.quorum import ConnectionFailed, QuorumClient, RetryPolicy, unreachable
from quorum.localcluster import ClusterError, LocalCluster
from quorum.security.client import ClientSecurity
from quorum.security.acl import AclError
from quorum.security.credentials import CredentialsError
from quorum.security.tls import TlsConfigError
from quorum.settings import ConfigError
from quorum.settings.flags import secret_parameters
from snapshots.storage.disk import CorruptFileError
from records.wire.errors import Errors, PidQuorumError

from . import render

# pidctl's exit codes; docs/cli.md lists them with a node's and a broker's.
EXIT_OK = 0
EXIT_ERROR = 1  # an error not listed below: a bad file, no local cluster, a failed command
EXIT_USAGE = 2  # a bad option or value (click's usage errors)
EXIT_UNAVAILABLE = 3  # no node or endpoint answered, no leader, a timeout
EXIT_REFUSED = 4  # the quorum answered with an error (STALE_BROKER_EPOCH, an ACL, ...)
EXIT_ANOMALY = 5  # a checker found a violation
EXIT_DEGRADED = 6  # pidctl quorum status: serving, but a node is down, recovering or without a leader
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT)

INT32_MAX, INT64_MAX = 2**31 - 1, 2**63 - 1
broker_id_option = click.option("--broker-id", type=click.IntRange(0, INT32_MAX), required=True,
                                help=f"0..{INT32_MAX} (int32, as Kafka's broker.id).")

log_format_option = click.option("--log-format", type=click.Choice(["human", "json"]), envvar="PIDQUORUM_LOG_FORMAT",
                                 help="Log lines as text (default) or one JSON object per line.")
output_option = click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table",
                             show_default=True, help="Output format.")


class Addresses(click.ParamType):
    """``host:port,...``: each port 1-65535; the value is the list joined by commas, blanks dropped.
    ``one``: exactly one ``host:port``."""

    def __init__(self, one: bool = False):
        self.one = one
        self.name = "host:port" if one else "host:port,..."

    def convert(self, value, param, ctx):
        addresses = [a.strip() for a in str(value).split(",") if a.strip()]
        if not addresses:
            self.fail(f"no address given ({self.name})", param, ctx)
        if self.one and len(addresses) > 1:
            self.fail(f"{value!r} is more than one address (host:port)", param, ctx)
        for a in addresses:
            host, sep, port = a.rpartition(":")
            if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
                self.fail(f"{a!r} is not host:port (a port 1-65535)", param, ctx)
        return ",".join(addresses)


class Seconds(click.ParamType):
    """A finite number of seconds above 0."""

    name = "seconds"

    def convert(self, value, param, ctx):
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or seconds <= 0:
            self.fail(f"{value!r} is not a number of seconds above 0", param, ctx)
        return seconds


def client_security(security_protocol: str = "PLAINTEXT", sasl_mechanism: str = "PLAIN",
                    sasl_username: str | None = None, sasl_password: str | None = None,
                    tls_cafile: str | None = None) -> ClientSecurity | None:
    """How pidctl reaches the quorum (None: PLAINTEXT); a bad combination is a usage error."""
    if security_protocol == "PLAINTEXT":
        return None
    try:
        security = ClientSecurity(security_protocol, sasl_mechanism, sasl_username, sasl_password, tls_cafile)
        security.ssl_context()  # a CA file that is not one: said now, not as "no node answered" later (cached)
    except (ValueError, TlsConfigError) as e:
        raise click.UsageError(str(e)) from None
    return security


# pidctl's global options: (flags, parameter name, click attributes).  The group takes them before the command
# (with their environment variables and defaults); ``accept_global_options`` lets every command take them after
# it too, where given ones win (``Ctx.override``).
GLOBAL_OPTIONS: list[tuple[tuple[str, ...], str, dict]] = [
    (("--data-dir",), "data_dir", {"envvar": "PIDQUORUM_DIR", "default": ".pidquorum", "show_default": True,
                                   "type": click.Path(file_okay=False),
                                   "help": "Directory of the local cluster (pidctl cluster ...)."}),
    (("--quorum",), "quorum", {"envvar": "PIDQUORUM_QUORUM", "type": Addresses(),
                               "help": "Client addresses host:port,... (default: the local cluster's)."}),
    (("--timeout",), "timeout", {"type": Seconds(), "default": 10.0, "show_default": True,
                                 "help": "Deadline of one call, in seconds (above 0)."}),
    (("--security-protocol",), "security_protocol",
     {"envvar": "PIDQUORUM_SECURITY_PROTOCOL", "default": "PLAINTEXT", "show_default": True,
      "type": click.Choice(["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]),
      "help": "How to reach the quorum (as Kafka's security.protocol)."}),
    (("--sasl-mechanism",), "sasl_mechanism", {"envvar": "PIDQUORUM_SASL_MECHANISM", "default": "PLAIN",
                                               "show_default": True, "type": click.Choice(["PLAIN", "SCRAM-SHA-256"])}),
    (("--sasl-username",), "sasl_username", {"envvar": "PIDQUORUM_SASL_USERNAME",
                                             "help": "SASL user (env PIDQUORUM_SASL_USERNAME)."}),
    (("--tls-cafile",), "tls_cafile",
     {"envvar": "PIDQUORUM_TLS_CAFILE", "type": click.Path(exists=True, dir_okay=False),
      "help": "CA that signed the quorum's certificates (default: the system's trust store)."}),
]
SASL_PASSWORD = ("--sasl-password", "sasl_password", "PIDQUORUM_SASL_PASSWORD", "The SASL password")
GLOBAL_PREFIX = "global_"  # the parameter names of the global options a command takes after it


def global_options(fn):
    """The group's global options (before the command)."""
    option, name, envvar, help = SASL_PASSWORD
    for param in reversed(secret_parameters(option, name, envvar=envvar, help=help)):
        fn.__click_params__ = [*getattr(fn, "__click_params__", []), param]  # as click.option does
    for decls, name, attrs in reversed(GLOBAL_OPTIONS):
        fn = click.option(*decls, name, **attrs)(fn)
    return fn


def accept_global_options(group: click.Group) -> None:
    """Let every command under ``group`` take the global options after its name too (``pidctl quorum status
    --quorum HOST:PORT``); given there, they win over those before it and over the environment.  A command
    with an option of the same name keeps it as its own and takes none of them (``broker start --data-dir`` is
    the broker's); a command that passes its arguments on (``bench NAME ...``) takes none either."""
    for command in group.commands.values():
        if isinstance(command, click.Group):
            accept_global_options(command)
        else:
            _add_global_options(command)


def _after_command_params() -> list[click.Parameter]:
    params: list[click.Parameter] = []
    for decls, name, attrs in GLOBAL_OPTIONS:  # no environment variable, no default: only what is given
        attrs = {k: v for k, v in attrs.items() if k in ("type", "help")}
        params.append(click.Option([*decls, GLOBAL_PREFIX + name], hidden=True, **attrs))
    option, name, _, help = SASL_PASSWORD
    params += secret_parameters(option, GLOBAL_PREFIX + name, envvar=None, help=help, hidden=True)
    return params


def _add_global_options(command: click.Command) -> None:
    if command.callback is None or getattr(command.callback, "_takes_global_options", False):
        return
    params = _after_command_params()
    flags = {f for p in params for f in p.opts}
    own = {f for p in command.params for f in (*p.opts, *getattr(p, "secondary_opts", ()))}
    passes_on = command.context_settings.get("ignore_unknown_options") or \
        any(isinstance(p, click.Argument) and p.type is click.UNPROCESSED for p in command.params)
    if own & flags or passes_on:
        return
    command.params.extend(params)
    callback = command.callback

    @functools.wraps(callback)
    def with_global_options(*args, **kwargs):
        given = {name[len(GLOBAL_PREFIX):]: kwargs.pop(name) for name in list(kwargs) if name.startswith(GLOBAL_PREFIX)}
        given = {name: value for name, value in given.items() if value is not None}
        obj = click.get_current_context().find_object(Ctx)
        if given and obj is not None:
            obj.override(**given)
        return callback(*args, **kwargs)

    with_global_options._takes_global_options = True
    command.callback = with_global_options


class Ctx:
    def __init__(self, data_dir: str, quorum: str | None, timeout: float, security=None,
                 security_options: dict | None = None):
        self.data_dir = data_dir
        self.quorum = quorum
        self.timeout = timeout
        self.security = security  # quorum.security.client.ClientSecurity, None: PLAINTEXT
        self.security_options = dict(security_options or {})  # client_security's arguments that made it

    def override(self, **given) -> None:
        """Global options given after the command (``accept_global_options``): they win."""
        for name in ("data_dir", "quorum", "timeout"):
            if name in given:
                setattr(self, name, given.pop(name))
        if "sasl_password_file" in given:  # the file's text (quorum.settings.flags.secret_parameters)
            given["sasl_password"] = given.pop("sasl_password_file")
        if given:
            self.security_options.update(given)
            self.security = client_security(**self.security_options)

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
    """The chaos runner's and the migration's user-facing errors (imported when an error is handled: both
    modules load kazoo)."""
    out: list[type[Exception]] = [HistoryError]
    try:
        from chaos.runner import RunError  # heavy (kazoo, for the nodes it starts): imported when used
        out.append(RunError)
    except ImportError:  # pragma: no cover - kazoo missing
        pass
    try:
        from quorum.migration.zk import ZkMigrationError  # heavy (kazoo): imported when used
        out.append(ZkMigrationError)
    except ImportError:  # pragma: no cover
        pass
    return tuple(out)


def _audit_errors() -> tuple[type[Exception], ...]:
    """The audit pipeline's user-facing errors (imported lazily: pyarrow is heavy)."""
    out: list[type[Exception]] = []
    try:
        from chaos.audit.export import ExportError  # heavy (pyarrow): imported when used
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
        except ConnectionFailed as e:  # a node that cannot be reached (a TLS failure no retry cures, ...)
            render.error(str(e))
            sys.exit(EXIT_UNAVAILABLE)
        except OSError as e:  # a path that is not what it should be (--data-dir a file, no permission, ...)
            where = f"{e.filename}: " if e.filename else ""
            render.error(f"{where}{e.strerror or e}")
            sys.exit(EXIT_UNAVAILABLE if isinstance(e, (ConnectionError, TimeoutError)) else EXIT_ERROR)
    return wrapper


def pidctl_command(fn):
    """The wrapping most commands share, in this order: ``-o/--output``, the context (``Ctx``) as the first
    argument, and ``handle_errors``."""
    return output_option(click.pass_obj(handle_errors(fn)))


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
        if not up:  # say why: each node's error, the same ones named together
            why = unreachable(why, {n["client_address"]: n.get("error", "") for n in down})
        return EXIT_UNAVAILABLE, f"unavailable: {why}"
    (leader,) = leaders
    row = next(n for n in up if n["raft"]["self"] == leader)
    named = f"node {row['node_id']} ({row['client_address']}, Raft {leader})"  # the table lists client addresses
    agree = [n for n in up if n["raft"]["leader"] == leader]
    if len(agree) < majority:
        return EXIT_UNAVAILABLE, f"unavailable: only {len(agree)} of {len(nodes)} nodes follow the leader {named}"
    problems = [f"node {n['node_id']} ({n['client_address']}) is down" for n in down]
    problems += [f"node {n['node_id']} is recovering" for n in up if n["raft"].get("recovering")]
    problems += [f"node {n['node_id']} names leader {n['raft']['leader']}" for n in up
                 if n["raft"]["leader"] != leader and not n["raft"].get("recovering")]
    if problems:
        return EXIT_DEGRADED, "degraded: " + "; ".join(problems)
    return EXIT_OK, f"healthy: {len(nodes)} of {len(nodes)} nodes up, leader {named}"
