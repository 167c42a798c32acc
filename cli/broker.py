"""``pidctl broker ...``: brokers, their registrations and the Kafka-protocol front end (and ``pidctl allocate``)."""
from __future__ import annotations

import asyncio
import sys
import uuid

import click

from broker.frontend import BrokerConfig
from broker.run import run_broker
from quorum.node import setup_logging
from security.client import ClientSecurity
from telemetry.metrics import MetricsUnavailable, read_metrics

from . import render
from .common import EXIT_ERROR, EXIT_UNAVAILABLE, Ctx, handle_errors, log_format_option, output_option, run


@click.group()
def broker():
    """Brokers: registrations, and the Kafka-protocol front end."""


@broker.command("start")
@click.option("--broker-id", type=click.IntRange(0, 2**31 - 1), required=True)
@click.option("--quorum", "quorum_opt", help="Quorum client addresses host:port,... (default: the local cluster's).")
@click.option("--listen", default="127.0.0.1:9092", show_default=True, help="host:port to serve Kafka clients on.")
@click.option("--advertised", help="host:port put in Metadata (default: --listen).")
@click.option("--data-dir", "broker_dir", help="Where partitions live (default: ./.pidquorum-broker-N).")
@click.option("--partitions", type=click.IntRange(1, 10_000), default=1, show_default=True,
              help="Partitions of an auto-created topic.")
@click.option("--no-dedup", is_flag=True, help="Turn idempotence checks off (only to show what they prevent).")
@click.option("--producer-id-expiration-ms", type=click.IntRange(1), default=24 * 3600 * 1000, show_default=True)
@click.option("--producer-id-quota-window-num", type=click.IntRange(1, 1000), default=11, show_default=True,
              help="KIP-936 producer.id.quota.window.num: windows a producer ID is remembered (and the burst).")
@click.option("--producer-id-quota-window-size-s", type=click.FloatRange(0, 7 * 86400, min_open=True), default=3600.0,
              show_default=True, help="KIP-936 producer.id.quota.window.size.seconds.")
@click.option("--quota-refresh-s", type=click.FloatRange(0, 3600, min_open=True), default=1.0, show_default=True,
              help="How often the client quotas are read from the quorum.")
@click.option("--ready-file", type=click.Path(dir_okay=False), help="Written with 'pid port' once serving.")
@click.option("--log-level", default="INFO", show_default=True)
@log_format_option
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Serve Prometheus metrics on this port (0 = off).")
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="Address the metrics port binds to.")
@click.option("--sasl-credentials-file", type=click.Path(dir_okay=False),
              help="Require SASL (PLAIN, SCRAM-SHA-256) from clients, with these users; ACLs are then enforced.")
@click.option("--sasl-mechanism", "sasl_mechanisms", multiple=True, type=click.Choice(["PLAIN", "SCRAM-SHA-256"]),
              help="Enabled mechanisms (repeat; default: both).")
@click.option("--super-user", "super_users", multiple=True, help="User:<name> the ACLs never refuse (repeat).")
@click.option("--acl-refresh-ms", type=click.IntRange(10), default=1000, show_default=True,
              help="How often the ACLs are read from the quorum.")
