"""The open descriptors of segment files, shared by every log of a broker and bounded (least recently used closed
first); an operation pins the descriptor it uses so that it is never closed under it."""
from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator

# The partition log's logger: every line about a partition's files is under one name.
log = logging.getLogger("broker.log")


class _OpenFile:
    __slots__ = ("fd", "pins", "forgotten")

    def __init__(self, fd: int):
        self.fd = fd
        self.pins = 0
        self.forgotten = False


class SegmentFiles:
    """Open segment descriptors, least recently used closed first: at most ``max_open`` (None: no bound)
    that are not in use.  Thread-safe; shared by the logs of one broker.

    ``use(path)`` opens (or reuses) the file and pins its descriptor until the
    ``with`` block ends: a pinned descriptor is never closed, so the bound is
    exceeded by the descriptors pinned at a moment, not more.  ``forget(path)``
    closes it (before the file is deleted, or when its log closes).
    """

    def __init__(self, max_open: int | None = None):
        if max_open is not None and max_open < 1:
            raise ValueError("max_open must be at least 1")
        self.max_open = max_open
        self._lock = threading.Lock()
        self._files: OrderedDict[str, _OpenFile] = OrderedDict()  # least recently used first
        self._forgotten_pinned = 0
        self.stats = {"opens": 0, "evictions": 0}

    @property
    def open_count(self) -> int:
        """Descriptors open now (pinned ones included)."""
        with self._lock:
            return len(self._files) + self._forgotten_pinned

    @contextlib.contextmanager
    def use(self, path: str) -> Iterator[int]:
        """The descriptor of ``path`` (opened O_RDWR if it is not open), pinned until the block ends."""
        with self._lock:
            entry = self._files.get(path)
            if entry is None:
                entry = _OpenFile(os.open(path, os.O_RDWR))
                self._files[path] = entry
                self.stats["opens"] += 1
            else:
                self._files.move_to_end(path)
            entry.pins += 1
            self._evict()
        try:
            yield entry.fd
        finally:
            with self._lock:
                entry.pins -= 1
                if entry.forgotten:
                    if not entry.pins:
                        self._forgotten_pinned -= 1
                        self._close(path, entry)
                else:
                    self._evict()

    def create(self, path: str) -> None:
        """Create ``path``, which must not exist, and keep its descriptor as the most recently used."""
        with self._lock:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            self._drop(path)  # a descriptor of an older file of that name (a log that was not closed)
            self._files[path] = _OpenFile(fd)
            self.stats["opens"] += 1
            self._evict()

    def forget(self, path: str) -> None:
        """Close the descriptor of ``path`` if open (a pinned one when its last user is done)."""
        with self._lock:
            self._drop(path)

    # under self._lock
    def _drop(self, path: str) -> None:
        entry = self._files.pop(path, None)
        if entry is None:
            return
        if entry.pins:
            entry.forgotten = True
            self._forgotten_pinned += 1
        else:
            self._close(path, entry)

    def _evict(self) -> None:
        if self.max_open is None:
            return
        excess = len(self._files) - self.max_open
        if excess <= 0:
            return
        victims = []
        for path, entry in self._files.items():
            if not entry.pins:
                victims.append(path)
                if len(victims) == excess:
                    break
        for path in victims:
            self._close(path, self._files.pop(path))
            self.stats["evictions"] += 1

    @staticmethod
    def _close(path: str, entry: _OpenFile) -> None:
        try:
            os.close(entry.fd)
        except OSError as e:  # the data was fsync'd through this descriptor already; nothing is lost
            log.warning("closing %s failed: %s", path, e)
