"""``python -m broker ...``: the same as ``pidctl broker start ...``."""
import sys

from cli.main import cli

if __name__ == "__main__":
    sys.exit(cli.main(args=["broker", "start", *sys.argv[1:]], prog_name="python -m broker"))
