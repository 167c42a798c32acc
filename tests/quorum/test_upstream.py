"""pysyncobj is pinned, and what pidquorum replaces or relies on of it is what the pinned version holds.

``quorum/raft/upstream.py`` is the one module that imports pysyncobj or names its internals.  These
tests fail when an upstream function it overrides or calls changed (an upgrade must re-read it), when
the installed version is not the pinned one, and when any other module reaches a private name.
"""
from __future__ import annotations

import configparser
import importlib.metadata
import inspect
import os
import pathlib
import re

import pysyncobj.syncobj
import pysyncobj.tcp_connection
import pysyncobj.transport
import pytest

from quorum.raft import upstream

ROOT = pathlib.Path(__file__).resolve().parents[2]
UPSTREAM = ROOT / "quorum" / "raft" / "upstream.py"


def _python_files():
    for top in sorted(ROOT.iterdir()):
        if top.name.startswith(".") or top.name in ("build", "dist") or not top.is_dir():
            continue
        yield from (p for p in top.rglob("*.py") if ".venv" not in p.parts and "site-packages" not in p.parts)


def _lines_outside_upstream():
    """(path, line number, line) of every line of every Python file but upstream.py and this one."""
    for path in _python_files():
        if path == UPSTREAM or path == pathlib.Path(__file__).resolve():
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            yield path, n, line


@pytest.mark.parametrize("table", ["OVERRIDDEN", "USED"])
def test_every_upstream_function_pidquorum_replaces_or_relies_on_is_the_pinned_source(table):
    changed = [f"{name} (digest {upstream.source_digest(fn)}, pinned {digest})"
               for name, (fn, digest) in getattr(upstream, table).items() if upstream.source_digest(fn) != digest]
    assert not changed, (f"pysyncobj {upstream.VERSION}: these functions differ from pysyncobj {upstream.PINNED}'s; "
                         f"re-read each against quorum/raft/upstream.py's table before updating its digest: "
                         + "; ".join(changed))


def test_a_changed_upstream_function_is_named(monkeypatch):
    """The check above can fail: an upstream function whose source differs is reported by name."""
    def other(self, node, message):  # not pysyncobj's __onMessageReceived
        return None
    row = upstream.OVERRIDDEN["SyncObj.__onMessageReceived"]
    monkeypatch.setitem(upstream.OVERRIDDEN, "SyncObj.__onMessageReceived", (other, row[1]))
    with pytest.raises(AssertionError, match=r"SyncObj.__onMessageReceived \(digest"):
        test_every_upstream_function_pidquorum_replaces_or_relies_on_is_the_pinned_source("OVERRIDDEN")


def test_the_installed_pysyncobj_is_the_pinned_one_and_setup_cfg_pins_exactly_it():
    assert importlib.metadata.version("pysyncobj") == upstream.PINNED
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    requires = [r.strip() for r in cfg["options"]["install_requires"].splitlines()]
    assert f"pysyncobj=={upstream.PINNED}" in requires


def test_no_module_but_upstream_names_a_mangled_pysyncobj_name():
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path, n, line in _lines_outside_upstream()
             if re.search(r"_(SyncObj|PipeNotifier|TcpConnection|TCPTransport)__\w", line)]
    assert not found, "\n".join(found)


def _upstream_private_names() -> set[str]:
    names = set()
    for cls in (pysyncobj.syncobj.SyncObj, pysyncobj.transport.Transport, pysyncobj.transport.TCPTransport,
                pysyncobj.tcp_connection.TcpConnection):
        names |= {n for n in vars(cls) if n.startswith("_") and not n.startswith("__")}
        names |= set(re.findall(r"self\.(_[A-Za-z]\w*)\s*=", inspect.getsource(cls)))
    return names


def test_the_raft_package_reaches_pysyncobj_internals_through_upstream_only():
    """In quorum/raft/ only upstream.py names a private attribute or method of pysyncobj's (a name the
    module defines itself, such as RaftNode's own ``_poller``, is its own)."""
    private = _upstream_private_names()
    found = []
    for path in sorted((ROOT / "quorum" / "raft").glob("*.py")):
        if path == UPSTREAM:
            continue
        src = path.read_text()
        own = set(re.findall(r"(?:self\.|def |^\s*)(_[A-Za-z]\w*)\s*[=(:]", src, re.M))
        for name in sorted(private - own):
            for m in re.finditer(rf"\.{re.escape(name)}\b", src):
                line = src.count("\n", 0, m.start()) + 1
                found.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    assert not found, "\n".join(found)


def test_only_the_raft_package_imports_pysyncobj():
    """What the import-linter contract checks for the packages, here for every file (tests included:
    they reach pysyncobj through quorum.raft.upstream)."""
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path, n, line in _lines_outside_upstream()
             if re.match(r"\s*(import|from)\s+pysyncobj\b", line)]
    allowed = {"tests/support/fernet_node.py", "tests/quorum/test_link_crypto.py"}  # they play an earlier version
    assert [f for f in found if f.split(":")[0] not in allowed] == [], "\n".join(found)
    assert os.path.exists(UPSTREAM)
