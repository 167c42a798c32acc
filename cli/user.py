"""``pidctl user ...``: the users of a SASL credentials file."""
from __future__ import annotations

import sys

import click

from quorum.security import credentials

from . import render
from .common import handle_errors, output_option


@click.group()
def user():
    """Users of a SASL credentials file (stored as salted SCRAM-SHA-256 keys; they serve PLAIN too)."""


_file_option = click.option("--file", "path", required=True, type=click.Path(dir_okay=False),
                            help="The credentials file (the servers' sasl_credentials_file).")


@user.command("add")
@click.argument("name")
@_file_option
@click.option("--password-stdin", is_flag=True, help="Read the password from the first line of stdin.")
@click.option("--iterations", type=click.IntRange(credentials.MIN_ITERATIONS, credentials.MAX_ITERATIONS),
              default=credentials.DEFAULT_ITERATIONS, show_default=True, help="PBKDF2 iterations.")
@output_option
@handle_errors
def user_add(name, path, password_stdin, iterations, output):
    """Create NAME, or set a new password (and salt) for it.  -o json: user, file, added (false: the
    password of an existing user was replaced), mechanism, iterations."""
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt(f"password for {name}", hide_input=True, confirmation_prompt=True,
                                err=output == "json")  # stdout carries only the JSON
    new = credentials.add_user(path, name, password, iterations)
    if output == "json":
        entry = next((r for r in credentials.list_users(path) if r["user"] == name), {})
        render.emit_json({"user": name, "file": path, "added": new, **{k: v for k, v in entry.items()
                                                                        if k != "user"}})
    else:
        render.line(f"user {name} {'added to' if new else 'updated in'} {path}")


@user.command("remove")
@click.argument("name")
@_file_option
@handle_errors
def user_remove(name, path):
    if not credentials.remove_user(path, name):
        raise credentials.CredentialsError(f"{path}: no user {name!r}")
    render.line(f"user {name} removed from {path}")


@user.command("list")
@_file_option
@output_option
@handle_errors
def user_list(path, output):
    rows = credentials.list_users(path)
    render.listing(output, rows, f"users in {path}", ["user", "mechanism", "iterations"],
                   [[r["user"], r["mechanism"], r["iterations"]] for r in rows])
