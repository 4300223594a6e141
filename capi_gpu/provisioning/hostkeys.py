"""OS host keys the controller generates, so the very first SSH into a fresh install is already pinned.

Ed25519, OpenSSH format. The private half lives only in a Secret (and, in transit, the post-install
script); status holds the public half.
"""

from __future__ import annotations

from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519


@dataclass(frozen=True)
class HostKeyPair:
    private: str = ""
    public: str = ""

    def __repr__(self) -> str:
        return f"HostKeyPair(public={self.public[:32]}...)"


def generate(comment: str = "capi-gpu") -> HostKeyPair:
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return HostKeyPair(private=private, public=f"{public} {comment}")
