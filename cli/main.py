"""pidctl: ``pidctl <noun> <verb>``, thin commands over library calls.

Exit codes (docs/cli.md lists them, with a node's and a broker's): 0 ok, 1 error, 2 usage, 3 unavailable or
timed out, 4 refused by the quorum, 5 a checker found an anomaly, 6 degraded (``quorum status``),
130 interrupted.  User mistakes print one line, no traceback.  The global options may come before the
command or after it (``accept_global_options``).
"""
from __future__ import annotations

import sys

import click

from . import acl, audit, bench, blocks, broker, chaos, cluster, migrate, node, quorum, quota, snapshot, txn, user
from .common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    Ctx,
    accept_global_options,
    client_security,
    global_options,
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@global_options
@click.version_option(package_name="pidquorum", prog_name="pidctl", message="%(prog)s %(version)s")
@click.pass_context
def cli(ctx, data_dir, quorum, timeout, security_protocol, sasl_mechanism, sasl_username, sasl_password,
        sasl_password_file, tls_cafile):
    """pidquorum: producer-ID blocks from a Raft quorum.

    The options below may also follow the command (pidctl quorum status --quorum HOST:PORT); exit codes and
    environment variables: docs/cli.md."""
    if sasl_password_file is not None:  # the file's text (quorum.settings.flags.secret_parameters)
        sasl_password = sasl_password_file
    options = {"security_protocol": security_protocol, "sasl_mechanism": sasl_mechanism,
               "sasl_username": sasl_username, "sasl_password": sasl_password, "tls_cafile": tls_cafile}
    ctx.obj = Ctx(data_dir, quorum, timeout, client_security(**options), options)


for _command in (cluster.cluster, cluster.demo, node.node, broker.broker, broker.allocate, blocks.blocks,
                 quorum.quorum, snapshot.snapshot, migrate.migrate, quota.quota, chaos.chaos, audit.audit,
                 bench.bench, txn.txn, user.user, acl.acl):
    cli.add_command(_command)
accept_global_options(cli)  # last: every command registered above


def main() -> None:
    try:
        cli.main(prog_name="pidctl", standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(EXIT_INTERRUPTED)
    except click.exceptions.NoArgsIsHelpError as e:  # a group without its command: its help
        e.show()
        sys.exit(EXIT_USAGE)
    except click.UsageError as e:  # click's "Error:" line alone (not the usage and "Try ... --help" above it)
        click.echo(f"Error: {e.format_message()}", err=True)
        sys.exit(EXIT_USAGE)
    except click.ClickException as e:
        e.show()
        sys.exit(EXIT_ERROR)
    except SystemExit:
        raise


if __name__ == "__main__":
    main()
