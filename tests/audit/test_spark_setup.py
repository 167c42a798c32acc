"""audit.spark's JRE install goes through provision.apt, and says what to do when it cannot."""
from __future__ import annotations

import pytest

from audit import spark
from provision.apt import AptUnavailable


def test_no_jre_install_when_turned_off(monkeypatch):
    monkeypatch.setenv("PIDQUORUM_NO_JRE_INSTALL", "1")
    monkeypatch.setattr(spark, "ensure_installed", lambda *a, **k: pytest.fail("installed anyway"))
    with pytest.raises(spark.SparkSetupError, match="PIDQUORUM_NO_JRE_INSTALL.*default-jre-headless"):
        spark._install_jre()


def test_jre_install_asks_provision_and_explains_a_refusal(monkeypatch):
    monkeypatch.delenv("PIDQUORUM_NO_JRE_INSTALL", raising=False)
    asked = []

    def refuse(package, present, **kwargs):
        asked.append((package, present, kwargs.get("timeout")))
        raise AptUnavailable(f"{package} is not installed, and installing it needs root")
    monkeypatch.setattr(spark, "ensure_installed", refuse)
    with pytest.raises(spark.SparkSetupError, match="no Java found.*default-jre-headless.*needs root.*JAVA_HOME"):
        spark._install_jre()
    assert asked == [("default-jre-headless", "java", 1800)]
