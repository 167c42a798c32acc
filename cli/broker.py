"""``pidctl broker ...``: brokers, their registrations and the Kafka-protocol front end (and ``pidctl allocate``)."""
from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
import uuid

import click

import quorum.settings.flags as settings_flags
from broker.config import BrokerConfig
from broker.config import load as load_broker_config
from broker.run import run_broker
from quorum.managers import DEFAULT_BROKER_SESSION_TIMEOUT_MS, duplicate_registration_message
from quorum.node import setup_logging
from quorum.settings import ConfigError
from quorum.telemetry.metrics import MetricsUnavailable, read_metrics
from records.wire.errors import DuplicateBrokerRegistrationError, PidQuorumError

from . import render
from .common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    INT64_MAX,
    Addresses,
    Ctx,
    broker_id_option,
    handle_errors,
    output_option,
    pidctl_command,
    run,
)
from .progress import Bar


@click.group()
def broker():
    """Brokers: registrations, and the Kafka-protocol front end."""


@broker.command("start")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="A broker settings file (TOML, deploy/broker.toml); the flags given override it.")
@settings_flags.options(BrokerConfig)
@click.option("--ready-file", type=click.Path(dir_okay=False), help="Written with 'pid port' once serving.")
@click.option("--log-level", default="INFO", show_default=True)
@click.pass_context
@handle_errors
def broker_start(ctx: click.Context, config_path, ready_file, log_level, **_settings):
    """Run a Kafka-protocol broker in the foreground until SIGTERM.

    Producer IDs come from quorum-allocated blocks; idempotent produce with
    sequence checks; InitProducerId with KIP-360 epochs for transactional ids.
    Settings come from --config (a TOML file), each flag given in place of the
    file's, and the defaults shown for the rest.
    """

    obj: Ctx = ctx.obj
    flags = settings_flags.given(ctx, BrokerConfig)
    setup_logging(log_level, flags.get("log_format", "human"))
    if config_path is None and "broker_id" not in flags:
        raise click.MissingParameter(ctx=ctx, param_hint="'--broker-id' (or broker_id in a --config file)",
                                     param_type="option")
    try:
        cfg = load_broker_config(config_path, flags, quorum=obj.addresses)
    except ConfigError as e:
        if config_path is None:  # flags only: a usage error, as ever
            raise click.UsageError(str(e)) from None
        raise
    if cfg.quorum_security is None and obj.security is not None:
        cfg = dataclasses.replace(cfg, quorum_security=obj.security)  # pidctl's own --security-protocol ...
    if "log_format" not in flags and cfg.log_format != "human":
        setup_logging(log_level, cfg.log_format)
    sys.exit(run_broker(cfg, ready_file))


@broker.command("status")
@click.option("--metrics", "address", required=True, type=Addresses(one=True),
              help="The broker's metrics endpoint: a broker serves one only when started with --metrics-port.")
@output_option
@click.pass_obj
def broker_status(obj: Ctx, address, output):
    """A broker's figures, read from its metrics endpoint: PIDs issued, prefetch hits and misses,
    COORDINATOR_LOAD_IN_PROGRESS answers, duplicates, fenced producers, quotas per principal."""

    try:
        figures = read_metrics(address, timeout=obj.timeout)
    except MetricsUnavailable as e:
        render.error(f"{e} (a broker serves metrics only when started with --metrics-port PORT)")
        sys.exit(EXIT_UNAVAILABLE)
    if not any(name.startswith("pidquorum_broker") for name in figures):
        render.error(f"{address} serves no broker metrics (a quorum node's endpoint?)")
        sys.exit(EXIT_ERROR)
    render.metrics_status(output, address, figures)


@broker.command("register")
@broker_id_option
@click.option("--incarnation", type=click.UUID, help="Incarnation id (default: a new one).")
@click.option("--listener", type=Addresses(one=True), help="host:port the broker serves on.")
@pidctl_command
def broker_register(obj: Ctx, broker_id, incarnation, listener, output):
    """Register a broker id and print its new epoch (alone on the line: EPOCH=$(pidctl broker register ...))."""
    incarnation = incarnation or uuid.uuid4()
    try:
        epoch = asyncio.run(run(lambda c: c.register_broker(broker_id, incarnation, listener or ""))(obj.client()))
    except PidQuorumError as e:
        # BrokerRegistration's answer has no message field: a refusal of DUPLICATE_BROKER_REGISTRATION (101,
        # which the client library reads as UNKNOWN_SERVER_ERROR) is named from the leader's state.
        if e.code.name not in ("DUPLICATE_BROKER_REGISTRATION", "UNKNOWN_SERVER_ERROR"):
            raise
        holder = asyncio.run(run(lambda c: _live_holder(c, broker_id, str(incarnation)))(obj.client()))
        if holder is None:
            raise
        raise DuplicateBrokerRegistrationError(holder) from None  # one line, exit 4 (refused)
    result = {"broker_id": broker_id, "broker_epoch": epoch, "incarnation_id": str(incarnation)}
    if output == "json":
        render.emit_json(result)
    else:
        render.line(str(epoch))


