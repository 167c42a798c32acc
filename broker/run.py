"""Run one broker front end until SIGTERM/SIGINT (what ``pidctl broker start`` runs)."""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os

from quorum.client.quorum import HandshakeFailed, QuorumClient, RetryPolicy, unreachable
from quorum.security.credentials import CredentialsError
from quorum.security.tls import TlsConfigError
from snapshots.storage.disk import CorruptFileError
from snapshots.storage.lock import DirectoryLockedError, lock_directory
from quorum.telemetry import logs
from quorum.telemetry.metrics import serve_metrics
from records.wire.errors import PidQuorumError
from records.wire.listen import bind_error, until_stopped

from .config import QUORUM_SETTING_NAMES
from .frontend import BrokerConfig, BrokerServer
from .metrics import broker_families

log = logging.getLogger("pidquorum.broker")

EXIT_CORRUPT, EXIT_UNAVAILABLE, EXIT_OS, EXIT_CONFIG = 66, 69, 71, 78


class QuorumSettingsError(Exception):
    """No quorum node can be reached with the broker's ``[quorum_security]``, and trying again cannot help."""


async def check_quorum(cfg: BrokerConfig) -> None:
    """Ask every quorum node once (ApiVersions, through the TLS handshake and SASL of ``[quorum_security]``)
    before serving.  When every node refuses for a reason another try cannot cure (its certificate not
    trusted, TLS on one end only, SASL credentials refused), raise ``QuorumSettingsError`` naming each
    node's reason: the broker would otherwise try for ``start_timeout_s`` and stop without saying why.  When
    some node answers, or the failures may pass (nodes down or restarting), go on: the producer-ID manager
    tries until its start timeout, logging each failure."""
    client = QuorumClient(list(cfg.quorum), RetryPolicy(timeout=cfg.quorum_timeout_s,
                                                        attempt_timeout=min(2.0, cfg.quorum_timeout_s)),
                          client_id=f"broker-{cfg.broker_id}", security=cfg.quorum_security, names=QUORUM_SETTING_NAMES)
    try:
        answers = await client.probe()
    finally:
        await client.close()
    errors = {a: e for a, e in answers.items() if e is not None}
    if len(errors) < len(answers):
        return
    line = unreachable("no quorum node answered", {a: str(e) for a, e in errors.items()})
    if all(isinstance(e, HandshakeFailed) or (isinstance(e, PidQuorumError) and not e.retriable)
           for e in errors.values()):
        raise QuorumSettingsError(line)
    log.warning("broker %d: %s (trying again)", cfg.broker_id, line)


async def _serve(cfg: BrokerConfig, ready_file: str | None) -> None:
    await check_quorum(cfg)
    server = BrokerServer(cfg)
    server.quorum.names = QUORUM_SETTING_NAMES  # its errors name the broker's settings, not pidctl's flags
    logs.set_context_source("broker_epoch", lambda: server.pids.broker_epoch if server.pids is not None else None)
    endpoint = None
    try:
        with bind_error("Kafka port", cfg.listen):
            await server.start()
        with bind_error("metrics port", f"{cfg.metrics_host}:{cfg.metrics_port}"):
            endpoint = serve_metrics(cfg.metrics_host, cfg.metrics_port, server.status, broker_families)
        if ready_file:
            tmp = f"{ready_file}.tmp"
            with open(tmp, "w") as f:
                f.write(f"{os.getpid()} {server.port}\n")
            os.replace(tmp, ready_file)
        await until_stopped()
        log.info("broker %d stopping", cfg.broker_id)
    finally:
        if endpoint is not None:
            endpoint.stop()
        await server.stop()
        logs.set_context_source("broker_epoch", None)


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 256 * 1024


def fixed_mmap_threshold() -> bool:
    """Have glibc serve every allocation of 256 KiB or more with its own mmap, returned to the system when
    freed.  By default glibc raises that threshold (up to 32 MiB) each time such a block is freed, so the
    producer state's arrays and the snapshot thread's buffers, once freed, come back from the heap and
    the process keeps their pages: a broker that built a million producers' state held three times the
    state's size.  Not glibc (musl, macOS): nothing to do."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):
        return False


def run_broker(cfg: BrokerConfig, ready_file: str | None = None) -> int:
    """Serve until stopped.  Returns a process exit code.

    Holds the data directory's lock (``snapshots.storage.lock``) from before anything in it is read: a second broker
    on the same directory stops at once (EXIT_OS), naming the directory and the pid that holds it.  Refuses
    to start (EXIT_CONFIG) when no quorum node can be reached with ``[quorum_security]`` (``check_quorum``).

    Sets the process umask to 077 first: every file and directory the broker creates (partitions,
    snapshots, topic metadata, ready file) is its own user's alone (0600 / 0700)."""
    os.umask(0o077)
    fixed_mmap_threshold()
    logs.set_identity(broker_id=cfg.broker_id)
    try:
        lock = lock_directory(cfg.data_dir)  # before anything in it is read or written; held until the end
    except DirectoryLockedError as e:
        log.critical("refusing to start: %s: two brokers must not share a data directory", e)
        return EXIT_OS
    except OSError as e:
        log.critical("cannot start: the data directory %s: %s", cfg.data_dir, e)
        return EXIT_OS
    try:
        asyncio.run(_serve(cfg, ready_file))
    except QuorumSettingsError as e:
        log.critical("refusing to start: %s", e)
        return EXIT_CONFIG
    except CorruptFileError as e:
        log.critical("refusing to start: %s", e)
        return EXIT_CORRUPT
    except PidQuorumError as e:
        log.critical("cannot start: %s: %s", e.code.name, e.message)
        return EXIT_UNAVAILABLE
    except OSError as e:
        log.critical("cannot start: %s", e)
        return EXIT_OS
    except (CredentialsError, TlsConfigError) as e:
        log.critical("refusing to start: %s", e)
        return EXIT_CONFIG
    finally:
        lock.release()
    return 0
