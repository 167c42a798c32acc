"""The failpoint seam: inert unless armed, armed only by name, and the only switch production code has."""
from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from quorum import failpoints
from chaos.faults import ACTIONS, arm_spec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRODUCTION = ("records", "snapshots", "quorum", "broker", os.path.join("chaos", "audit"), "cli")
# What production modules may read from the environment: settings an operator sets, never a fault.
ALLOWED_ENV = {"PIDQUORUM_SPARK_DRIVER_MEMORY", "JAVA_HOME", "SPARK_LOCAL_IP",
               "PYSPARK_PYTHON", "PATH", "COLUMNS"}


def test_an_unarmed_point_does_nothing():
    for name in failpoints.POINTS:
        assert failpoints.hit(name, object()) is None


def test_only_known_points_can_be_armed():
    with pytest.raises(ValueError, match="no failpoint 'quorum.nowhere'"):
        failpoints.arm("quorum.nowhere", lambda: True)


def test_armed_inside_the_block_only():
    with failpoints.armed("broker.produce.appended", lambda n: n == 2):
        assert failpoints.hit("broker.produce.appended", 1) is False
        assert failpoints.hit("broker.produce.appended", 2) is True
    assert failpoints.hit("broker.produce.appended", 2) is None


@pytest.mark.parametrize("spec,error", [
    ("broker.produce.appended=drop-every:0", "N >= 1"),
    ("broker.produce.appended=drop-every", "needs a count"),
    ("broker.produce.appended=explode", "unknown fault"),
    ("no-equals-sign", "unknown fault"),
])
def test_bad_fault_specs_are_refused_naming_what_is_known(spec, error):
    with pytest.raises(ValueError, match=error):
        arm_spec(spec)
    assert failpoints.hit("broker.produce.appended", 5) is None


def test_drop_every_n():
    arm_spec("broker.produce.appended=drop-every:3")
    try:
        assert [failpoints.hit("broker.produce.appended", n) for n in range(1, 7)] == [False, False, True] * 2
    finally:
        failpoints.disarm("broker.produce.appended")


def test_every_action_is_for_a_known_point():
    assert {point for point, _ in ACTIONS} <= set(failpoints.POINTS)


def test_the_launcher_refuses_a_bad_spec_before_running_anything():
    r = subprocess.run([sys.executable, "-m", "chaos.armed", "--failpoint", "quorum.allocate=oops", "broker",
                        "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown fault" in r.stderr


def _environment_reads(path: str) -> list[tuple[int, str]]:
    """(line, name) of every os.environ / os.getenv read with a constant name in one file."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                 and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                 for t in n.targets if isinstance(t, ast.Name)}
    out = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            key = node.slice
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.get", "os.getenv"):
            key = node.args[0] if node.args else None
        if isinstance(key, ast.Name) and key.id in constants:  # os.environ.get(SOME_ENV), SOME_ENV = "..."
            out.append((node.lineno, constants[key.id]))
        elif isinstance(key, ast.Constant) and isinstance(key.value, str):
            out.append((node.lineno, key.value))
    return out


def test_no_production_module_reads_a_fault_switch_from_the_environment():
    found = []
    for package in PRODUCTION:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    found += [(os.path.relpath(path, ROOT), line, key) for line, key in _environment_reads(path)
                              if key not in ALLOWED_ENV]
    assert not found, f"environment switches in production modules: {found}"