async def _live_holder(client, broker_id: int, incarnation: str) -> str | None:
    """The refusal's message if another incarnation holds ``broker_id`` with a session (else None)."""
    try:
        _, state = await client.find_leader(0)
    except Exception:  # noqa: BLE001 - only an explanation: the original error is shown instead
        return None
    for b in state.get("state", {}).get("brokers", []):
        heartbeat = b.get("last_heartbeat_ms")
        if b.get("broker_id") == broker_id and b.get("incarnation_id") != incarnation and heartbeat is not None \
                and not b.get("fenced"):
            expires = heartbeat + DEFAULT_BROKER_SESSION_TIMEOUT_MS
            return duplicate_registration_message(broker_id, b["incarnation_id"], expires, int(time.time() * 1000))
    return None


# ----------------------------------------------------------------- allocate
@click.command("allocate")
@broker_id_option
@click.option("--broker-epoch", type=click.IntRange(0, INT64_MAX), required=True,
              help="The epoch its registration returned (pidctl broker register).")
@click.option("--count", type=click.IntRange(1, 1_000_000), default=1, show_default=True, help="Blocks to allocate.")
@pidctl_command
def allocate(obj: Ctx, broker_id, broker_epoch, count, output):
    """Allocate producer-ID blocks for a broker (AllocateProducerIds).  A progress bar on a terminal; Ctrl-C
    reports the blocks allocated so far (exit 130)."""
    got: list = []

    async def go(client):
        with Bar(f"broker {broker_id}", total=count, unit="blocks") as bar:
            for _ in range(count):
                got.append(await client.allocate(broker_id, broker_epoch))
                bar.advance()

    try:
        asyncio.run(run(go)(obj.client()))
    except KeyboardInterrupt:
        _report_partial(output, broker_id, broker_epoch, got, count, "interrupted")
        sys.exit(EXIT_INTERRUPTED)
    except PidQuorumError as e:
        if got:
            _report_partial(output, broker_id, broker_epoch, got, count, f"stopped by {e.code.name}")
        if e.code.name != "STALE_BROKER_EPOCH":
            raise
        current = asyncio.run(run(lambda c: _registered_epoch(c, broker_id))(obj.client()))
        if current is None:
            raise
        render.error(_stale_epoch_message(broker_id, broker_epoch, current))
        sys.exit(EXIT_REFUSED)
    render.listing(output, _block_dicts(broker_id, broker_epoch, got), "allocated",
                   ["broker", "epoch", "start", "end (excl.)", "len", "throttle ms"],
                   [[broker_id, broker_epoch, b.start, b.next_id, b.length, b.throttle_ms] for b in got])


def _block_dicts(broker_id: int, broker_epoch: int, blocks: list) -> list[dict]:
    return [{"broker_id": broker_id, "broker_epoch": broker_epoch, **b.to_dict()} for b in blocks]


def id_ranges(blocks: list) -> list[tuple[int, int]]:
    """The blocks' producer IDs as [start, end) ranges, adjacent blocks joined."""
    out: list[list[int]] = []
    for b in sorted(blocks, key=lambda b: b.start):
        if out and out[-1][1] == b.start:
            out[-1][1] = b.next_id
        else:
            out.append([b.start, b.next_id])
    return [(start, end) for start, end in out]


def _report_partial(output: str, broker_id: int, broker_epoch: int, got: list, count: int, why: str) -> None:
    """What an allocation cut short did: the blocks as JSON on stdout (-o json), one line on stderr."""
    if output == "json":
        render.emit_json(_block_dicts(broker_id, broker_epoch, got))
    ranges = id_ranges(got)
    shown = ", ".join(f"{start}..{end - 1}" for start, end in ranges[:5]) + (", ..." if len(ranges) > 5 else "")
    ids = f": producer IDs {shown} ({len(ranges)} range{'s' if len(ranges) != 1 else ''})" if ranges else ""
    render.warn(f"{why}: {len(got)} of {count} blocks allocated for broker {broker_id} (epoch {broker_epoch}){ids}; "
                "a request in flight may have allocated one more (pidctl blocks history lists every block)")


async def _registered_epoch(client, broker_id: int) -> int | None:
    """The broker's registered epoch in the leader's state: -1 if it is not registered, None if unknown."""
    try:
        _, state = await client.find_leader(0)
    except Exception:  # noqa: BLE001 - only an explanation: the original error is shown instead
        return None
    for b in state.get("state", {}).get("brokers", []):
        if b.get("broker_id") == broker_id:
            return int(b["broker_epoch"])
    return -1


def _stale_epoch_message(broker_id: int, given: int, current: int) -> str:
    if current < 0:
        return (f"STALE_BROKER_EPOCH: broker {broker_id} is not registered (given epoch {given}): "
                f"register it first (pidctl broker register --broker-id {broker_id})")
    return (f"STALE_BROKER_EPOCH: broker {broker_id}'s current epoch is {current} (given {given}): "
            f"pass --broker-epoch {current}, or register it again")
