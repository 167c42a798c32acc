"""The Prometheus endpoint of a pidquorum process (node or broker), and reading one.

Nothing is counted here.  A collector reads, at each scrape, the status dict
the process already keeps (what DescribeState answers and ``pidctl ... status``
shows) and turns it into metric families (``quorum.metrics``, ``broker.metrics``),
so the endpoint and the CLI always show the same figures.

The status dict is taken on the process's event loop (the scrape runs in
the HTTP server's thread, the figures live on the loop), with a deadline:
a process whose loop is stuck answers the scrape with an error instead of
figures read mid-change.

Each process has its own ``CollectorRegistry`` (never the global one), so
several servers in one test process never mix their figures.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import urllib.error
import urllib.request
from typing import Any, Callable, Iterable

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

SCRAPE_TIMEOUT_S = 5.0


class StatusCollector(Collector):
    """Reads a status dict at each scrape and yields ``families(status)``."""

    def __init__(self, read_status: Callable[[], dict], families: Callable[[dict], Iterable[Any]]):
        self._read = read_status
        self._families = families

    def collect(self) -> Iterable[Any]:
        return list(self._families(self._read()))

    def describe(self) -> Iterable[Any]:
        return []  # figures are read at scrape time only (never at registration)


def on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[[], dict],
            timeout: float = SCRAPE_TIMEOUT_S) -> Callable[[], dict]:
    """A reader that runs ``fn`` on ``loop``'s thread and waits for its result (from another thread)."""
    def read() -> dict:
        fut: concurrent.futures.Future = concurrent.futures.Future()

        def call() -> None:
            if fut.set_running_or_notify_cancel():  # False: the scrape gave up already
                try:
                    fut.set_result(fn())
                except BaseException as e:  # noqa: BLE001 - handed to the scraping thread
                    fut.set_exception(e)

        loop.call_soon_threadsafe(call)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise
    return read


def make_registry(read_status: Callable[[], dict], families: Callable[[dict], Iterable[Any]]) -> CollectorRegistry:
    """A registry of its own: the status collector plus the process's CPU, memory and fds."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(read_status, families))
    ProcessCollector(namespace="pidquorum", registry=registry)
    return registry


class MetricsEndpoint:
    """``GET /metrics`` on ``host:port`` (prometheus_client's threaded HTTP server)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int):
        self.registry, self.host, self.port = registry, host, port
        self._httpd = None
        self._thread: threading.Thread | None = None

    def start(self) -> "MetricsEndpoint":
        self._httpd, self._thread = start_http_server(self.port, addr=self.host, registry=self.registry)
        self.port = self._httpd.server_port
        log.info("metrics on http://%s:%d/metrics", self.host, self.port)
        return self

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None


def serve_metrics(host: str, port: int, read_status: Callable[[], dict],
                  families: Callable[[dict], Iterable[Any]]) -> MetricsEndpoint | None:
    """Start the endpoint (``port`` 0 = off: returns None).  ``read_status`` runs on the caller's loop."""
    if not port:
        return None
    reader = on_loop(asyncio.get_running_loop(), read_status)
    return MetricsEndpoint(make_registry(reader, families), host, port).start()


class MetricsUnavailable(Exception):
    """An endpoint could not be read (refused, timed out, not Prometheus text)."""


def read_metrics(address: str, timeout: float = 5.0) -> dict[str, Any]:
    """Scrape ``http://address/metrics`` and return its ``pidquorum_*`` samples as
    ``{sample name: value}``, or ``{sample name: {label value: value}}`` for a labelled metric
    (labels joined as ``k=v,k=v`` when there are several); process_* and histogram buckets are left out."""
    url = f"http://{address}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            text = resp.read().decode("utf-8")
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise MetricsUnavailable(f"cannot read {url}: {reason}") from None
    out: dict[str, Any] = {}
    try:
        for fam in text_string_to_metric_families(text):
            if not fam.name.startswith("pidquorum_") or fam.name.startswith("pidquorum_process_"):
                continue
            for s in fam.samples:
                if s.name.endswith("_bucket") or s.name.endswith("_created"):
                    continue
                labels = {k: v for k, v in s.labels.items()}
                if not labels:
                    out[s.name] = s.value
                elif len(labels) == 1:
                    out.setdefault(s.name, {})[next(iter(labels.values()))] = s.value
                else:
                    out.setdefault(s.name, {})[",".join(f"{k}={v}" for k, v in sorted(labels.items()))] = s.value
    except ValueError as e:
        raise MetricsUnavailable(f"{url}: not Prometheus text: {e}") from None
    return out
