"""``pidctl node start``: one node of a real deployment."""
from __future__ import annotations

import sys

import click

from quorum.config import load
from quorum.node import run_node, setup_logging

from .common import handle_errors, log_format_option


@click.group()
def node():
    """One node of a real deployment."""


@node.command("start")
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--log-level", default="INFO", show_default=True)
@click.option("--trust-own-log", is_flag=True,
              help="Your word that this data directory is the one the node last ran on, not a restored copy: "
                   "it counts without waiting for its peers to vouch.  Only when a peer is lost for good "
                   "(docs/operations.md).")
@log_format_option
@handle_errors
def node_start(config_path, log_level, log_format, trust_own_log):
    """Run a node in the foreground until SIGTERM."""
    from quorum.migration.bridge import ZooKeeperBridge  # heavy (kazoo): imported when used

    setup_logging(log_level, log_format or "human")
    cfg = load(config_path)
    if log_format is None and cfg.log_format != "human":
        setup_logging(log_level, cfg.log_format)
    sys.exit(run_node(cfg, trust_own_log=trust_own_log, zookeeper=ZooKeeperBridge()))
