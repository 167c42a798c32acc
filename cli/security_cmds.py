"""``pidctl user ...`` (the SASL credentials file) and ``pidctl acl ...`` (ACLs in the quorum)."""
from __future__ import annotations

import asyncio
import sys

import click

from quorum.security import acl as acls
from quorum.security import credentials

from . import render
from .common import handle_errors, output_option, pidctl_command, run


def _acl_options(fn):
    for option in reversed([
        click.option("--principal", required=True, help="User:<name>, or User:* for everyone."),
        click.option("--operation", required=True, type=click.Choice(acls.OPERATIONS, case_sensitive=False)),
        click.option("--permission", type=click.Choice(acls.PERMISSIONS, case_sensitive=False), default=acls.ALLOW,
                     show_default=True),
        click.option("--cluster", is_flag=True, help="The cluster resource (kafka-cluster)."),
        click.option("--transactional-id", help="A transactional id, a prefix (--prefixed), or '*'."),
        click.option("--topic", help="A topic, a prefix (--prefixed), or '*' (WRITE: Produce; DESCRIBE: DescribeProducers)."),
        click.option("--prefixed", is_flag=True, help="--transactional-id / --topic is a prefix."),
        click.option("--host", default=acls.WILDCARD, show_default=True, help="Client address, '*' for any."),
    ]):
        fn = option(fn)
    return fn


def _acl(principal, operation, permission, cluster, transactional_id, topic, prefixed, host) -> acls.Acl:
    if [cluster, transactional_id is not None, topic is not None].count(True) != 1:
        raise click.UsageError("give exactly one of --cluster, --transactional-id NAME or --topic NAME")
    if cluster:
        if prefixed:
            raise click.UsageError("--prefixed applies to --transactional-id and --topic only")
        rtype, name, pattern = acls.CLUSTER, acls.CLUSTER_NAME, acls.LITERAL
    else:
        rtype, name = (acls.TRANSACTIONAL_ID, transactional_id) if topic is None else (acls.TOPIC, topic)
        pattern = acls.PREFIXED if prefixed else acls.LITERAL
    try:
        return acls.Acl(principal, rtype, name, pattern, operation.upper(), permission.upper(), host).validate()
    except acls.AclError as e:  # a malformed option (e.g. --principal foo): a usage error, before any request
        raise click.UsageError(str(e)) from None


def _describe(e: acls.Acl) -> str:
    pattern = "" if e.pattern_type == acls.LITERAL else f" ({e.pattern_type.lower()})"
    return (f"{e.permission} {e.principal} {e.operation} on {e.resource_type} {e.resource_name!r}{pattern}"
            f" from {e.host}")


# ----------------------------------------------------------------- user
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


# ------------------------------------------------------------------ acl
@click.group()
def acl():
    """ACLs, stored in the quorum (enforced where SASL is on)."""


def _alter(obj, action: str, entry: acls.Acl, output: str) -> None:
    changed = asyncio.run(run(lambda c: c.alter_acl(action, entry))(obj.client()))
    if output == "json":
        render.emit_json({"action": action, "changed": changed, "acl": entry.to_dict()})
    elif changed:
        render.line(f"{'added' if action == 'add' else 'removed'}: {_describe(entry)}")
    else:
        render.line(f"unchanged (already {'there' if action == 'add' else 'absent'}): {_describe(entry)}")


@acl.command("add")
@_acl_options
@pidctl_command
def acl_add(obj, output, **kw):
    """Add an entry, e.g. --principal User:broker --operation CLUSTER_ACTION --cluster."""
    _alter(obj, "add", _acl(**kw), output)


@acl.command("remove")
@_acl_options
@pidctl_command
def acl_remove(obj, output, **kw):
    """Remove an entry (all its fields must match)."""
    _alter(obj, "remove", _acl(**kw), output)


@acl.command("list")
@click.option("--principal", default="", help="Only this principal's entries.")
@pidctl_command
def acl_list(obj, principal, output):
    """The entries, as the answering node has applied them."""
    kind, sep, name = principal.partition(":")
    if principal and (kind != "User" or not sep or not name):
        raise click.UsageError(f"principal {principal!r} must be User:<name> (or User:* for everyone)")
    entries, applied = asyncio.run(run(lambda c: c.describe_acls(principal))(obj.client()))
    render.listing(output, [e.to_dict() for e in entries], f"ACLs (applied index {applied})",
                   ["principal", "permission", "operation", "resource type", "name", "pattern", "host"],
                   [[e.principal, e.permission, e.operation, e.resource_type, e.resource_name, e.pattern_type,
                     e.host] for e in entries])
