"""Run one quorum node: Raft member + client port, until SIGTERM/SIGINT."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from security.credentials import CredentialsError
from security.tls import TlsConfigError

from .config import NodeConfig
from .errors import CorruptFileError
from .server import QuorumServer
from .service import Service

log = logging.getLogger("pidquorum.node")


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


async def _serve(cfg: NodeConfig, ready_file: str | None) -> None:
    service = Service(cfg)
    server = QuorumServer(service)
    try:
        await server.start()
        if ready_file:
            with open(ready_file, "w") as f:
                f.write(str(os.getpid()))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log.info("node %d up: raft %s, client %s, data %s", cfg.node_id, cfg.raft_address, cfg.client_address,
                 cfg.data_dir)
        await stop.wait()
        log.info("node %d stopping", cfg.node_id)
    finally:
        await server.stop()
        service.close()


def run_node(cfg: NodeConfig, ready_file: str | None = None) -> int:
    """Serve until stopped.  Returns a process exit code."""
    try:
        asyncio.run(_serve(cfg, ready_file))
    except CorruptFileError as e:
        log.critical("refusing to start: %s", e)
        return 66
    except (CredentialsError, TlsConfigError) as e:
        log.critical("refusing to start: %s", e)
        return 78
    except OSError as e:
        log.critical("cannot start: %s", e)
        return 69
    return 0
