"""Fuzz tests: decoders in-process under an address-space limit, servers over loopback."""
from __future__ import annotations

import resource

import pytest

from tests.broker import conftest as _broker_conftest
from tests.fuzz.inputs import load_hypothesis_profile

load_hypothesis_profile()

HEADROOM = 2 * 1024**3


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0  # pragma: no cover


@pytest.fixture(scope="module")
def memory_bound():
    """RLIMIT_AS at the address space in use + 2 GiB while the module's decoders run: an input
    that makes a decoder allocate unboundedly fails (MemoryError, or the worker aborts) instead
    of passing on a machine with memory to spare."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _vm_size() + HEADROOM
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield limit
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


brokers = _broker_conftest.brokers  # real broker processes, for test_servers.py
