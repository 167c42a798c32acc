"""pidctl: ``pidctl <noun> <verb>``, thin commands over library calls.

Exit codes: 0 ok, 1 error, 2 usage, 3 unavailable or timed out, 4 refused by
the quorum, 130 interrupted.  User mistakes print one line, no traceback.
"""
from __future__ import annotations

import sys

import click

from security.client import ClientSecurity
from settings.flags import secret_options

from . import audit, bench, blocks, broker, chaos, cluster, migrate, node, quorum, quota, snapshot
from .common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, Ctx, handle_errors, output_option, run
from .security_cmds import register as _register_security_commands


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--data-dir", envvar="PIDQUORUM_DIR", default=".pidquorum", show_default=True,
              help="Directory of the local cluster (pidctl cluster ...).")
@click.option("--quorum", envvar="PIDQUORUM_QUORUM", help="Client addresses host:port,... (default: the local cluster's).")
@click.option("--timeout", type=float, default=10.0, show_default=True, help="Deadline of one call, in seconds.")
@click.option("--security-protocol", envvar="PIDQUORUM_SECURITY_PROTOCOL", default="PLAINTEXT", show_default=True,
              type=click.Choice(["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]),
              help="How to reach the quorum (as Kafka's security.protocol).")
@click.option("--sasl-mechanism", envvar="PIDQUORUM_SASL_MECHANISM", default="PLAIN", show_default=True,
              type=click.Choice(["PLAIN", "SCRAM-SHA-256"]))
@click.option("--sasl-username", envvar="PIDQUORUM_SASL_USERNAME", help="SASL user (env PIDQUORUM_SASL_USERNAME).")
@secret_options("--sasl-password", "sasl_password", envvar="PIDQUORUM_SASL_PASSWORD", help="The SASL password")
@click.option("--tls-cafile", envvar="PIDQUORUM_TLS_CAFILE", type=click.Path(dir_okay=False),
              help="CA that signed the quorum's certificates (default: the system's trust store).")
@click.pass_context
def cli(ctx, data_dir, quorum, timeout, security_protocol, sasl_mechanism, sasl_username, sasl_password,
        sasl_password_file, tls_cafile):
    """pidquorum: producer-ID blocks from a Raft quorum."""
    if sasl_password_file is not None:  # the file's text (settings.flags.secret_options)
        sasl_password = sasl_password_file
    security = None
    if security_protocol != "PLAINTEXT":
        try:
            security = ClientSecurity(security_protocol, sasl_mechanism, sasl_username, sasl_password, tls_cafile)
        except ValueError as e:
            raise click.UsageError(str(e)) from None
    ctx.obj = Ctx(data_dir, quorum, timeout, security)


for _command in (cluster.cluster, cluster.demo, node.node, broker.broker, broker.allocate, blocks.blocks,
                 quorum.quorum, snapshot.snapshot, migrate.migrate, quota.quota, chaos.chaos, audit.audit,
                 bench.bench):
    cli.add_command(_command)
_register_security_commands(cli, handle_errors=handle_errors, output_option=output_option, run=run)


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(EXIT_INTERRUPTED)
    except click.UsageError as e:
        e.show()
        sys.exit(EXIT_USAGE)
    except click.ClickException as e:
        e.show()
        sys.exit(EXIT_ERROR)
    except SystemExit:
        raise


if __name__ == "__main__":
    main()
