"""A server process's port and life: a failure to bind as one line naming the port and its address, and
the wait for SIGTERM or SIGINT that ends it."""
from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal


@contextlib.contextmanager
def bind_error(port: str, address: str):
    """An address in use or not local becomes one line naming the port and its address (asyncio's text
    names it as a tuple, prometheus_client's not at all); any other OSError goes on as it is.  The quorum's
    Raft port is quorum.raft's (its transport binds it)."""
    try:
        yield
    except OSError as e:
        if e.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
            raise
        raise OSError(f"cannot bind the {port} {address}: {os.strerror(e.errno)}") from None


async def until_stopped() -> None:
    """Return once the process gets SIGTERM or SIGINT (a clean stop: the caller then closes what it holds)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
