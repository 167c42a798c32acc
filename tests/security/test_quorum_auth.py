"""SASL (PLAIN, SCRAM-SHA-256) inside TLS on a real three-node quorum's client port, and its ACLs."""
from __future__ import annotations

import asyncio
import json
import socket
import ssl
import struct

import pytest
from click.testing import CliRunner
from kio.schema.envelope.v0.request import EnvelopeRequest

from benchmarks.pki import make_pki
from cli.main import cli
from quorum.client import api as p
from quorum.client.quorum import Connection, ConnectionFailed, QuorumClient, RetryPolicy
from quorum.localcluster import ClusterError, LocalCluster
from quorum.security.client import ClientSecurity
from records import DescribeAclsRequest
from tests.conftest import wait_for
from records.wire import kafka
from records.wire.errors import (
    ClusterAuthorizationFailedError,
    Errors,
    RequestTimedOutError,
    SaslAuthenticationFailedError,
)


def run(coro):
    return asyncio.run(coro)


async def _call(client, fn):
    try:
        return await fn(client)
    finally:
        await client.close()


def pidctl(sq, *args, user="admin"):
    res = CliRunner().invoke(cli, [*sq.cli_args(user), *args], catch_exceptions=False)
    return res.exit_code, res.output


def _leader_and_follower(sq):
    async def go():
        c = sq.client("admin")
        try:
            return (await c.find_leader(15))[0]
        finally:
            await c.close()
    leader = run(go())
    return leader, next(a for a in sq.addresses if a != leader)


def test_refused_without_or_with_wrong_credentials(secure_quorum):
    sq = secure_quorum
    body = kafka.request_entity(p.ALLOCATE_PRODUCER_IDS, 0, broker_id=p.i32(1), broker_epoch=p.i64(1))
    # TLS but no SASL: the first request that is not ApiVersions / SASL closes the connection
    with pytest.raises(ConnectionFailed):
        run(Connection(sq.addresses[0], "anon", sq.security(None)).call(body, 5.0))
    for user, password in (("alice", "wrong"), ("mallory", "alice-pw"), ("admin", "")):
        with pytest.raises(SaslAuthenticationFailedError, match="Invalid username or password|not specified"):
            run(_call(sq.client(user, password), lambda c: c.register_broker(1)))
    with pytest.raises(SaslAuthenticationFailedError, match="Invalid username or password"):  # as a known user's
        run(_call(sq.client("mallory", "x", mechanism="SCRAM-SHA-256"), lambda c: c.register_broker(1)))
    # a client that does not trust the CA cannot even connect (TLS verification)
    untrusting = ClientSecurity("SASL_SSL", "PLAIN", "admin", "admin-pw")
    with pytest.raises(ConnectionFailed, match="TLS certificate verify failed"):
        run(Connection(sq.addresses[0], "x", untrusting).call(body, 5.0))


