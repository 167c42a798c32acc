"""docs/tls.md, "Try it on one machine", runs as written: its shell blocks in order, in one bash, in an
empty directory, on free ports of 127.0.0.1: a CA and a certificate with a subjectAltName made with the
openssl installed here, a three-node quorum serving TLS on its client port, a broker serving TLS and
reaching the quorum over TLS, pidctl and a confluent-kafka producer over SSL; pidctl without the CA, pidctl
without TLS and a broker without TLS to the quorum refused with the lines the doc promises."""
from __future__ import annotations

import os

from quorum.localcluster import free_ports
from tests.docs.doc_shell import DocShell, assert_prints, blocks, with_ports

SECTION = "Try it on one machine"


def _read_back_over_ssl(bootstrap: str, cafile: str, topic: str, expect: int) -> list[bytes]:
    from kafka import KafkaConsumer, TopicPartition
    c = KafkaConsumer(bootstrap_servers=bootstrap, security_protocol="SSL", ssl_cafile=cafile,
                      enable_auto_commit=False, auto_offset_reset="earliest", consumer_timeout_ms=5000)
    try:
        c.assign([TopicPartition(topic, 0)])
        c.seek_to_beginning()
        return [m.value for m in c][:expect + 1]
    finally:
        c.close()


def test_the_tls_doc_runs_as_written(tmp_path, request):
    steps = blocks("tls.md", SECTION)
    assert len(steps) >= 10 and steps[-1].heading == "7. Stop", [s.heading for s in steps]
    exits = [s.expect_exit for s in steps]
    assert (exits.count(3), exits.count(78)) == (2, 1), "the doc shows two refused pidctl and a refused broker"
    ports = free_ports(7)  # C1 C2 C3 R1 R2 R3 B, in the order of the doc's first block
    steps[0] = with_ports(steps[0], ports)
    client_ports, broker_port = ports[:3], ports[6]
    work = tmp_path / "work"
    shell = DocShell(str(work), str(tmp_path / "steps"))
    seen = set()
    try:
        for step in steps:
            rc, out = shell.run(step)
            assert rc == step.expect_exit, f"exit {rc}, the doc says {step.expect_exit}:\n{step.text}\n{out}"
            assert "Traceback" not in out, out
            assert_prints(step, out)
            text = step.text
            if "openssl verify" in text:
                assert "local.pem: OK" in out and "IP Address:127.0.0.1, DNS:localhost" in out, out
                seen.add("certificate")
            if "issue pq1" in text:  # the real hosts' certificates name their hosts
                for n in (1, 2, 3):
                    assert os.path.exists(work / f"pq{n}.pem") and (os.stat(work / f"pq{n}.key").st_mode & 0o077) == 0
            if "quorum status" in text and step.expect_exit == 0:
                assert "healthy: 3 of 3 nodes up" in out, out
                seen.add("pidctl over SSL")
            if "broker register" in text and step.expect_exit == 0:
                assert all(w.isdigit() for w in out.split()[:3]), out  # the epoch, once per node asked
                assert "latest block" in out, out  # dialled as localhost
            if '"ssl.ca.location"' in text:
                assert out.strip() == "undelivered: 0", out
                got = _read_back_over_ssl(f"127.0.0.1:{broker_port}", str(work / "ca.pem"), "greetings", 5)
                assert got == [f"hello {i}".encode() for i in range(5)], got
                seen.add("kafka client over SSL")
            if "s_client" in text:
                assert "Verify return code: 0 (ok)" in out, out
            if step.expect_exit == 3:  # one line, every node named once, with the reason
                lines = out.splitlines()
                named = ", ".join(f"127.0.0.1:{p}" for p in client_ports)
                assert len(lines) == 1 and lines[0].startswith(f"error: no node answered: {named}: "), out
                if "--security-protocol SSL" in text:
                    assert "TLS certificate verify failed" in lines[0] and "pass --tls-cafile" in lines[0], out
                    seen.add("refused without the CA")
                else:
                    assert lines[0].endswith("it is a TLS port (--security-protocol SSL)"), out
                    seen.add("plaintext client told it is TLS")
            if step.expect_exit == 78:
                critical = [x for x in out.splitlines() if " CRITICAL " in x]
                assert len(critical) == 1 and "it is a TLS port" in critical[0], out
                seen.add("broker without TLS refused")
            if "without" in step.heading and '"security.protocol": "SSL"' in text:
                seen.add("kafka client refused without the CA")
        assert seen == {"certificate", "pidctl over SSL", "kafka client over SSL", "refused without the CA",
                        "plaintext client told it is TLS", "broker without TLS refused",
                        "kafka client refused without the CA"}, seen
    finally:
        shell.close_after(request)
