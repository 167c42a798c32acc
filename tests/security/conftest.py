"""A SASL_SSL quorum (throwaway CA) with users admin (super user), broker, alice and bob, shared by a module;
the ACLs, broker flags and SASL requests the security tests build on it."""
from __future__ import annotations

import asyncio
import datetime
import os

import pytest

from benchmarks.pki import make_pki
from quorum.client.quorum import QuorumClient, RetryPolicy
from quorum.localcluster import LocalCluster
from quorum.security import credentials
from quorum.security.acl import ALLOW, CLUSTER, CLUSTER_ACTION, CLUSTER_NAME, LITERAL, Acl
from quorum.security.client import ClientSecurity
from tests.conftest import wait_for
from tests.support.kafka_requests import request_once
from records.wire import kafka

PASSWORDS = {"admin": "admin-pw", "broker": "broker-pw", "alice": "alice-pw", "bob": "bob-pw"}
INIT_PRODUCER_ID = 22


def allow(user: str, operation: str, resource_type: str = CLUSTER, name: str = CLUSTER_NAME,
          pattern: str = LITERAL) -> Acl:
    """User:``user`` may do ``operation`` on the resource (the cluster unless another is named)."""
    return Acl(f"User:{user}", resource_type, name, pattern, operation, ALLOW)


BROKER_ACL = allow("broker", CLUSTER_ACTION)  # what the brokers' own user needs on the quorum


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

    def broker_flags(self, password_file: bool = True) -> list[str]:
        """A broker's flags for SASL clients (``users_file``) and for reaching this quorum as the user broker
        (over SASL_SSL); its password from a file, or (``password_file=False``) from the environment."""
        password = ["--quorum-sasl-password-file", self.password_file("broker")] if password_file else []
        return ["--sasl-credentials-file", self.users_file, "--acl-refresh-ms", "100",
                "--quorum-security-protocol", "SASL_SSL", "--quorum-sasl-username", "broker", *password,
                "--quorum-tls-cafile", self.pki.cafile]

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


def call(b, user: str, body):
    """The response to ``body`` from broker process ``b``, asked as ``user`` over SASL_PLAINTEXT."""
    return request_once(b.bootstrap, f"test-{user}", body,
                        ClientSecurity("SASL_PLAINTEXT", "PLAIN", user, PASSWORDS[user]))


def init_producer_id(b, user: str) -> int:
    """A new producer ID (InitProducerId v4, no transactional id) from broker process ``b``, asked as ``user``."""
    r = call(b, user, kafka.request_entity(INIT_PRODUCER_ID, 4, transactional_id=None,
                                           transaction_timeout=datetime.timedelta(seconds=60),
                                           producer_id=-1, producer_epoch=-1))
    assert int(r.error_code) == 0, r
    return int(r.producer_id)