def test_acls_grant_and_revoke_cluster_action_through_a_follower(secure_quorum):
    sq = secure_quorum
    leader, follower = _leader_and_follower(sq)
    # no ACL yet: the broker user is refused (a follower checks, then forwards as the node principal)
    with pytest.raises(ClusterAuthorizationFailedError, match="CLUSTER_AUTHORIZATION_FAILED"):
        run(_call(sq.client("broker", addresses=[follower]), lambda c: c.register_broker(7)))
    # alice may not manage ACLs
    code, out = pidctl(sq, "acl", "add", "--principal", "User:broker", "--operation", "CLUSTER_ACTION",
                       "--cluster", user="alice")
    assert code == 4 and "User:alice is not allowed ALTER on the cluster" in out, out
    code, out = pidctl(sq, "acl", "add", "--principal", "User:broker", "--operation", "CLUSTER_ACTION", "--cluster",
                       "-o", "json")
    assert code == 0 and json.loads(out)["changed"] is True, out
    code, out = pidctl(sq, "acl", "add", "--principal", "User:broker", "--operation", "CLUSTER_ACTION", "--cluster")
    assert code == 0 and "unchanged" in out
    # the follower applies the entry (replication), then the broker may register and allocate through it
    async def broker_work(c):
        epoch = await c.register_broker(7)
        block = await c.allocate(7, epoch)
        tid = await c.init_transactional(7, epoch, "orders-1", 60000)
        return epoch, block, tid
    epoch, block, (pid, pepoch) = wait_for(
        lambda: _try(lambda: run(_call(sq.client("broker", addresses=[follower]), broker_work))), 10,
        what="the ACL to reach the follower")
    assert block.length > 0 and pepoch == 0 and pid >= 0
    # SCRAM-SHA-256 works for the same user
    assert run(_call(sq.client("broker", mechanism="SCRAM-SHA-256"), lambda c: c.register_broker(8))) > 0
    # alice has no ACL
    with pytest.raises(ClusterAuthorizationFailedError):
        run(_call(sq.client("alice"), lambda c: c.allocate(7, epoch)))
    with pytest.raises(ClusterAuthorizationFailedError):
        run(_call(sq.client("alice"), lambda c: c.describe_acls()))
    code, out = pidctl(sq, "acl", "list", "-o", "json")
    assert code == 0 and {"principal": "User:broker", "resource_type": "Cluster", "resource_name": "kafka-cluster",
                          "pattern_type": "LITERAL", "operation": "CLUSTER_ACTION", "permission": "ALLOW",
                          "host": "*"} in json.loads(out)
    # a DENY for everyone wins over the broker's ALLOW
    code, out = pidctl(sq, "acl", "add", "--principal", "User:*", "--operation", "ALL", "--permission", "deny",
                       "--cluster")
    assert code == 0, out
    wait_for(lambda: _refused(lambda: run(_call(sq.client("broker", addresses=[leader]),
                                                lambda c: c.register_broker(9)))), 10, what="the deny to apply")
    for principal, op, perm in (("User:*", "ALL", "deny"), ("User:broker", "CLUSTER_ACTION", "allow")):
        code, out = pidctl(sq, "acl", "remove", "--principal", principal, "--operation", op, "--permission", perm,
                           "--cluster")
        assert code == 0 and "removed" in out, out
    wait_for(lambda: _refused(lambda: run(_call(sq.client("broker", addresses=[follower]),
                                                lambda c: c.register_broker(7)))), 10, what="the removal to apply")
    code, out = pidctl(sq, "acl", "add", "--principal", "alice", "--operation", "WRITE", "--cluster")
    assert code == 2 and "User:<name>" in out  # a bad entry: one clear line, a usage error


def _try(fn):
    try:
        return fn()
    except ClusterAuthorizationFailedError:
        return None


def _refused(fn):
    try:
        fn()
    except ClusterAuthorizationFailedError:
        return True
    return False


# ------------------------------------------------------- the SASL exchange on a raw socket


class Raw:
    """A blocking TLS client speaking raw frames, to send what no library would."""

    def __init__(self, sq, address):
        host, port = address.rsplit(":", 1)
        ctx = ssl.create_default_context(cafile=sq.pki.cafile)
        self.sock = ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=5), server_hostname=host)
        self.corr = 0

    def send(self, api_key, version, **fields) -> int:
        self.corr += 1
        self.sock.sendall(kafka.encode_request(kafka.request_entity(api_key, version, **fields), self.corr, "raw"))
        return self.corr

    def send_frame(self, data: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(data)) + data)

    def read_frame(self) -> bytes | None:
        head = self._exactly(4)
        if head is None:
            return None
        return self._exactly(struct.unpack(">i", head)[0])

    def _exactly(self, n):
        buf = b""
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except (ConnectionError, ssl.SSLError):
                return None
            if not chunk:
                return None
            buf += chunk
        return buf

    def response(self, api_key, version):
        frame = self.read_frame()
        assert frame is not None, "connection closed"
        return p.QUORUM_API.parse_response(frame, api_key, version)[1]

    def closed(self) -> bool:
        return self.read_frame() is None

    def close(self):
        self.sock.close()


