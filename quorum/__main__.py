"""``python -m quorum --config FILE``: run one node (what ``pidctl node start`` runs)."""
import argparse
import sys

from quorum.migration.bridge import ZooKeeperBridge  # the entry point composes the node: migration's hook

from .config import ConfigError, load
from .node import run_node, setup_logging


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m quorum")
    ap.add_argument("--config", required=True)
    ap.add_argument("--ready-file")
    ap.add_argument("--log-level", default="INFO")
    ap.add_argument("--trust-own-log", action="store_true",
                    help="The operator's word that this data directory was not restored from a copy: count "
                         "without waiting for the peers' word (only when a peer is lost for good).")
    ap.add_argument("--log-format", choices=["human", "json"],
                    help="Log lines as text or one JSON object per line (default: the config's log_format).")
    args = ap.parse_args()
    setup_logging(args.log_level, args.log_format or "human")
    try:
        cfg = load(args.config)
    except ConfigError as e:
        print(f"pidquorum: {e}", file=sys.stderr)
        return 2
    if args.log_format is None and cfg.log_format != "human":
        setup_logging(args.log_level, cfg.log_format)
    return run_node(cfg, args.ready_file, trust_own_log=args.trust_own_log, zookeeper=ZooKeeperBridge())


if __name__ == "__main__":
    sys.exit(main())
