"""Fuzz tests: decoders in-process under an address-space limit, servers over loopback."""
from __future__ import annotations

import resource

import pytest

from tests.broker import conftest as _broker_conftest
from tests.fuzz.inputs import HEADROOM, load_hypothesis_profile, vm_size

load_hypothesis_profile()


@pytest.fixture(scope="module")
def memory_bound():
    """RLIMIT_AS at the address space in use + 2 GiB while the module's decoders run: an input
    that makes a decoder allocate unboundedly fails (MemoryError, or the worker aborts) instead
    of passing on a machine with memory to spare."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = vm_size() + HEADROOM
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield limit
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


brokers = _broker_conftest.brokers  # real broker processes, for test_servers.py
