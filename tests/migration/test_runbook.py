"""docs/migration.md is executable: every ```sh block runs, in order, with ``bash -euo pipefail``
against a real ZooKeeper and a local three-node quorum, and the end state is what the runbook
promises. The runbook's sections, fences and every pidctl command it names are checked too, so
it cannot rot.

The test plays the parts the runbook leaves to the operator's deployment: the ZooKeeper-mode
fleet (the znode has a history, and a ZooKeeper-mode broker takes a block after the seed, so the
export is stale by the time bridge mode begins), and copying the nodes' audit.log files into the
working directory (the ```text step of the verification section; done before every block).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass

import click
import pytest

from cli.main import cli
from quorum.migration.zk import LegacyAllocator, ZkBlock, parse_block, read_block
from quorum.localcluster import LocalCluster
from quorum.trail import iter_blocks
from tests.conftest import ClusterHarness, wait_for
from tests.migration.conftest import three_node_quorum

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNBOOK = os.path.join(REPO, "docs", "migration.md")
BIN = os.path.dirname(sys.executable)  # the venv's bin: pidctl, and the python3 the checks use
EXECUTED = "sh"
ILLUSTRATIVE = {"text"}
# Sections the runbook must have (a word of each "## " heading), each with at least one command block.
SECTIONS = ["preflight", "export", "seed", "bridge", "move brokers", "cut-over", "verification", "rollback"]

# The znode's history before the migration: brokers 1, 2, 3 took these blocks in turn.
ZK_HISTORY = [(1, 7_340_000), (2, 7_341_000), (3, 7_342_000)]
EXPORTED = ZkBlock(1, 3, 7_342_000, 7_342_999)
CANARY_QUORUM, CANARY_ZK = 999998, 999999


# ------------------------------------------------------------------ parsing the runbook
@dataclass
class Block:
    lang: str
    body: str
    section: str  # the enclosing "## " heading ("" before the first)
    line: int     # line of the opening fence (1-based)


def parse_runbook(text: str) -> tuple[list[str], list[Block]]:
    headings: list[str] = []
    blocks: list[Block] = []
    section = ""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        stripped = lines[i].lstrip()
        if stripped.startswith("```"):
            indent = len(lines[i]) - len(stripped)
            body = []
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                body.append(lines[j][indent:] if lines[j][:indent].isspace() else lines[j])
                j += 1
            assert j < len(lines), f"docs/migration.md:{i + 1}: fence never closed"
            blocks.append(Block(stripped[3:].strip(), "\n".join(body) + "\n", section, i + 1))
            i = j + 1
            continue
        if lines[i].startswith("## "):
            section = lines[i][3:].strip()
            headings.append(section)
        i += 1
    return headings, blocks


def runbook() -> tuple[list[str], list[Block]]:
    with open(RUNBOOK) as f:
        return parse_runbook(f.read())


def section_of(block: Block) -> str | None:
    return next((s for s in SECTIONS if s in block.section.lower()), None)


_HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")
_INVOCATION = re.compile(r"(?:^|[;&|(]|\$\()\s*pidctl\s+([^;&|()<>\n]*)")


def shell_commands(body: str) -> list[str]:
    """The shell lines of a block: continuation lines joined, here-document bodies dropped."""
    out, heredoc_end = [], None
    for line in body.replace("\\\n", " ").splitlines():
        if heredoc_end is not None:
            if line.strip() == heredoc_end:
                heredoc_end = None
            continue
        out.append(line)
        m = _HEREDOC.search(line)
        if m:
            heredoc_end = m.group(1)
    return out


def pidctl_invocations(block: Block) -> list[list[str]]:
    """The argument lists of every pidctl command in a block (in ```text blocks: lines starting with pidctl)."""
    found = []
    if block.lang == EXECUTED:
        for line in shell_commands(block.body):
            found += [m.group(1) for m in _INVOCATION.finditer(line)]
    else:
        for line in block.body.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("pidctl "):
                found.append(re.split(r"[;&|]|\s[<>]\s", line[len("pidctl "):])[0])  # <N>: a placeholder
    return [shlex.split(args, comments=True) for args in found]


def _takes_value(param: click.Parameter) -> bool:
    return isinstance(param, click.Option) and not param.is_flag and not param.count


def _check_options(cmd: click.Command, tokens: list[str], where: str) -> list[str]:
    """Consume leading options of ``cmd`` (all of them for a leaf command); the rest is returned."""
    by_name = {o: p for p in cmd.params if isinstance(p, click.Option) for o in p.opts + p.secondary_opts}
    by_name.update({"-h": None, "--help": None})
    rest = list(tokens)
    while rest:
        tok = rest[0]
        if not tok.startswith("-") or tok == "-":
            if isinstance(cmd, click.Group):
                return rest
            rest.pop(0)  # an argument (or a shell word such as "${audit[@]}")
            continue
        name = tok.split("=", 1)[0]
        assert name in by_name, f"{where}: `{cmd.name}` has no option {name}"
        rest.pop(0)
        if by_name[name] is not None and _takes_value(by_name[name]) and "=" not in tok:
            assert rest, f"{where}: {name} needs a value"
            rest.pop(0)
    return rest


def resolve(tokens: list[str], where: str) -> tuple[str, ...]:
    """The subcommand path of a pidctl invocation, checking every option it passes exists."""
    cmd: click.Command = cli
    path: list[str] = []
    rest = tokens
    while isinstance(cmd, click.Group):
        rest = _check_options(cmd, rest, where)
        assert rest, f"{where}: `pidctl {' '.join(path)}` names no subcommand"
        name, rest = rest[0], rest[1:]
        assert name in cmd.commands, f"{where}: `pidctl {' '.join(path + [name])}` does not exist"
        path.append(name)
        cmd = cmd.commands[name]
    _check_options(cmd, rest, where)
    return tuple(path)


# ------------------------------------------------------------------ the static checks
def test_runbook_has_its_sections_fences_and_only_existing_pidctl_commands():
    headings, blocks = runbook()
    intro = open(RUNBOOK).read().split("\n## 1.")[0]
    assert "illustrative" in intro and "```text" in intro, "the top must say which blocks are not executed"
    for want in SECTIONS:
        assert any(want in h.lower() for h in headings), f"no section about {want!r} in {headings}"
        assert any(b.lang == EXECUTED and section_of(b) == want for b in blocks), f"no ```sh block under {want!r}"
    for b in blocks:
        assert b.lang == EXECUTED or b.lang in ILLUSTRATIVE, (
            f"docs/migration.md:{b.line}: fence {b.lang or '(none)'!r}: use ```sh (run by this test) or ```text")
    paths = set()
    for b in blocks:
        for tokens in pidctl_invocations(b):
            paths.add(resolve(tokens, f"docs/migration.md:{b.line}"))
    used = {p[:2] for p in paths}
    assert {("migrate", "export"), ("migrate", "zk-allocate"), ("migrate", "from-zk"), ("migrate", "bridge"),
            ("migrate", "finalize"), ("migrate", "rollback"), ("migrate", "status"), ("quorum", "status"),
            ("blocks", "history")} <= used, used
    pidctl = os.path.join(BIN, "pidctl")
    procs = {p: subprocess.Popen([pidctl, *p, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for p in sorted(paths)}
    for p, proc in procs.items():
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, f"pidctl {' '.join(p)} --help exited {proc.returncode}: {out}"


def test_invocation_parsing_catches_unknown_commands_and_options():
    block = Block(EXECUTED, 'x=$(pidctl --timeout 5 migrate status -o json)\npython3 - <<\'PY\'\n'
                            'print("pidctl nonsense here")\nPY\npidctl blocks history "${a[@]}" -o json > h.json\n',
                  "", 1)
    assert [resolve(t, "t") for t in pidctl_invocations(block)] == [("migrate", "status"), ("blocks", "history")]
    with pytest.raises(AssertionError, match="does not exist"):
        resolve(["migrate", "frobnicate"], "t")
    with pytest.raises(AssertionError, match="no option --nope"):
        resolve(["migrate", "export", "--zk", "x", "--nope"], "t")


# ------------------------------------------------------------------ running it
@pytest.fixture
def quorum(tmp_path):
    yield from three_node_quorum(tmp_path / "cluster")


def _read(work, name: str):
    return json.loads((work / name).read_text())


def _settled(lc: LocalCluster) -> bool:
    nodes = ClusterHarness(lc).describe_all()
    if len(nodes) != 3 or sum(d["raft"]["state"] == "leader" for d in nodes.values()) != 1:
        return False
    commit = max(d["raft"]["commit_index"] for d in nodes.values())
    return all(d["raft"]["last_applied"] == commit for d in nodes.values())


@pytest.mark.timeout(180)
def test_runbook_runs_end_to_end_against_zookeeper_and_a_quorum(quorum, zk_chroot, zk_client, tmp_path):
    # ZooKeeper-mode Kafka has been allocating for a while: the znode is at version 2.
    broker, start = ZK_HISTORY[0]
    zk_client.create("/latest_producer_id_block", ZkBlock(1, broker, start, start + 999).to_json())
    for broker, start in ZK_HISTORY[1:]:
        assert LegacyAllocator(zk_client, broker).allocate() == (start, 1000)
    assert read_block(zk_client) == (EXPORTED, 2)
    wait_for(lambda: _settled(quorum), 20, interval=0.1, what="a settled quorum")

    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "ZK": zk_chroot, "PIDQUORUM_QUORUM": ",".join(quorum.client_addresses()),
           "PATH": BIN + os.pathsep + os.environ.get("PATH", "")}
    env.pop("PIDQUORUM_DIR", None)  # nothing may fall back to a local cluster: PIDQUORUM_QUORUM is the deployment
    audit_logs = [os.path.join(quorum.data_dir(n.node_id), "audit.log") for n in quorum.nodes()]
    legacy: list[tuple[int, int, str]] = []  # blocks the ZooKeeper-mode fleet took during the migration

    def before_bridge() -> None:
        # The seed put the cursor at exactly the exported block_end + 1 ...
        # (on every node: followers apply once the commit index reaches them, a few milliseconds later)
        wait_for(lambda: {d["state"]["next_producer_id"] for d in ClusterHarness(quorum).describe_all().values()}
                 == {EXPORTED.block_end + 1}, 15, interval=0.05, what="every node's cursor at the export's end + 1")
        # ... and a ZooKeeper-mode broker takes a block before bridge mode starts: the export is stale now.
        s, n = LegacyAllocator(zk_client, 2).allocate()
        legacy.append((s, n, "zk-broker-2 before bridge"))

    hooks = {"bridge": before_bridge}
    _, blocks = runbook()
    executed = [b for b in blocks if b.lang == EXECUTED]
    for k, block in enumerate(executed, 1):
        hook = hooks.pop(section_of(block), None)
        if hook is not None:
            hook()
        for node_id, path in enumerate(audit_logs, 1):  # the operator's copy of each node's audit trail
            shutil.copyfile(path, work / f"audit-{node_id}.log")
        script = tmp_path / f"runbook-block-{k:02d}.sh"
        script.write_text(block.body)
        r = subprocess.run(["bash", "-euo", "pipefail", str(script)], cwd=work, env=env, capture_output=True,
                           text=True, timeout=120)
        if r.returncode != 0:
            pytest.fail(f"runbook block {k}/{len(executed)} (docs/migration.md:{block.line}, section "
                        f"{block.section!r}) exited {r.returncode}\n----- block -----\n{block.body}"
                        f"----- stdout -----\n{r.stdout}----- stderr -----\n{r.stderr}", pytrace=False)
    assert not hooks, f"hooks for sections the runbook lacks: {list(hooks)}"

    # The export is the znode's data byte for byte, as ZooKeeper held it when the migration began.
    assert (work / "zk-latest-producer-id-block.json").read_bytes() == EXPORTED.to_json()
    seed = _read(work, "seed.json")
    assert seed["seed"] == EXPORTED.block_end + 1 and seed["changed"] is True

    # Every block the quorum issued, from the nodes' own audit trails.
    issued = list(iter_blocks(audit_logs))
    assert [b["broker_id"] for b in issued] == [CANARY_QUORUM] * 3, issued  # the runbook's three canaries
    # The first starts right above the block the ZooKeeper-mode broker took after the export (bridge mode),
    # which is itself right above the exported block_end.
    (before,) = legacy
    assert before[0] == EXPORTED.block_end + 1
    assert issued[0]["producer_id_start"] == before[0] + before[1]
    for name in ("canary-zk.json", "zk-after-rollback-allocation.json"):
        (b,) = _read(work, name)
        legacy.append((b["producer_id_start"], b["producer_id_len"], name))
    everything = sorted([(b["producer_id_start"], b["producer_id_len"], f"quorum {b['raft_index']}")
                         for b in issued] + legacy)
    assert everything[0][0] > EXPORTED.block_end
    for (s1, n1, w1), (s2, n2, w2) in zip(everything, everything[1:]):
        assert s1 + n1 <= s2, f"overlap: [{s1}, {s1 + n1}) of {w1} and [{s2}, {s2 + n2}) of {w2}"

    # After the rollback: the placeholder sits at the quorum's next ID, and ZooKeeper-mode allocation
    # continues above everything the quorum issued.
    status = _read(work, "status-after-rollback.json")
    top = issued[-1]["producer_id_start"] + issued[-1]["producer_id_len"]
    assert status["mode"] == "rolled-back" and status["next_producer_id"] == top
    assert parse_block((work / "zk-after-rollback.json").read_bytes(), "rollback") == ZkBlock(1, -1, top, top + 999)
    (after,) = _read(work, "zk-after-rollback-allocation.json")
    assert after["producer_id_start"] == top + 1000
    assert read_block(zk_client)[0] == ZkBlock(1, CANARY_ZK, top + 1000, top + 1999)


# ------------------------------------------------------------------ the two commands the runbook added
def _pidctl(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([os.path.join(BIN, "pidctl"), "--timeout", "5", *args], capture_output=True, text=True,
                          timeout=60, cwd=cwd)


def _one_line_error(r: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == code and len(lines) == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_export_and_zk_allocate(zk_chroot, zk_client, tmp_path):
    out = tmp_path / "export.json"
    r = _pidctl("migrate", "export", "--zk", zk_chroot, "--out", str(out), cwd=tmp_path)
    _one_line_error(r, 1, "does not exist", zk_chroot)
    zk_client.create("/latest_producer_id_block", b"")
    _one_line_error(_pidctl("migrate", "export", "--zk", zk_chroot, cwd=tmp_path), 1, "holds no block")
    zk_client.set("/latest_producer_id_block", b'{"version":1,"broker":35,"block_start":"4000"}')
    _one_line_error(_pidctl("migrate", "export", "--zk", zk_chroot, "--out", str(out), cwd=tmp_path), 1,
                    "'block_end'")
    assert not out.exists() and os.listdir(tmp_path) == []  # refused: nothing written, no temp file left
    # Not Kafka's spacing, an extra field: exported byte for byte all the same.
    raw = b'{"version": 1, "broker": 35, "block_start": "4000", "block_end": "4999", "note": "x"}'
    zk_client.set("/latest_producer_id_block", raw)
    r = _pidctl("migrate", "export", "--zk", zk_chroot, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == raw.decode() + "\n", r
    r = _pidctl("migrate", "export", "--zk", zk_chroot, "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0 and out.read_bytes() == raw and "[4000, 4999]" in r.stdout, r
    assert sorted(os.listdir(tmp_path)) == ["export.json"]

    r = _pidctl("migrate", "zk-allocate", "--zk", zk_chroot, "--broker-id", "7", "--count", "2", "-o", "json",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert [(b["producer_id_start"], b["block_end"], b["broker_id"]) for b in got] == [(5000, 5999, 7),
                                                                                      (6000, 6999, 7)]
    assert read_block(zk_client)[0] == ZkBlock(1, 7, 6000, 6999)
    _one_line_error(_pidctl("migrate", "zk-allocate", "--zk", zk_chroot + "/missing", "--broker-id", "7",
                            cwd=tmp_path), 1, "chroot does not exist")
    r = _pidctl("migrate", "export", "--zk", "127.0.0.1:notaport", cwd=tmp_path)  # click's usage error
    assert r.returncode == 2 and "Invalid value for '--zk'" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_export_json(zk_chroot, zk_client, tmp_path):
    raw = b'{"version": 1, "broker": 35, "block_start": "4000", "block_end": "4999", "note": "x"}'
    zk_client.create("/latest_producer_id_block", raw)
    zk_client.set("/latest_producer_id_block", raw)  # znode version 1
    expected = {"zk": zk_chroot, "znode": "/latest_producer_id_block", "znode_version": 1, "version": 1,
                "broker": 35, "block_start": 4000, "block_end": 4999, "data": raw.decode()}
    r = _pidctl("migrate", "export", "--zk", zk_chroot, "-o", "json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {**expected, "out": None}
    out = tmp_path / "export.json"
    r = _pidctl("migrate", "export", "--zk", zk_chroot, "--out", str(out), "-o", "json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {**expected, "out": str(out)}
    assert out.read_bytes() == raw  # the file is still the znode's bytes, what from-zk --export reads
    zk_client.delete("/latest_producer_id_block")
    r = _pidctl("migrate", "export", "--zk", zk_chroot, "-o", "json", cwd=tmp_path)
    _one_line_error(r, 1, "does not exist")
    assert r.stdout == ""
