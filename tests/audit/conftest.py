"""One SparkSession per test process (local[2]), started on first use and stopped at the end.

Every Spark test lives in tests/audit/test_job.py, so under pytest-xdist at most
the worker that runs them starts a JVM.
"""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    from audit.spark import spark_session

    session = spark_session("local[2]", driver_memory="1g")
    yield session
    session.stop()
