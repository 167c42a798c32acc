"""The shipped deployment configs (deploy/node-N.toml) on three distinct hosts: three Linux
network namespaces on one machine, each with its own address on a bridge, one node in each.

Needs root (namespaces, veth pairs) and iproute2's ``ip`` (installed with apt-get when
missing, by ``benchmarks.provision``); skipped with the reason otherwise.  Only the namespaces and links this test made are removed afterwards.
"""
from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from quorum.client.quorum import QuorumClient, RetryPolicy
from benchmarks.provision import AptUnavailable, ensure_installed
from quorum.config import load
from tests.conftest import run, wait_for

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _ensure_ip() -> str | None:
    """None if ``ip`` can be used, else why not."""
    if os.geteuid() != 0:
        return "needs root: creates network namespaces and veth pairs"
    try:
        ensure_installed("iproute2", "ip", timeout=600)
    except AptUnavailable as e:
        return f"iproute2's ip is missing: {e}"
    probe = f"pqprobe{secrets.token_hex(3)}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"cannot create network namespaces here: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def ip(*args: str, ns: str | None = None) -> None:
    cmd = (["ip", "netns", "exec", ns, "ip"] if ns else ["ip"]) + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")


def _free_subnet() -> str:
    used = subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout
    for _ in range(100):
        prefix = f"10.213.{secrets.randbelow(250) + 1}"
        if f"{prefix}." not in used:
            return prefix
    raise RuntimeError("no free 10.213.x.0/24 subnet")


class Hosts:
    """Three 'hosts' (namespaces) and a hub namespace with a bridge; the test process reaches
    them through one veth pair whose root end is <tok>r."""

    def __init__(self):
        self.tok = "pq" + secrets.token_hex(3)
        self.prefix = _free_subnet()
        self.hub = f"{self.tok}-hub"
        self.hosts = [f"{self.tok}-h{i}" for i in (1, 2, 3)]
        self.made_ns: list[str] = []
        self.made_links: list[str] = []

    def address(self, i: int) -> str:
        return f"{self.prefix}.{i}"

    def up(self) -> None:
        for ns in [self.hub] + self.hosts:
            ip("netns", "add", ns)
            self.made_ns.append(ns)
            ip("link", "set", "lo", "up", ns=ns)
        ip("link", "add", "br0", "type", "bridge", ns=self.hub)
        ip("link", "set", "br0", "up", ns=self.hub)
        for i, ns in enumerate(self.hosts, start=1):
            a, b = f"{self.tok}n{i}", f"{self.tok}p{i}"
            ip("link", "add", a, "type", "veth", "peer", "name", b)
            self.made_links.append(a)  # until both ends are moved away
            ip("link", "set", a, "netns", ns)
            ip("link", "set", b, "netns", self.hub)
            self.made_links.remove(a)
            ip("link", "set", a, "name", "eth0", ns=ns)
            ip("addr", "add", f"{self.address(i)}/24", "dev", "eth0", ns=ns)
            ip("link", "set", "eth0", "up", ns=ns)
            ip("link", "set", b, "master", "br0", ns=self.hub)
            ip("link", "set", b, "up", ns=self.hub)
        a, b = f"{self.tok}r", f"{self.tok}q"
        ip("link", "add", a, "type", "veth", "peer", "name", b)
        self.made_links.append(a)
        ip("link", "set", b, "netns", self.hub)
        ip("link", "set", b, "master", "br0", ns=self.hub)
        ip("link", "set", b, "up", ns=self.hub)
        ip("addr", "add", f"{self.address(254)}/24", "dev", a)
        ip("link", "set", a, "up")

    def down(self) -> None:
        for link in self.made_links:
            subprocess.run(["ip", "link", "del", link], capture_output=True)
        for ns in reversed(self.made_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def render_config(i: int, hosts: Hosts, work: Path) -> Path:
    """deploy/node-i.toml with the namespaces' addresses and paths under ``work``."""
    text = (DEPLOY / f"node-{i}.toml").read_text()
    text = re.sub(r"10\.0\.0\.(\d)", lambda m: hosts.address(int(m.group(1))), text)
    text = text.replace("/var/lib/pidquorum/", f"{work}/var/").replace("/etc/pidquorum/secret", f"{work}/secret")
    path = work / f"node-{i}.toml"
    path.write_text(text)
    return path


@pytest.fixture
def hosts():
    reason = _ensure_ip()
    if reason:
        pytest.skip(reason)
    h = Hosts()
    try:
        h.up()
        yield h
    finally:
        h.down()


def test_three_hosts_in_network_namespaces(hosts, tmp_path):
    (tmp_path / "secret").write_text(secrets.token_urlsafe(32) + "\n")
    (tmp_path / "secret").chmod(0o600)
    procs: dict[int, subprocess.Popen] = {}
    logs = {}
    try:
        for i, ns in enumerate(hosts.hosts, start=1):
            cfg_path = render_config(i, hosts, tmp_path)
            cfg = load(str(cfg_path))
            assert cfg.raft_address == f"{hosts.address(i)}:9093" and len(cfg.peers) == 2
            logs[i] = tmp_path / f"node-{i}.log"
            with open(logs[i], "wb") as logf:
                procs[i] = subprocess.Popen(
                    ["ip", "netns", "exec", ns, sys.executable, "-m", "quorum", "--config", str(cfg_path),
                     "--ready-file", str(tmp_path / f"node-{i}.ready")],
                    stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(ROOT),
                    start_new_session=True)
        for i in procs:
            wait_for(lambda i=i: (tmp_path / f"node-{i}.ready").exists() or procs[i].poll() is not None, 30,
                     what=f"node {i} ready")
            assert procs[i].poll() is None, logs[i].read_text()
        addresses = [f"{hosts.address(i)}:9092" for i in (1, 2, 3)]

        async def allocate(addrs, n):
            c = QuorumClient(addrs, RetryPolicy(timeout=20.0, attempt_timeout=2.0))
            try:
                epoch = await c.register_broker(7)
                blocks = [await c.allocate(7, epoch) for _ in range(n)]
                states = [(await c.describe(a))["raft"] for a in addrs]
                return blocks, states
            finally:
                await c.close()

        blocks, states = run(allocate(addresses, 10))
        leaders = [s["self"] for s in states if s["state"] == "leader"]
        assert len(leaders) == 1 and all(s["leader"] == leaders[0] for s in states)
        assert {s["identity"]["cluster_id"] for s in states} == {"c-3f2a9c0d5e6b4a1f8c7d2e9b0a1c3d4e"}
        # Each node talks to the two others over its own address.
        assert all(all(p["connected"] for p in s["peers"].values()) for s in states)
        # The leader's host goes away: the two others go on.
        leader_i = int(leaders[0].split(":")[0].rsplit(".", 1)[1])
        procs[leader_i].kill()
        procs[leader_i].wait(10)
        more, _ = run(allocate([a for i, a in enumerate(addresses, 1) if i != leader_i], 10))
        spans = sorted((b.start, b.start + b.length) for b in blocks + more)
        assert all(e1 <= s2 for (_, e1), (s2, _) in zip(spans, spans[1:])), spans
    except BaseException:
        for i, path in logs.items():
            if path.exists():
                print(f"----- node {i} log -----\n{path.read_text()[-4000:]}")
        raise
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
