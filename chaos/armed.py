"""``python -m chaos.armed [--failpoint SPEC]... MODULE [ARGS...]``: run ``python -m MODULE ARGS``
with failpoints armed (``chaos.faults``), for tests and chaos runs that need a fault inside a
child process (a broker that drops connections, a node with a broken allocator)."""
from __future__ import annotations

import argparse
import runpy
import sys

from .faults import add_option, arm_or_explain


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chaos.armed")
    add_option(ap)
    ap.add_argument("module")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    if not arm_or_explain(args.failpoint, "chaos.armed"):
        return 2
    sys.argv = [args.module, *args.args]
    runpy.run_module(args.module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
