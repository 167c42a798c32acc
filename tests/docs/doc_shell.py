"""Run a doc's shell blocks as a reader would: in order, in one bash, in an empty directory.

A doc marks what it runs: every fenced ```sh block under a heading is a step; an HTML comment
``<!-- expect exit N -->`` on the line before a block says that step fails with exit code N; a ```text
block right after a step is what the step prints (a line of it matches an output line when they are
equal with every run of digits taken as any number and ``...`` as anything).

``DocShell`` keeps one bash process (started in a session of its own, so the processes the doc starts
in the background can be ended with it, by its process group), runs each step with ``set -e`` and
records its output and exit code; a step that fails unexpectedly ends the shell, as it would stop a
reader.
"""
from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field

from tests.conftest import wait_for

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs")
BIN = os.path.dirname(sys.executable)  # the virtualenv's bin: pidctl, python
FENCE = re.compile(r"^```(\w*)\s*$")
EXPECT = re.compile(r"^<!--\s*expect exit (\d+)\s*-->\s*$")


@dataclass
class Block:
    lang: str
    text: str
    heading: str
    expect_exit: int = 0
    output: list[str] = field(default_factory=list)  # the ```text block after it, if any


def blocks(doc: str, under: str | None = None) -> list[Block]:
    """The ```sh blocks of ``docs/<doc>`` (only those under the heading ``under`` and its subheadings,
    if given), each with the ```text block that follows it (only blank lines between)."""
    with open(os.path.join(DOCS, doc)) as f:
        lines = f.read().splitlines()
    out: list[Block] = []
    heading, level, inside, expect = "", 0, under is None, 0
    sh_end = None  # the line of the last ```sh block's closing fence
    i = 0
    while i < len(lines):
        line, m = lines[i], re.match(r"^(#+)\s+(.*)$", lines[i])
        if m:
            heading = m.group(2).strip()
            if under is not None and heading == under:
                inside, level = True, len(m.group(1))
            elif under is not None and inside and len(m.group(1)) <= level:
                inside = False
        elif EXPECT.match(line):
            expect = int(EXPECT.match(line).group(1))
            i += 1
            continue
        elif FENCE.match(line):
            lang, j = FENCE.match(line).group(1), i + 1
            while not lines[j].startswith("```"):
                j += 1
            text = "\n".join(lines[i + 1:j])
            if inside and lang == "sh":
                out.append(Block(lang, text, heading, expect))
                sh_end = j
            elif (inside and lang == "text" and sh_end is not None
                  and all(not x.strip() for x in lines[sh_end + 1:i])):
                out[-1].output = text.splitlines()
            i = j
        expect = 0
        i += 1
    return out


def line_pattern(promised: str) -> re.Pattern:
    """A promised output line as a pattern: digits are any number, ``...`` anything."""
    parts = re.split(r"(\.\.\.|\d+)", promised)
    return re.compile("".join(".*" if p == "..." else r"\d+" if p.isdigit() else re.escape(p) for p in parts))


def assert_prints(block: Block, output: str) -> None:
    """Every line the doc promises for ``block`` is a line of ``output``, in order."""
    got = output.splitlines()
    k = 0
    for promised in block.output:
        pattern = line_pattern(promised)
        while k < len(got) and not pattern.fullmatch(got[k]):
            k += 1
        assert k < len(got), f"the doc promises {promised!r} after\n{block.text}\nwhich printed:\n{output}"
        k += 1


def with_ports(block: Block, ports: list[int]) -> Block:
    """``block`` (``NAME=number`` assignments) with each number replaced by the next of ``ports``."""
    it = iter(ports)
    text = re.sub(r"\b([A-Z][A-Z0-9_]*)=\d+\b", lambda m: f"{m.group(1)}={next(it)}", block.text)
    return Block(block.lang, text, block.heading, block.expect_exit, block.output)


class DocShell:
    """One bash in ``workdir`` with this checkout's virtualenv first on its PATH."""

    def __init__(self, workdir: str, scratch: str):
        self.workdir, self.scratch, self.steps = workdir, scratch, 0
        os.makedirs(workdir, exist_ok=True)
        os.makedirs(scratch, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIDQUORUM_")}
        env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
        self.log = open(os.path.join(scratch, "shell.log"), "ab")
        self.proc = subprocess.Popen(["bash", "--noprofile", "--norc"], stdin=subprocess.PIPE, stdout=self.log,
                                     stderr=subprocess.STDOUT, cwd=workdir, env=env, start_new_session=True)
        self._send("set -e")

    def _send(self, line: str) -> None:
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()

    def run(self, block: Block, timeout: float = 120.0) -> tuple[int, str]:
        """Run ``block``; (exit code, what it printed).  A step expected to succeed that fails ends the
        shell (``set -e``): AssertionError with its output."""
        self.steps += 1
        script, out, rc = (os.path.join(self.scratch, f"step-{self.steps}.{x}") for x in ("sh", "out", "rc"))
        with open(script, "w") as f:
            f.write(block.text + "\n")
        if block.expect_exit:
            self._send(f"( source {script} ) > {out} 2>&1 && echo 0 > {rc} || echo $? > {rc}")
        else:
            self._send(f"source {script} > {out} 2>&1; echo $? > {rc}")
        wait_for(lambda: os.path.exists(rc) and os.path.getsize(rc) or self.proc.poll() is not None, timeout,
                 what=f"the step under {block.heading!r} to finish")
        output = open(out, errors="replace").read() if os.path.exists(out) else ""
        if not (os.path.exists(rc) and os.path.getsize(rc)):
            raise AssertionError(f"the step under {block.heading!r} failed (the shell exited with "
                                 f"{self.proc.returncode}):\n{block.text}\n--- it printed:\n{output}")
        return int(open(rc).read()), output

    def close(self) -> None:
        """End the shell and every process it started (its process group), by the group's id."""
        if self.proc.poll() is None:
            try:
                self._send("exit")
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
        self._signal_group(signal.SIGTERM)
        try:
            wait_for(lambda: not self._signal_group(0), 15, what="the doc's processes to exit")
        except AssertionError:
            self._signal_group(signal.SIGKILL)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            self.proc.wait(10)
        self.log.close()

    def close_after(self, request) -> None:
        """``close``, printing first the last 40 lines of each log the doc left in its directory unless the
        test (pytest's ``request``) passed."""
        rep = getattr(request.node, "rep_call", None)
        if rep is None or rep.failed:
            for log in sorted(glob.glob(os.path.join(self.workdir, "*.log"))):
                print(f"----- {os.path.basename(log)} -----\n" + "".join(open(log, errors="replace").readlines()[-40:]))
        self.close()

    def _signal_group(self, sig: int) -> bool:
        """Send ``sig`` to the shell's process group; False when no process of it is left."""
        try:
            os.killpg(self.proc.pid, sig)
            return True
        except ProcessLookupError:
            return False
