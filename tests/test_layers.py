"""The layering contract in setup.cfg ([importlinter]) holds: checked with import-linter, as CI runs it."""
from __future__ import annotations

import configparser
import os
import pkgutil
import subprocess
import sys

import quorum

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_layering_contract_is_kept():
    lint = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    r = subprocess.run([lint, "--config", os.path.join(ROOT, "setup.cfg"), "--no-cache"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "8 kept, 0 broken" in r.stdout, r.stdout


SHARED = {"client", "network", "security", "telemetry", "settings", "failpoints"}


def test_every_module_of_the_quorum_is_shared_or_named_as_its_server():
    """The contract that keeps brokers off the quorum's server lists the server's modules: a new module
    of the quorum must land in that list or among the shared ones, not slip between them."""
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    server = {m.split(".", 1)[1] for m in cfg["importlinter:contract:quorum-shared"]["forbidden_modules"].split()}
    modules = {m.name for m in pkgutil.iter_modules(quorum.__path__)}
    assert not server & SHARED
    assert modules - SHARED == server, (sorted(modules - SHARED - server), sorted(server - modules))


def test_the_wheel_installs_only_the_products_top_level_names():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    tops = {p for p in cfg["options.packages.find"]["include"].split() if "." not in p}
    assert tops == {"records", "snapshots", "quorum", "broker", "chaos", "cli"}
