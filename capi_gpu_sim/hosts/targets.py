"""What a simulated server boots into after a reset: the rescue system (with Robot's credentials) or its disk.

Why a tiny module of its own: the Robot simulator decides the target (rescue armed or not) and the
fleet carries it to the host; both sides need the same vocabulary without importing each other's
machinery. ``RescueBoot`` holds secrets (password, private host keys): its repr hides them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RescueBoot:
    """Boot Hetzner's rescue system: root's authorized public keys, the generated host keys (private,
    OpenSSH or PEM text) whose fingerprints Robot reported, and the generated password (optional)."""

    authorized_keys: tuple[str, ...]
    host_keys: tuple[str, ...] = field(repr=False)
    password: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class DiskBoot:
    """Boot whatever is on the disk: the installed OS, the previous OS, or nothing on a blank disk."""


BootTarget = RescueBoot | DiskBoot


class State(enum.StrEnum):
    OFF = "off"
    DOWN = "down"  # resetting: dark until the scheduled boot
    BOOTING = "booting"
    UP = "up"  # sshd answers on port 22


class Running(enum.StrEnum):
    NOTHING = "nothing"
    RESCUE = "rescue"
    INSTALLED = "installed"  # an OS installed by installimage
    PREVIOUS = "previous"  # the OS the server came with
