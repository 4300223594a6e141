"""SSH key material for the simulation: generating host and client keys, and Robot-style fingerprints.

Why here: tests and the fleet need fresh keys per run (never a key checked into the repository), and
the fingerprints must be computed the way Robot reports them (MD5 of the key blob, colon-separated
hex, hetzner.md §1.3) so that the product's pin check is exercised against the real format.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa


@dataclass(frozen=True)
class KeyPair:
    private_openssh: str = field(repr=False)
    public_line: str  # "ssh-ed25519 AAAA... comment"

    @property
    def key_type(self) -> str:
        return self.public_line.split()[0]

    @property
    def md5_fingerprint(self) -> str:
        return md5_fingerprint(self.public_line)

    @property
    def sha256_fingerprint(self) -> str:
        blob = base64.b64decode(self.public_line.split()[1])
        return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def md5_fingerprint(public_line: str) -> str:
    """``aa:bb:...``: MD5 over the base64-decoded key blob, as ``ssh-keygen -E md5 -l`` and Robot show it."""
    blob = base64.b64decode(public_line.split()[1])
    digest = hashlib.md5(blob, usedforsecurity=False).hexdigest()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def generate(kind: str = "ed25519", comment: str = "capi-gpu-sim") -> KeyPair:
    key: ed25519.Ed25519PrivateKey | rsa.RSAPrivateKey
    if kind == "ed25519":
        key = ed25519.Ed25519PrivateKey.generate()
    elif kind == "rsa":
        key = rsa.generate_private_key(public_exponent=65537, key_size=3072)
    else:
        raise ValueError(f"unsupported key type {kind}")
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return KeyPair(private, f"{public.decode()} {comment}")
