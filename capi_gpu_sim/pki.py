"""Throwaway PKI for the local control plane: a CA, serving certificates, the service-account key pair.

Generated per run with ``cryptography`` (already a paramiko dependency), so nothing secret is committed
and every test run starts from fresh credentials.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class CertPair:
    cert: Path
    key: Path


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, mode: int = 0o600) -> Path:
    path.write_bytes(data)
    path.chmod(mode)
    return path


class CA:
    """A self-signed CA that signs loopback serving certificates."""

    def __init__(self, directory: Path, name: str = "capi-gpu-test-ca") -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = dt.datetime.now(dt.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=7))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert_path = _write(directory / "ca.crt", self._cert.public_bytes(serialization.Encoding.PEM), 0o644)

    @property
    def pem(self) -> bytes:
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def serving(
        self,
        name: str,
        dns: list[str],
        ips: list[str],
        out: Path | None = None,
        cert_name: str = "tls.crt",
        key_name: str = "tls.key",
    ) -> CertPair:
        out = out or self.dir / name
        out.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        san = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=7))
            .add_extension(x509.SubjectAlternativeName(san), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        return CertPair(
            cert=_write(out / cert_name, cert.public_bytes(serialization.Encoding.PEM), 0o644),
            key=_write(out / key_name, _key_pem(key)),
        )


def service_account_keys(directory: Path) -> CertPair:
    """RSA key pair the apiserver signs and verifies service-account tokens with."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return CertPair(cert=_write(directory / "sa.pub", pub, 0o644), key=_write(directory / "sa.key", _key_pem(key)))