def test_sasl_protocol_errors_close_only_that_connection(secure_quorum):
    sq = secure_quorum
    addr = sq.addresses[0]
    # ApiVersions is served before authentication and lists the SASL APIs
    r = Raw(sq, addr)
    r.send(p.API_VERSIONS, 3, client_software_name="raw", client_software_version="1")
    keys = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in r.response(p.API_VERSIONS, 3).api_keys}
    assert keys[17] == (0, 1) and keys[36] == (0, 2)
    # unknown mechanism: UNSUPPORTED_SASL_MECHANISM with the enabled list, then closed
    r.send(17, 1, mechanism="GSSAPI")
    resp = r.response(17, 1)
    assert int(resp.error_code) == Errors.UNSUPPORTED_SASL_MECHANISM and list(resp.mechanisms) == ["PLAIN",
                                                                                                  "SCRAM-SHA-256"]
    assert r.closed()
    # a request before authentication: closed, no answer
    r = Raw(sq, addr)
    r.send(p.ALLOCATE_PRODUCER_IDS, 0, broker_id=p.i32(1), broker_epoch=p.i64(1))
    assert r.closed()
    # SaslAuthenticate before SaslHandshake: closed
    r = Raw(sq, addr)
    r.send(36, 2, auth_bytes=b"\0admin\0admin-pw")
    assert r.closed()
    # bad PLAIN bytes: SASL_AUTHENTICATION_FAILED with a message, then closed
    r = Raw(sq, addr)
    r.send(17, 1, mechanism="PLAIN")
    assert int(r.response(17, 1).error_code) == 0
    r.send(36, 1, auth_bytes=b"garbage")
    resp = r.response(36, 1)
    assert int(resp.error_code) == Errors.SASL_AUTHENTICATION_FAILED and "expected 3 tokens" in resp.error_message
    assert r.closed()
    # a SaslAuthenticate whose byte length runs past the frame: INVALID_REQUEST (wirecheck), closed
    r = Raw(sq, addr)
    r.send(17, 1, mechanism="PLAIN")
    r.response(17, 1)
    frame = kafka.encode_request(kafka.request_entity(36, 0, auth_bytes=b"\0a\0b"), 9, "raw")[4:]
    r.send_frame(frame[:-9] + struct.pack(">i", 2**31 - 1) + frame[-5:])
    resp = r.response(36, 0)
    assert int(resp.error_code) == Errors.INVALID_REQUEST
    assert r.closed()
    # authenticated; a second handshake or authenticate: ILLEGAL_SASL_STATE, the connection stays usable
    r = Raw(sq, addr)
    r.send(17, 1, mechanism="PLAIN")
    r.response(17, 1)
    r.send(36, 2, auth_bytes=b"\0admin\0admin-pw")
    assert int(r.response(36, 2).error_code) == 0
    r.send(17, 1, mechanism="PLAIN")
    assert int(r.response(17, 1).error_code) == Errors.ILLEGAL_SASL_STATE
    r.send(36, 2, auth_bytes=b"\0admin\0admin-pw")
    resp = r.response(36, 2)
    assert int(resp.error_code) == Errors.ILLEGAL_SASL_STATE and "after successful authentication" in resp.error_message
    r.send(p.API_VERSIONS, 0)
    assert int(r.response(p.API_VERSIONS, 0).error_code) == 0
    r.close()
    # SaslHandshake v0: the token travels raw (no Kafka header), as old clients do; then requests as admin
    r = Raw(sq, addr)
    r.send(17, 0, mechanism="PLAIN")
    assert int(r.response(17, 0).error_code) == 0
    r.send_frame(b"\0admin\0admin-pw")
    assert r.read_frame() == b""
    r.sock.sendall(p.encode_admin_request(DescribeAclsRequest(principal=""), 5, "raw"))
    resp = p.QUORUM_API.parse_response(r.read_frame(), p.RECORD_API_KEY, 0)[1]
    assert int(resp.error_code) == 0
    r.close()
    # raw v0 with a wrong password: closed without an answer
    r = Raw(sq, addr)
    r.send(17, 0, mechanism="PLAIN")
    r.response(17, 0)
    r.send_frame(b"\0admin\0nope")
    assert r.closed()
    # the node kept serving everyone else: a write commits through it and a read sees it
    async def commit_then_read(c):
        epoch = await c.register_broker(4242)
        block = await c.allocate(4242, epoch)
        return block, await c.describe_acls()
    block, (acls, applied) = run(_call(sq.client("admin", addresses=[addr]), commit_then_read))
    assert block.length > 0 and applied >= 2  # (applied > 0 alone held only after earlier tests had written)


