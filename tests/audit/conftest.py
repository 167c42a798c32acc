"""One SparkSession per test process (local[2]), started on first use and stopped at the end.

Every Spark test lives in tests/audit/test_job.py, so under pytest-xdist at most
the worker that runs them starts a JVM.  The suite installs the Java runtime Spark
needs (the package itself never installs a system package).
"""
from __future__ import annotations

import pytest

from chaos.audit.spark import spark_session


@pytest.fixture(scope="session")
def java_home():
    from benchmarks.audit import ensure_java  # heavy (pyarrow): imported when used

    return ensure_java()


@pytest.fixture(scope="session")
def spark(java_home):
    session = spark_session("local[2]", driver_memory="1g")
    yield session
    session.stop()
