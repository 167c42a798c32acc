"""chaos.audit.spark finds a Java runtime and, when there is none, says what to install instead of installing it."""
from __future__ import annotations

import os

import pytest

from chaos.audit import spark


def test_no_java_is_a_clear_error_and_nothing_is_installed(monkeypatch, tmp_path):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no java, and no apt-get to run either
    monkeypatch.setattr(spark, "_glob_jvms", lambda: [])
    with pytest.raises(spark.SparkSetupError, match="no Java found.*apt-get install default-jre-headless.*JAVA_HOME"):
        spark.find_java_home()


def test_java_home_from_the_environment_then_path(monkeypatch, tmp_path):
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(home))
    assert spark.find_java_home() == str(home)
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(home / "bin"))
    assert spark.find_java_home() == os.path.realpath(home)