@click.option("--tls-certfile", type=click.Path(dir_okay=False), help="Serve TLS with this certificate (chain).")
@click.option("--tls-keyfile", type=click.Path(dir_okay=False))
@click.option("--tls-cafile", type=click.Path(dir_okay=False), help="CA of client certificates (--tls-client-auth).")
@click.option("--tls-client-auth", is_flag=True, help="Require client certificates (mutual TLS).")
@click.option("--quorum-security-protocol", default="PLAINTEXT", show_default=True,
              type=click.Choice(["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]), help="How to reach the quorum.")
@click.option("--quorum-sasl-mechanism", default="PLAIN", show_default=True,
              type=click.Choice(["PLAIN", "SCRAM-SHA-256"]))
@click.option("--quorum-sasl-username", envvar="PIDQUORUM_BROKER_SASL_USERNAME",
              help="The broker's user on the quorum (needs CLUSTER_ACTION).")
@click.option("--quorum-sasl-password", envvar="PIDQUORUM_BROKER_SASL_PASSWORD",
              help="Prefer the environment variable PIDQUORUM_BROKER_SASL_PASSWORD.")
@click.option("--quorum-tls-cafile", type=click.Path(dir_okay=False), help="CA of the quorum's certificates.")
@click.pass_obj
@handle_errors
def broker_start(obj: Ctx, broker_id, quorum_opt, listen, advertised, broker_dir, partitions, no_dedup,
                 producer_id_expiration_ms, producer_id_quota_window_num,
                 producer_id_quota_window_size_s, quota_refresh_s, ready_file, log_level, sasl_credentials_file,
                 sasl_mechanisms, super_users, acl_refresh_ms, tls_certfile, tls_keyfile, tls_cafile, tls_client_auth,
                 quorum_security_protocol, quorum_sasl_mechanism, quorum_sasl_username, quorum_sasl_password,
                 quorum_tls_cafile, log_format=None, metrics_port=0, metrics_host="127.0.0.1"):
    """Run a Kafka-protocol broker in the foreground until SIGTERM.

    Producer IDs come from quorum-allocated blocks; idempotent produce with
    sequence checks; InitProducerId with KIP-360 epochs for transactional ids.
    """

    setup_logging(log_level, log_format or "human")
    quorum = [a.strip() for a in quorum_opt.split(",") if a.strip()] if quorum_opt else obj.addresses()
    try:
        quorum_security = obj.security
        if quorum_security_protocol != "PLAINTEXT":
            quorum_security = ClientSecurity(quorum_security_protocol, quorum_sasl_mechanism, quorum_sasl_username,
                                             quorum_sasl_password, quorum_tls_cafile)
        security = {"sasl_credentials_file": sasl_credentials_file, "super_users": tuple(super_users),
                    "acl_refresh_s": acl_refresh_ms / 1000, "tls_certfile": tls_certfile, "tls_keyfile": tls_keyfile,
                    "tls_cafile": tls_cafile, "tls_client_auth": tls_client_auth, "quorum_security": quorum_security}
        if sasl_mechanisms:
            security["sasl_mechanisms"] = tuple(sasl_mechanisms)
        cfg = BrokerConfig(broker_id=broker_id, quorum=quorum, listen=listen, advertised=advertised,
                           data_dir=broker_dir or f".pidquorum-broker-{broker_id}", default_partitions=partitions,
                           dedup=not no_dedup,
                           producer_id_expiration_ms=producer_id_expiration_ms, metrics_port=metrics_port,
                           metrics_host=metrics_host,
                           producer_id_quota_window_num=producer_id_quota_window_num,
                           producer_id_quota_window_size_s=producer_id_quota_window_size_s,
                           quota_refresh_s=quota_refresh_s, **security)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    sys.exit(run_broker(cfg, ready_file))


@broker.command("status")
@click.option("--metrics", "address", required=True, metavar="HOST:PORT",
              help="The broker's metrics endpoint (broker start --metrics-port).")
@output_option
@click.pass_obj
def broker_status(obj: Ctx, address, output):
    """A broker's figures, read from its metrics endpoint: PIDs issued, prefetch hits and misses,
    COORDINATOR_LOAD_IN_PROGRESS answers, duplicates, fenced producers, quotas per principal."""

    try:
        figures = read_metrics(address, timeout=obj.timeout)
    except MetricsUnavailable as e:
        render.error(str(e))
        sys.exit(EXIT_UNAVAILABLE)
    if not any(name.startswith("pidquorum_broker") for name in figures):
        render.error(f"{address} serves no broker metrics (a quorum node's endpoint?)")
        sys.exit(EXIT_ERROR)
    render.metrics_status(output, address, figures)


@broker.command("register")
@click.option("--broker-id", type=int, required=True)
@click.option("--incarnation", type=click.UUID, help="Incarnation id (default: a new one).")
@click.option("--listener", default="", help="host:port the broker serves on.")
@output_option
@click.pass_obj
@handle_errors
def broker_register(obj: Ctx, broker_id, incarnation, listener, output):
    incarnation = incarnation or uuid.uuid4()
    epoch = asyncio.run(run(lambda c: c.register_broker(broker_id, incarnation, listener))(obj.client()))
    result = {"broker_id": broker_id, "broker_epoch": epoch, "incarnation_id": str(incarnation)}
    if output == "json":
        render.emit_json(result)
    else:
        render.line(str(epoch))


# ----------------------------------------------------------------- allocate
@click.command("allocate")
@click.option("--broker-id", type=int, required=True)
@click.option("--broker-epoch", type=int, required=True)
@click.option("--count", type=click.IntRange(1, 1_000_000), default=1, show_default=True, help="Blocks to allocate.")
@output_option
@click.pass_obj
@handle_errors
def allocate(obj: Ctx, broker_id, broker_epoch, count, output):
    """Allocate producer-ID blocks for a broker (AllocateProducerIds)."""
    async def go(client):
        return [await client.allocate(broker_id, broker_epoch) for _ in range(count)]

    got = asyncio.run(run(go)(obj.client()))
    blocks = [{"broker_id": broker_id, "broker_epoch": broker_epoch, **b.to_dict()} for b in got]
    render.listing(output, blocks, "allocated", ["broker", "epoch", "start", "end (excl.)", "len", "throttle ms"],
                   [[b["broker_id"], b["broker_epoch"], b["producer_id_start"], b["next_producer_id"],
                     b["producer_id_len"], b["throttle_time_ms"]] for b in blocks])
