"""A certificate authority made for one test: PEM files for a server certificate and mTLS client certificates,
signed by it with real keys (the ``cryptography`` package), written where the test says."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    """A certificate and its unencrypted private key, as PEM files."""

    cert: Path
    key: Path


class ThrowawayCA:
    """A self-signed CA under ``directory``: ``ca.pem`` is what a peer is told to trust."""

    def __init__(self, directory: Path, name: str = "durafix test CA") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self._name = subject
        self._cert = (
            self._builder(subject, self._key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.cert = directory / "ca.pem"
        self.cert.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def _builder(self, subject: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
        now = datetime.datetime.now(datetime.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._name)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )

    def issue(self, stem: str, *, dns: str | None = None, client: bool = False) -> Issued:
        """A leaf certificate: a server's for the host name ``dns`` (and 127.0.0.1 only when ``dns`` is
        None), or with ``client`` an mTLS client's. Written to ``STEM.pem`` and ``STEM-key.pem``."""
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = (
            [x509.DNSName(dns)] if dns else [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        )
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        cert = (
            self._builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns or stem)]), key.public_key())
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        issued = Issued(cert=self.directory / f"{stem}.pem", key=self.directory / f"{stem}-key.pem")
        issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        issued.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        issued.key.chmod(0o600)
        return issued
