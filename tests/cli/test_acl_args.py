"""A malformed --principal is a usage error (exit 2, one line), found before any request is sent."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from cli.common import EXIT_USAGE
from cli.main import cli


@pytest.mark.parametrize("args", [["acl", "add", "--principal", "foo", "--operation", "WRITE", "--topic", "t"],
                                  ["acl", "remove", "--principal", "Group:x", "--operation", "READ", "--cluster"],
                                  ["acl", "add", "--principal", "User:", "--operation", "WRITE", "--topic", "t"],
                                  ["acl", "list", "--principal", "alice"]])
def test_a_malformed_principal_is_a_usage_error(tmp_path, args):
    r = CliRunner().invoke(cli, ["--data-dir", str(tmp_path / "none"), *args])
    assert r.exit_code == EXIT_USAGE, r.output
    assert "must be User:<name>" in r.output and "Traceback" not in r.output
