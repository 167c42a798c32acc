"""What the simulation tests share: the checkout's root (the working directory of a child process), the
nodes' own log lines switched off (an autouse fixture: import it into a test module), and the search for
the first seed in which a reintroduced defect shows."""
from __future__ import annotations

import logging
import os
from typing import Callable

import pytest

from chaos.sim.sim import SimResult
from tests.support.defects import SWITCHES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def quiet_logging():
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


def first_violation(switch: str, seeds: int, run: Callable[[int], SimResult]) -> tuple[int, str] | None:
    """With the defect ``switch`` on: the first of seeds 1..``seeds`` whose run fails, and its violation."""
    with SWITCHES[switch]():
        for seed in range(1, seeds + 1):
            result = run(seed)
            if not result.ok:
                return seed, result.violation
    return None
