#!/usr/bin/env python
"""End-to-end benchmark of a local three-node pidquorum: see ``benchmarks/quorum_phases.py``.

    python bench/bench_quorum.py [--quick] [--json bench-results/quorum.json]
                                 [--duration 5] [--kills 12] [--history 1000000]
"""
import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from benchmarks.quorum_phases import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
