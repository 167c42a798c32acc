"""A SASL_SSL quorum (throwaway CA) with users admin (super user), broker and alice, shared by a module."""
from __future__ import annotations

import asyncio
import os

import pytest

from benchmarks.pki import make_pki
from quorum.client.quorum import QuorumClient, RetryPolicy
from quorum.localcluster import LocalCluster
from quorum.security import credentials
from quorum.security.client import ClientSecurity

PASSWORDS = {"admin": "admin-pw", "broker": "broker-pw", "alice": "alice-pw", "bob": "bob-pw"}


class SecureQuorum:
    def __init__(self, lc: LocalCluster, pki, users_file: str, secrets_dir: str):
        self.lc, self.pki, self.users_file = lc, pki, users_file
        self.secrets_dir = secrets_dir

    def password_file(self, user: str) -> str:
        """A file (mode 0600) holding ``user``'s password, for ``--sasl-password-file`` and
        ``--quorum-sasl-password-file``: the suite gives passwords as users do, never as a flag's value."""
        path = os.path.join(self.secrets_dir, f"{user}.password")
        if not os.path.exists(path):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(PASSWORDS[user] + "\n")
        return path

    @property
    def addresses(self) -> list[str]:
        return self.lc.client_addresses()

    def security(self, user: str | None, password: str | None = None, mechanism: str = "PLAIN",
                 protocol: str = "SASL_SSL") -> ClientSecurity:
        if user is None:
            return ClientSecurity("SSL", cafile=self.pki.cafile)
        return ClientSecurity(protocol, mechanism, user, PASSWORDS.get(user) if password is None else password,
                              self.pki.cafile)

    def client(self, user: str | None, password: str | None = None, mechanism: str = "PLAIN",
               addresses: list[str] | None = None, timeout: float = 10.0) -> QuorumClient:
        return QuorumClient(addresses or self.addresses, RetryPolicy(timeout=timeout, attempt_timeout=2.0),
                            client_id=f"test-{user}", security=self.security(user, password, mechanism))

    def grant(self, acls) -> None:
        """Add ``acls`` as the admin."""
        async def go():
            c = self.client("admin")
            try:
                for acl in acls:
                    await c.alter_acl("add", acl)
            finally:
                await c.close()
        asyncio.run(go())

    def cli_args(self, user: str = "admin") -> list[str]:
        return ["--quorum", ",".join(self.addresses), "--timeout", "30", "--security-protocol", "SASL_SSL",
                "--sasl-username", user, "--sasl-password-file", self.password_file(user),
                "--tls-cafile", self.pki.cafile]


@pytest.fixture(scope="module")
def secure_quorum(tmp_path_factory):
    base = tmp_path_factory.mktemp("secure")
    pki = make_pki(str(base / "pki"))
    users = str(base / "users.json")
    for user, password in PASSWORDS.items():
        credentials.add_user(users, user, password)
    lc = LocalCluster(str(base / "cluster"))
    lc.up(3, sasl_credentials_file=users, super_users=["User:admin"], tls_certfile=pki.certfile,
          tls_keyfile=pki.keyfile, tls_cafile=pki.cafile)
    secrets_dir = base / "secrets"
    secrets_dir.mkdir(mode=0o700)
    sq = SecureQuorum(lc, pki, users, str(secrets_dir))
    yield sq
    for n in lc.nodes():
        if os.environ.get("PIDQUORUM_SHOW_LOGS"):
            print(f"----- node {n.node_id} -----\n{lc.tail_log(n.node_id, 40)}")
    lc.down(timeout=5)


def read_partition(bootstrap: str, user: str, topic: str, expect: int, committed: bool = False) -> list[bytes]:
    """Every value of partition 0 of ``topic``, read over SASL_PLAINTEXT as ``user`` (kafka-python) until
    ``expect`` values have come and the partition has been idle for 1 s."""
    from kafka import KafkaConsumer, TopicPartition

    from tests.conftest import wait_for
    c = KafkaConsumer(bootstrap_servers=bootstrap, security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                      sasl_plain_username=user, sasl_plain_password=PASSWORDS[user], enable_auto_commit=False,
                      auto_offset_reset="earliest", consumer_timeout_ms=1000,
                      isolation_level="read_committed" if committed else "read_uncommitted")
    try:
        c.assign([TopicPartition(topic, 0)])
        c.seek_to_beginning()
        got: list[bytes] = []

        def more():
            before = len(got)
            got.extend(m.value for m in c)  # stops after 1 s idle
            return len(got) >= expect and len(got) == before
        wait_for(more, 30, what=f"{expect} records of {topic}")
        return got
    finally:
        c.close()
