"""``python -m chaos.armed [--failpoint SPEC]... MODULE [ARGS...]``: run ``python -m MODULE ARGS``
with failpoints armed (``chaos.faults``), for tests and chaos runs that need a fault inside a
child process (a broker that drops connections, a node with a broken allocator)."""
from __future__ import annotations

import argparse
import runpy
import sys

from .faults import arm_spec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chaos.armed")
    ap.add_argument("--failpoint", action="append", default=[], metavar="POINT=ACTION[:ARG]")
    ap.add_argument("module")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    try:
        for spec in args.failpoint:
            arm_spec(spec)
    except ValueError as e:
        print(f"chaos.armed: {e}", file=sys.stderr)
        return 2
    sys.argv = [args.module, *args.args]
    runpy.run_module(args.module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
