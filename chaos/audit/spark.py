"""A SparkSession that works from a clean install: ``spark_session()``.

It finds Java, pins local masters to 127.0.0.1, sets ``PYSPARK_PYTHON``, quiets Spark's UI and logs,
and sizes shuffle partitions and window buffers for the audit job.  What a fresh ``pip install
pidquorum`` lacks and each setting made here: docs/simulation.md, section 13, "The Spark session".
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

APP = "pidquorum-audit"
JRE_PACKAGE = "default-jre-headless"
_WINDOW_BUFFER_ROWS = 1 << 20

_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
# PySpark counts as a shell: at the root's level, Spark prints no "Setting default log level" banner.
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
logger.submit.name = org.apache.spark.deploy.SparkSubmit
logger.submit.level = error
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
"""


class SparkSetupError(Exception):
    """Spark cannot start here (no Java, too old a Java, a JVM that would not start)."""


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


# ----------------------------------------------------------------------- java
def _java_major(java: str) -> int | None:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not m:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major  # "1.8.0" is Java 8


def _home_of(java: str) -> str:
    return os.path.dirname(os.path.dirname(os.path.realpath(java)))


def find_java_home() -> str:
    """JAVA_HOME for Spark: the environment's if valid, else the java on PATH, else one under /usr/lib/jvm."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return home
    java = shutil.which("java")
    if java is not None:
        return _home_of(java)
    jvms = sorted(_glob_jvms(), reverse=True)
    if jvms:
        return jvms[0]
    raise SparkSetupError(f"no Java found (JAVA_HOME unset, no java on PATH, none under /usr/lib/jvm): install a "
                          f"Java 17+ runtime (Debian/Ubuntu: sudo apt-get install {JRE_PACKAGE}) or set JAVA_HOME")


def _glob_jvms() -> list[str]:
    base = "/usr/lib/jvm"
    try:
        return [os.path.join(base, d) for d in os.listdir(base)
                if os.access(os.path.join(base, d, "bin", "java"), os.X_OK)]
    except OSError:
        return []


def _check_java(home: str) -> None:
    import pyspark  # heavy (pyspark): imported when used

    need = 17 if int(pyspark.__version__.split(".")[0]) >= 4 else 8
    major = _java_major(os.path.join(home, "bin", "java"))
    if major is None:
        raise SparkSetupError(f"{home}/bin/java does not run (java -version failed); fix JAVA_HOME")
    if major < need:
        raise SparkSetupError(f"PySpark {pyspark.__version__} needs Java {need}+, found Java {major} at {home} "
                              f"(Debian: apt-get install {JRE_PACKAGE}; or point JAVA_HOME at a newer one)")


# ---------------------------------------------------------------------- spark
def _log4j_file() -> str:
    path = os.path.join(tempfile.gettempdir(), "pidquorum-spark-log4j2.properties")
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == _LOG4J:
                return path
    except OSError:
        pass
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(_LOG4J)
    os.replace(tmp, path)
    return path


def default_parallelism(master: str | None) -> int:
    """Cores a local master runs on (for sizing before the session exists)."""
    if master and master.startswith("local["):
        n = master[6:-1]
        if n != "*" and n.isdigit():
            return max(1, int(n))
    return os.cpu_count() or 2


def spark_session(master: str | None = "local[*]", app: str = APP, *, driver_memory: str | None = None,
                  conf: dict[str, str] | None = None):
    """A SparkSession (the active one if this process already has one).

    ``master=None`` leaves the master to ``spark-submit``.  ``driver_memory``
    (default ``PIDQUORUM_SPARK_DRIVER_MEMORY`` or 2g) only applies when this call
    starts the JVM, which in local mode also runs the executors.
    """
    from pyspark.sql import SparkSession  # heavy (pyspark): imported when used

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if master is None:  # under spark-submit: its --master is in the launched JVM's configuration
        from pyspark import SparkConf  # heavy (pyspark): imported when used

        local = is_local(SparkConf().get("spark.master", "local[*]"))
    else:
        local = is_local(master)
    home = find_java_home()
    _check_java(home)
    os.environ["JAVA_HOME"] = home
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if local:
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    log4j = _log4j_file()
    java_opts = f"-Dlog4j2.configurationFile=file:{log4j} -Dlog4j.configurationFile=file:{log4j}"
    if local:  # batch work in one JVM: the throughput collector beats G1 here by ~25 %
        java_opts += " -XX:+UseParallelGC"
    b = SparkSession.builder.appName(app)
    if master is not None:
        b = b.master(master)
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": java_opts,
        "spark.executor.extraJavaOptions": java_opts,
        "spark.sql.shuffle.partitions": str(2 * default_parallelism(master)),
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.windowExec.buffer.in.memory.threshold": str(_WINDOW_BUFFER_ROWS),
        "spark.sql.windowExec.buffer.spill.threshold": str(_WINDOW_BUFFER_ROWS),
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.memory": driver_memory or os.environ.get("PIDQUORUM_SPARK_DRIVER_MEMORY", "2g"),
    }
    if local:
        settings.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    settings.update(conf or {})
    for k, v in settings.items():
        b = b.config(k, v)
    try:
        spark = b.getOrCreate()
    except Exception as e:  # noqa: BLE001 - py4j / JVM start-up errors have many types
        raise SparkSetupError(f"Spark did not start (master {master or 'from spark-submit'}): "
                              f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}") from e
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def tune_for_rows(spark, rows: int) -> int:
    """Shuffle partitions for an input of ``rows`` rows: 2 per core for small inputs,
    about one per 1.25M rows above that (AQE coalesces what turns out smaller)."""
    cores = max(1, spark.sparkContext.defaultParallelism)
    parts = max(2 * cores, min(4000, -(-rows // 1_250_000)))
    spark.conf.set("spark.sql.shuffle.partitions", str(parts))
    return parts
