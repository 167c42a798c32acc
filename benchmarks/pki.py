"""A throwaway CA and certificates for 127.0.0.1 / localhost (the ``cryptography`` package): the
security benchmark's TLS quorum (``benchmarks.security``) and the security tests' (tests/security)."""
from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass
class Pki:
    cafile: str
    certfile: str
    keyfile: str
    client_certfile: str
    client_keyfile: str


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(path: str, key) -> None:
    with open(path, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    os.chmod(path, 0o600)


def _issue(ca_key, ca_name, cn: str, path_cert: str, path_key: str, server: bool) -> None:
    now = datetime.datetime.now(datetime.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    b = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca_name).public_key(key.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
    if server:
        b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                         x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                            critical=False)
    cert = b.sign(ca_key, hashes.SHA256())
    with open(path_cert, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(path_key, key)


def make_pki(directory: str) -> Pki:
    os.makedirs(directory, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("pidquorum test CA")
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    pki = Pki(*(os.path.join(directory, n) for n in ("ca.pem", "server.pem", "server.key", "client.pem",
                                                      "client.key")))
    with open(pki.cafile, "wb") as f:
        f.write(ca.public_bytes(serialization.Encoding.PEM))
    _issue(ca_key, ca_name, "127.0.0.1", pki.certfile, pki.keyfile, server=True)
    _issue(ca_key, ca_name, "client", pki.client_certfile, pki.client_keyfile, server=False)
    return pki
