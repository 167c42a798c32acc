"""Debian packages installed on demand with apt-get: ``ensure_installed(package, present)``.

The one way pidquorum's tools and tests install what they need from the system (a JRE for
Spark, ZooKeeper and etcd for ``pidctl bench`` and the migration tests, iproute2 for the
network-namespace test):

* nothing is run when ``present`` already holds (a command on PATH, or a check of files);
* otherwise, as root (or with passwordless ``sudo -n``) and with ``apt-get`` on the machine,
  ``apt-get update`` then ``apt-get install -y --no-install-recommends PACKAGE``, non-interactive
  (``DEBIAN_FRONTEND=noninteractive``, stdin closed, waiting for dpkg's lock);
* parallel processes (pytest-xdist workers, several benchmark runs) are serialized with
  ``flock`` on one lock file: the first installs, the others wait and then find it present;
* anything that stops it raises ``AptUnavailable``, naming the package and the command to run
  by hand.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from typing import Callable

LOCK = os.path.join(tempfile.gettempdir(), "pidquorum-apt.lock")
TIMEOUT = 900.0


class AptUnavailable(Exception):
    """A package is missing and cannot be installed here (or its installation failed)."""


def manual_command(package: str) -> str:
    return f"apt-get install --no-install-recommends {package}"


def _check(present: str | Callable[[], bool]) -> bool:
    return shutil.which(present) is not None if isinstance(present, str) else bool(present())


def _sudo_prefix(package: str) -> list[str]:
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return []
    if shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        return ["sudo", "-n", "--preserve-env=DEBIAN_FRONTEND"]
    raise AptUnavailable(f"{package} is not installed, and installing it needs root (or passwordless sudo): "
                         f"run `{manual_command(package)}` as root")


def _tail(text: str, lines: int) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def ensure_installed(package: str, present: str | Callable[[], bool], *, timeout: float = TIMEOUT,
                     say: Callable[[str], None] | None = None) -> float:
    """Install Debian's ``package`` unless ``present`` (a command name looked up on PATH, or a
    callable) already holds; returns the seconds spent installing (0.0 when nothing was done).

    ``say`` gets one progress line ("installing PACKAGE with apt-get") when an installation starts.  Raises ``AptUnavailable`` when
    the package cannot be installed, or is installed and ``present`` still does not hold."""
    if _check(present):
        return 0.0
    if shutil.which("apt-get") is None:
        raise AptUnavailable(f"{package} is not installed and there is no apt-get on this machine to install it "
                             f"with: install it by hand (Debian/Ubuntu: `{manual_command(package)}`)")
    prefix = _sudo_prefix(package)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")

    def apt(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*prefix, "apt-get", "-o", "DPkg::Lock::Timeout=300", *args], env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout)

    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # other processes wait here, then find it installed
        try:
            if _check(present):
                return 0.0
            if say is not None:
                say(f"installing {package} with apt-get")
            began = time.monotonic()
            try:
                update = apt("update")
                done = apt("install", "-y", "--no-install-recommends", package)
            except subprocess.TimeoutExpired:
                raise AptUnavailable(f"apt-get did not install {package} within {timeout:.0f}s: "
                                     f"run `{manual_command(package)}` by hand") from None
            if done.returncode != 0:
                said = f"; apt-get update said: {_tail(update.stdout, 4)}" if update.returncode != 0 else ""
                raise AptUnavailable(f"apt-get install {package} failed (exit {done.returncode}): "
                                     f"{_tail(done.stdout, 8)}{said}")
            if not _check(present):
                raise AptUnavailable(f"apt-get installed {package}, but what it should provide is still missing")
            return time.monotonic() - began
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
