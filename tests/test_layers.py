"""The layering contract in setup.cfg ([importlinter]) holds: checked with import-linter, as CI runs it."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_layering_contract_is_kept():
    lint = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    r = subprocess.run([lint, "--config", os.path.join(ROOT, "setup.cfg"), "--no-cache"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 kept, 0 broken" in r.stdout, r.stdout
