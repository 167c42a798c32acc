"""docs/cli.md lists every exit code and environment variable pidctl has; cli/main.py's docstring agrees."""
from __future__ import annotations

import os
import re

import click

import cli.common as common
import cli.main as main
from broker import run as broker_run
from snapshots.storage import disk

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def doc() -> str:
    return open(os.path.join(ROOT, "docs", "cli.md"), encoding="utf-8").read()


def section(title: str) -> str:
    return doc().split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def table_codes(text: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(0) for m in re.finditer(r"^\| (\d+) \|.*$", text, re.M)}


def test_every_exit_code_of_pidctl_is_in_docs_cli_md_and_the_main_docstring():
    codes = {name: value for name, value in vars(common).items() if name.startswith("EXIT_")}
    rows = table_codes(section("pidctl's exit codes"))
    assert set(rows) == set(codes.values())
    for name, value in codes.items():
        assert f"`{name}`" in rows[value], name
        assert re.search(rf"\b{value} ", main.__doc__), (name, main.__doc__)
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    assert "docs/cli.md" in readme


def test_a_nodes_and_a_brokers_exit_codes_are_in_docs_cli_md():
    node = table_codes(section("A node's exit codes (`pidctl node start`, `python -m quorum`)"))
    assert {v for k, v in vars(disk).items() if k.startswith("EXIT_")} <= set(node)
    broker = table_codes(section("A broker's exit codes (`pidctl broker start`, `python -m broker`)"))
    assert {v for k, v in vars(broker_run).items() if k.startswith("EXIT_")} <= set(broker)


def test_every_environment_variable_of_a_pidctl_option_is_in_docs_cli_md():
    envvars = set()

    def walk(command: click.Command) -> None:
        envvars.update(p.envvar for p in command.params if isinstance(p.envvar, str))
        for sub in getattr(command, "commands", {}).values():
            walk(sub)
    walk(main.cli)
    table = section("Environment variables")
    assert {"PIDQUORUM_DIR", "PIDQUORUM_QUORUM", "PIDQUORUM_SECURITY_PROTOCOL", "PIDQUORUM_SASL_PASSWORD"} <= envvars
    assert [v for v in sorted(envvars) if f"`{v}`" not in table] == []