def test_node_refuses_to_start_with_a_corrupt_credentials_file(tmp_path):
    bad = tmp_path / "users.json"
    bad.write_text("{broken")
    lc = LocalCluster(str(tmp_path / "c"))
    with pytest.raises(ClusterError) as e:
        lc.up(1, sasl_credentials_file=str(bad), timeout=20)
    assert "users.json" in str(e.value) and "invalid JSON" in str(e.value)
    lc.down(timeout=5)



def test_acls_survive_a_snapshot_and_a_restart(secure_quorum):
    sq = secure_quorum
    code, out = pidctl(sq, "acl", "add", "--principal", "User:alice", "--operation", "WRITE", "--transactional-id",
                       "keep-", "--prefixed")
    assert code == 0, out
    code, out = pidctl(sq, "snapshot", "take")
    assert code == 0, out
    pidctl(sq, "acl", "add", "--principal", "User:bob", "--operation", "DESCRIBE", "--cluster")  # after the snapshot
    node = sq.lc.nodes()[0]
    sq.lc.stop(node.node_id)
    sq.lc.start(node.node_id)
    sq.lc.wait_ready([node.node_id])

    def listed():
        try:
            client = sq.client("admin", addresses=[node.client_address], timeout=3)
            acls, _ = run(_call(client, lambda c: c.describe_acls()))
        except Exception:  # noqa: BLE001 - still starting
            return None
        names = {(x.principal, x.resource_name) for x in acls}
        return names if {("User:alice", "keep-"), ("User:bob", "kafka-cluster")} <= names else None
    assert wait_for(listed, 20, what="the restarted node to list both entries")


def test_tls_only_quorum_forwards_over_tls_and_refuses_plaintext(tmp_path):
    pki = make_pki(str(tmp_path / "pki"))
    lc = LocalCluster(str(tmp_path / "c"))
    lc.up(3, tls_certfile=pki.certfile, tls_keyfile=pki.keyfile, tls_cafile=pki.cafile)
    try:
        tls = ClientSecurity("SSL", cafile=pki.cafile)

        async def work(addresses):
            c = QuorumClient(addresses, RetryPolicy(timeout=15, attempt_timeout=2), security=tls)
            try:
                epoch = await c.register_broker(3)
                return await c.allocate(3, epoch)
            finally:
                await c.close()
        # every node, followers included (they forward to the leader over TLS, as the node principal)
        for address in lc.client_addresses():
            assert run(work([address])).length > 0
        plain = QuorumClient(lc.client_addresses()[:1], RetryPolicy(timeout=1.5, attempt_timeout=0.5))
        with pytest.raises(RequestTimedOutError):
            run(_call(plain, lambda c: c.register_broker(4)))
    finally:
        lc.down(timeout=5)


def test_only_a_node_may_forward_a_request(secure_quorum):
    """An Envelope carries the principal it forwards for: only super users (the nodes) may send one.
    alice, authenticated but no node, claiming to forward for User:admin, is refused, and the node
    goes on serving her own connection."""
    sq = secure_quorum
    leader, _ = _leader_and_follower(sq)
    r = Raw(sq, leader)
    r.send(17, 1, mechanism="PLAIN")
    r.response(17, 1)
    r.send(36, 2, auth_bytes=b"\0alice\0alice-pw")
    assert int(r.response(36, 2).error_code) == 0
    inner = kafka.encode_request(kafka.request_entity(p.ALLOCATE_PRODUCER_IDS, 0, broker_id=p.i32(1),
                                                      broker_epoch=p.i64(1)), 77, "inner")[4:]
    r.sock.sendall(kafka.encode_request(EnvelopeRequest(request_data=inner, request_principal=b"User:admin",
                                                        client_host_address=b"\x7f\x00\x00\x01"), 5, "raw"))
    resp = r.response(p.ENVELOPE, 0)
    assert int(resp.error_code) == Errors.CLUSTER_AUTHORIZATION_FAILED and resp.response_data is None
    r.send(p.API_VERSIONS, 0)
    assert int(r.response(p.API_VERSIONS, 0).error_code) == 0
    r.close()
