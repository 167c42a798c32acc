"""``python -m quorum --config FILE``: run one node (what ``pidctl node start`` runs)."""
import argparse
import sys

from .config import ConfigError, load
from .node import run_node, setup_logging


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m quorum")
    ap.add_argument("--config", required=True)
    ap.add_argument("--ready-file")
    ap.add_argument("--log-level", default="INFO")
    args = ap.parse_args()
    setup_logging(args.log_level)
    try:
        cfg = load(args.config)
    except ConfigError as e:
        print(f"pidquorum: {e}", file=sys.stderr)
        return 2
    return run_node(cfg, args.ready_file)


if __name__ == "__main__":
    sys.exit(main())
