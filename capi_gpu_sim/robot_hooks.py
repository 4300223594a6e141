"""What the Robot simulator tells the simulated machines: power events and new servers.

Robot itself never talks to a server's OS; it presses buttons and chooses what the next boot loads.
The simulator does the same through ``PowerHook``: after a reset it says *what* the machine boots
(``BootTarget``) and leaves the booting itself (downtime, sshd, hostname) to the simulated-host
fleet (``capi_gpu_sim.hosts``), which implements the hook. The default hook does nothing, so the
simulator also runs alone (contract tests, benchmarks).

A rescue boot carries everything the rescue system needs: the root password Robot generated, the
authorized public keys (OpenSSH lines, looked up from the fingerprints the activation named) and the
rescue host *private* keys, whose fingerprints Robot reported in ``host_key``. Only the simulator
knows those private keys, as only Hetzner knows the real ones.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519


class BootKind(StrEnum):
    RESCUE = "rescue"  # rescue was active: boot the rescue system (activation now consumed)
    INSTALLED = "installed"  # boot whatever is installed on the disks
    OFF = "off"  # power button / power_long: the machine is off until powered on
    HUNG = "hung"  # fault injection: the machine went down and never comes back


def md5_fingerprint(public_openssh: str) -> str:
    """Robot's fingerprint format: MD5 of the key blob, lowercase hex pairs joined by colons."""
    blob = base64.b64decode(public_openssh.split()[1])
    digest = hashlib.md5(blob, usedforsecurity=False).hexdigest()
    return ":".join(digest[i : i + 2] for i in range(0, 32, 2))


@dataclass(frozen=True)
class HostKeyPair:
    """A rescue SSH host key. ``private_openssh`` never leaves the simulator's Python API."""

    key_type: str  # Robot's spelling: "ED25519"
    size: int
    public_openssh: str
    private_openssh: str = field(repr=False)

    @property
    def fingerprint(self) -> str:
        return md5_fingerprint(self.public_openssh)

    @classmethod
    def generate(cls) -> HostKeyPair:
        key = ed25519.Ed25519PrivateKey.generate()
        private = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        ).decode()
        public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        return cls("ED25519", 256, public.decode(), private)


@dataclass(frozen=True)
class BootTarget:
    kind: BootKind
    rescue_password: str | None = field(default=None, repr=False)
    authorized_keys: tuple[str, ...] = ()
    host_keys: tuple[HostKeyPair, ...] = ()


@dataclass(frozen=True)
class NewServer:
    """A server an order delivered, as the fleet needs it to create the machine."""

    server_number: int
    server_name: str
    server_ip: str
    product: str
    dc: str


class PowerHook(Protocol):
    def on_reset(self, server_number: int, kind: str, boot: BootTarget) -> None:
        """``kind`` is the Robot reset type that caused it (``hw``, ``sw``, ``power``...)."""


class NewServerHook(Protocol):
    def on_new_server(self, server: NewServer) -> None: ...


class NullHook:
    """Does nothing: the simulator without a fleet behind it."""

    def on_reset(self, server_number: int, kind: str, boot: BootTarget) -> None:
        return None

    def on_new_server(self, server: NewServer) -> None:
        return None
