"""A throwaway certificate authority for a fleet on one machine: the broker's server certificate and the
agents' client certificates (CN = cluster name, as the broker checks), valid for two days."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["CA_FILE", "Pki"]

CA_FILE = "test-root-ca.pem"
"""The CA certificate's file name inside `Pki.dir`."""
_VALIDITY = datetime.timedelta(days=2)
_BACKDATE = datetime.timedelta(days=1)
"""Certificates start a day early so a skewed clock on the same machine cannot make them not yet valid."""


@dataclass
class Pki:
    ca_pem: bytes
    ca_key: ec.EllipticCurvePrivateKey
    ca_cert: x509.Certificate
    dir: Path

    @classmethod
    def create(cls, dir: Path) -> Pki:
        """A new CA; its certificate is written to `dir / CA_FILE`."""
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tandem-test-ca")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        pem = cert.public_bytes(serialization.Encoding.PEM)
        (dir / CA_FILE).write_bytes(pem)
        return cls(pem, key, cert, dir)

    @property
    def ca_file(self) -> Path:
        return self.dir / CA_FILE

    def issue(self, cn: str, *, server: bool = False, serial: int | None = None) -> tuple[Path, Path]:
        """(cert path, key path) for a leaf with CN (and SAN DNS) `cn`; servers also get localhost / 127.0.0.1.
        `serial` fixes the serial number (to tell a reissued certificate from the one before), else random."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        sans: list[x509.GeneralName] = [x509.DNSName(cn)]
        if server:
            sans += [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(self.ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number() if serial is None else serial)
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .sign(self.ca_key, hashes.SHA256())
        )
        cp, kp = self.dir / f"{cn}.pem", self.dir / f"{cn}.key"
        cp.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        kp.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return cp, kp
