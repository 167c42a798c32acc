"""``pidctl quota ...``: client quotas kept in the quorum (KIP-936)."""
from __future__ import annotations

import asyncio
import sys

import click

from broker.quota import read_stats
from quorum.client_quotas import PRODUCER_IDS_RATE, check_value, entity_name, parse_user
from records.wire.errors import PidQuorumError

from . import render
from .common import EXIT_ERROR, Ctx, handle_errors, output_option, pidctl_command, run


@click.group()
def quota():
    """Client quotas kept in the quorum: producer_ids_rate per user or the user default (KIP-936)."""


def _quota_entity(user: str | None, default: bool) -> str | None:
    if (user is None) == (not default):
        raise click.UsageError("give exactly one of --user USER and --default")
    if default:
        return None
    try:
        return parse_user(user)
    except PidQuorumError as e:
        raise click.UsageError(e.message) from None


@quota.command("set")
@click.option("--user", help="The user (SASL name, or User:<name>; ANONYMOUS for unauthenticated clients).")
@click.option("--default", "default", is_flag=True, help="The default for every user without its own quota.")
@click.option("--producer-ids-rate", "rate", type=float, required=True,
              help="New producer IDs per second (averaged over the brokers' quota window).")
@click.option("--dry-run", is_flag=True, help="Let the quorum check it, commit nothing.")
@pidctl_command
def quota_set(obj: Ctx, user, default, rate, dry_run, output):
    """Set producer_ids_rate for a user or the default (like kafka-configs --entity-type users)."""

    user = _quota_entity(user, default)
    try:
        rate = check_value(PRODUCER_IDS_RATE, rate)
    except PidQuorumError as e:
        raise click.UsageError(e.message) from None
    changed = asyncio.run(run(lambda c: c.alter_client_quota(user, PRODUCER_IDS_RATE, rate,
                                                             validate_only=dry_run))(obj.client()))
    result = {"user": user, "entity": entity_name(user), "key": PRODUCER_IDS_RATE, "value": rate, "changed": changed,
              "dry_run": dry_run}
    if output == "json":
        render.emit_json(result)
    else:
        verb = "would set" if dry_run else "set" if changed else "unchanged:"
        render.line(f"{verb} {PRODUCER_IDS_RATE}={rate:g} for {result['entity']}")


@quota.command("delete")
@click.option("--user", help="The user.")
@click.option("--default", "default", is_flag=True, help="The user default.")
@pidctl_command
def quota_delete(obj: Ctx, user, default, output):
    """Remove producer_ids_rate from a user (the default applies again) or from the default."""

    user = _quota_entity(user, default)
    changed = asyncio.run(run(lambda c: c.alter_client_quota(user, PRODUCER_IDS_RATE, remove=True))(obj.client()))
    result = {"user": user, "entity": entity_name(user), "key": PRODUCER_IDS_RATE, "removed": changed}
    if output == "json":
        render.emit_json(result)
    else:
        render.line(f"{'removed' if changed else 'was not set:'} {PRODUCER_IDS_RATE} of {result['entity']}")


@quota.command("list")
@pidctl_command
def quota_list(obj: Ctx, output):
    """The quotas as the quorum has committed them (read from any node that follows a leader)."""

    entries, node = asyncio.run(run(lambda c: c.describe_client_quotas())(obj.client()))
    rows = [{"user": e["user"], "entity": entity_name(e["user"]), **e["values"]} for e in entries]
    render.quotas(output, rows, node)


@quota.command("status")
@click.option("--broker-dir", "broker_dirs", multiple=True, required=True, type=click.Path(file_okay=False),
              help="A broker's data dir (repeatable): the stats it writes every quota refresh.")
@output_option
@handle_errors
def quota_status(broker_dirs, output):
    """Per principal, on each broker: measured new-PID rate, tokens, throttle time, throttled requests."""

    out = {}
    for d in broker_dirs:
        try:
            out[d] = read_stats(d)
        except (OSError, ValueError) as e:
            render.error(str(e))
            sys.exit(EXIT_ERROR)
    render.quota_status(output, out)
