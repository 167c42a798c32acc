"""Binding a server's port: a failure as one line naming the port and its address."""
from __future__ import annotations

import contextlib
import errno
import os


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
