"""``pidctl acl ...``: ACLs, stored in the quorum."""
from __future__ import annotations

import asyncio

import click

from quorum.security import acl as acls

from . import render
from .common import pidctl_command, run


def _acl_options(fn):
    for option in reversed([
        click.option("--principal", required=True, help="User:<name>, or User:* for everyone."),
        click.option("--operation", required=True, type=click.Choice(acls.OPERATIONS, case_sensitive=False)),
        click.option("--permission", type=click.Choice(acls.PERMISSIONS, case_sensitive=False), default=acls.ALLOW,
                     show_default=True),
        click.option("--cluster", is_flag=True, help="The cluster resource (kafka-cluster)."),
        click.option("--transactional-id", help="A transactional id, a prefix (--prefixed), or '*'."),
        click.option("--topic", help="A topic, a prefix (--prefixed), or '*' (WRITE: Produce; DESCRIBE: DescribeProducers)."),
        click.option("--group", help="A consumer group, a prefix (--prefixed), or '*' (READ: join, commit, fetch "
                                      "offsets; DESCRIBE: describe, list; DELETE: DeleteGroups)."),
        click.option("--prefixed", is_flag=True, help="--transactional-id / --topic / --group is a prefix."),
        click.option("--host", default=acls.WILDCARD, show_default=True, help="Client address, '*' for any."),
    ]):
        fn = option(fn)
    return fn


def _acl(principal, operation, permission, cluster, transactional_id, topic, group, prefixed, host) -> acls.Acl:
    if [cluster, transactional_id is not None, topic is not None, group is not None].count(True) != 1:
        raise click.UsageError("give exactly one of --cluster, --transactional-id NAME, --topic NAME or --group NAME")
    if cluster:
        if prefixed:
            raise click.UsageError("--prefixed applies to --transactional-id, --topic and --group only")
        rtype, name, pattern = acls.CLUSTER, acls.CLUSTER_NAME, acls.LITERAL
    else:
        rtype, name = next((t, n) for t, n in ((acls.TRANSACTIONAL_ID, transactional_id), (acls.TOPIC, topic),
                                                (acls.GROUP, group)) if n is not None)
        pattern = acls.PREFIXED if prefixed else acls.LITERAL
    try:
        return acls.Acl(principal, rtype, name, pattern, operation.upper(), permission.upper(), host).validate()
    except acls.AclError as e:  # a malformed option (e.g. --principal foo): a usage error, before any request
        raise click.UsageError(str(e)) from None


def _describe(e: acls.Acl) -> str:
    pattern = "" if e.pattern_type == acls.LITERAL else f" ({e.pattern_type.lower()})"
    return (f"{e.permission} {e.principal} {e.operation} on {e.resource_type} {e.resource_name!r}{pattern}"
            f" from {e.host}")


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
