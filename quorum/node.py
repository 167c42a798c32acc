"""Run one quorum node: Raft member + client port, until SIGTERM/SIGINT."""
from __future__ import annotations

import asyncio
import logging
import os
import sys

from quorum.security.credentials import CredentialsError
from quorum.security.tls import TlsConfigError
from snapshots.storage.disk import EXIT_CORRUPT, EXIT_IDENTITY_REFUSED, EXIT_UNAVAILABLE, CorruptFileError, Disk
from snapshots.storage.lock import DirectoryLockedError, lock_directory
from quorum.telemetry import logs
from quorum.telemetry.metrics import serve_metrics
from records.wire.listen import bind_error, until_stopped

from .config import NodeConfig
from .identity import IdentityError
from .metrics import quorum_families
from .server import QuorumServer
from .producer_ids import ZooKeeperHook
from .service import Service

log = logging.getLogger("pidquorum.node")


def setup_logging(level: str = "INFO", fmt: str = "human") -> None:
    logs.setup_logging(level, fmt, sys.stderr)


async def _serve(cfg: NodeConfig, ready_file: str | None, disk: Disk | None, trust_own_log: bool,
                 zookeeper: ZooKeeperHook | None) -> None:
    logs.set_identity(node_id=cfg.node_id)
    service = Service(cfg, disk, zookeeper=zookeeper, trust_own_log=trust_own_log,
                      loop=asyncio.get_running_loop())  # Raft ticks on this loop (quorum.looppoller)
    logs.set_context_source("term", service.raft.current_term)
    server = QuorumServer(service)
    endpoint = None
    try:
        with bind_error("client port", cfg.client_bind or cfg.client_address):
            await server.start()
        with bind_error("metrics port", f"{cfg.metrics_host}:{cfg.metrics_port}"):
            endpoint = serve_metrics(cfg.metrics_host, cfg.metrics_port, server.status, quorum_families)
        if ready_file:
            with open(ready_file, "w") as f:
                f.write(str(os.getpid()))
        log.info("node %d up: raft %s, client %s, data %s", cfg.node_id, cfg.raft_address, cfg.client_address,
                 cfg.data_dir)
        await until_stopped()
        log.info("node %d stopping", cfg.node_id)
    finally:
        if endpoint is not None:
            endpoint.stop()
        await server.stop()
        logs.set_context_source("term", None)
        service.close()


def run_node(cfg: NodeConfig, ready_file: str | None = None, disk: Disk | None = None,
             trust_own_log: bool = False, zookeeper: ZooKeeperHook | None = None) -> int:
    """Serve until stopped.  Returns a process exit code (``snapshots.storage.disk``: an I/O error on the durable
    path, a diverged log or a refused identity stop the process at once, with their own codes).

    ``trust_own_log``: the operator's word that this data directory is the one the node last ran on (not
    a restored copy), so the node counts without waiting for its peers to vouch (docs/operations.md).
    ``zookeeper``: the hook bridge mode and rollback use (entry points pass ``quorum.migration.bridge``'s).

    Sets the process umask to 077 first: every file and directory the node creates (data, snapshots,
    audit trail, ready file) is its own user's alone (0600 / 0700).

    Holds the data directory's lock (``snapshots.storage.lock``) from before anything in it is read: two nodes on
    one directory would append to one journal and each count the other's acknowledgements as its own, so
    a second one stops at once (exit 69), naming the directory and the pid that holds it."""
    os.umask(0o077)
    try:
        lock = lock_directory(cfg.data_dir)
    except DirectoryLockedError as e:
        log.critical("refusing to start: %s: two nodes must not share a data directory", e)
        return EXIT_UNAVAILABLE
    except OSError as e:
        log.critical("cannot start: the data directory %s: %s", cfg.data_dir, e)
        return EXIT_UNAVAILABLE
    try:
        return _run(cfg, ready_file, disk, trust_own_log, zookeeper)
    finally:
        lock.release()


def _run(cfg: NodeConfig, ready_file: str | None, disk: Disk | None, trust_own_log: bool,
         zookeeper: ZooKeeperHook | None) -> int:
    try:
        asyncio.run(_serve(cfg, ready_file, disk, trust_own_log, zookeeper))
    except CorruptFileError as e:
        log.critical("refusing to start: %s", e)
        return EXIT_CORRUPT
    except (CredentialsError, TlsConfigError) as e:
        log.critical("refusing to start: %s", e)
        return 78
    except IdentityError as e:
        log.critical("refusing to start: %s", e)
        return EXIT_IDENTITY_REFUSED
    except OSError as e:
        log.critical("cannot start: %s", e)
        return EXIT_UNAVAILABLE
    return 0
