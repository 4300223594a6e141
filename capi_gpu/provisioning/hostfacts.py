"""Parsers for what a server prints about itself over SSH: lsblk, smartctl, cloud-init status.

Why pure and separate from the SSH session: the formats are the contract with the outside world
(util-linux 2.34..2.39 lsblk JSON, smartmontools' health line, cloud-init's ``status:`` line; lspci
and nvidia-smi are parsed by ``capi_gpu.gpu.nvidia_smi``), and they are where real servers differ
from each other (lsblk 2.34 prints sizes and ROTA as strings, 2.38 as numbers and booleans). Parsing
here, without I/O, lets unit tests feed real outputs, and keeps ``ssh`` about transport and errors.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from capi_gpu.gpu import nvidia_smi
from capi_gpu.provisioning.model import CloudInitState

# Filesystems that mean "an operating system may live here": another disk with one of these can be
# booted instead of the new OS (CAPH's detect-linux-on-another-disk check, done from lsblk only).
LINUX_FSTYPES = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "reiserfs", "LVM2_member", "linux_raid_member", "crypto_LUKS", "swap"}
)


@dataclass(frozen=True)
class Disk:
    name: str
    wwn: str | None
    size_bytes: int
    model: str | None
    serial: str | None
    rotational: bool
    partitions: tuple[Partition, ...] = ()


@dataclass(frozen=True)
class Partition:
    name: str
    size_bytes: int
    fstype: str | None


def _int(value: Any) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        return 0


def _bool(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("1", "true")


def parse_lsblk(text: str) -> list[Disk]:
    """``lsblk -J -b -o NAME,WWN,SIZE,MODEL,SERIAL,ROTA,TYPE,FSTYPE``: disks with their partitions."""
    data = json.loads(text or "{}")
    disks = []
    for dev in data.get("blockdevices", []):
        if dev.get("type") != "disk":
            continue
        parts = tuple(
            Partition(str(c.get("name")), _int(c.get("size")), c.get("fstype") or None)
            for c in dev.get("children") or []
        )
        disks.append(
            Disk(
                name=str(dev.get("name")),
                wwn=(dev.get("wwn") or None),
                size_bytes=_int(dev.get("size")),
                model=(str(dev["model"]).strip() if dev.get("model") else None),
                serial=(str(dev["serial"]).strip() if dev.get("serial") else None),
                rotational=_bool(dev.get("rota")),
                partitions=parts,
            )
        )
    return disks


def fell_off_bus(device: nvidia_smi.PciDevice) -> bool:
    """A device that reads back all-ones config space (``rev ff``) has dropped off the bus."""
    return (device.revision or "").lower() == "ff"


def smart_passed(text: str) -> bool:
    """smartctl -H: ATA prints ``PASSED``, SCSI/SAS ``Health Status: OK``."""
    return bool(re.search(r"self-assessment test result: PASSED|SMART Health Status: OK", text))


def parse_cloud_init_status(text: str) -> CloudInitState:
    m = re.search(r"^status:\s*(.+?)\s*$", text, flags=re.MULTILINE)
    if not m:
        return CloudInitState.UNKNOWN
    raw = m.group(1).lower()
    if raw in ("not run", "not started"):
        return CloudInitState.NOT_STARTED
    if raw.endswith("done"):  # "degraded done" (23.4+) is done with recoverable errors
        return CloudInitState.DONE
    try:
        return CloudInitState(raw)
    except ValueError:
        return CloudInitState.UNKNOWN


def other_linux(disks: Iterable[Disk], root_wwns: Iterable[str]) -> list[str]:
    """Partitions with an OS-like filesystem on disks that won't hold the new OS (empty: none)."""
    roots = set(root_wwns)
    found: list[str] = []
    for disk in disks:
        if disk.wwn in roots:
            continue
        found.extend(
            f"{p.name} ({p.fstype}) on {disk.wwn or disk.name}" for p in disk.partitions if p.fstype in LINUX_FSTYPES
        )
    return found
