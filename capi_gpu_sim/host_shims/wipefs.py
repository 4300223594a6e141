"""`wipefs` for the simulated rescue system: erases the signatures the simulator records for its disks.

Why: the controller's Wipe step runs ``wipefs -a /dev/<disk>`` for each disk it clears (another OS that
could boot instead of ours, a disk the operator asked to wipe), then checks with ``lsblk`` that nothing
OS-like is left. The simulated disks are not block devices but records in ``/run/sim/disk`` (the rescue
view's window onto the host's "disk"): ``partitions.json``, which the installimage shim writes and the
previous OS comes with, and ``installed.json``, what boots. So this edits those records the way the real
wipefs changes a disk (util-linux 2.38 messages):

- ``wipefs -a /dev/nvme0n1`` erases the partition table (GPT, its backup, the protective MBR): the disk
  has no partitions any more, and lsblk shows it bare;
- ``wipefs -a /dev/nvme0n1p2`` erases that partition's filesystem signature: no FSTYPE;
- without ``-a`` it lists the signatures; ``-n`` does everything but write; ``-t`` limits the types;
- when no disk of the installed OS keeps a filesystem, that OS no longer boots (``installed.json`` goes),
  as a server whose boot disk was wiped. A RAID 1 member wiped alone leaves the OS on its mirror.

Standard library only; runs with the guest's python3.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DISK = Path(os.environ.get("SIM_DISK", "/run/sim/disk"))
HW_PATH = Path(os.environ.get("SIM_HW_PATH", "/run/sim/hw/hardware.json"))
# (offset, magic bytes) of each signature type, where blkid finds it.
MAGIC: dict[str, tuple[int, str]] = {
    "ext4": (0x438, "53 ef"),
    "ext3": (0x438, "53 ef"),
    "ext2": (0x438, "53 ef"),
    "xfs": (0x0, "58 46 53 42"),
    "btrfs": (0x10040, "5f 42 48 52 66 53 5f 4d"),
    "swap": (0xFF6, "53 57 41 50 53 50 41 43 45 32"),
    "vfat": (0x52, "46 41 54 33 32 20 20 20"),
    "linux_raid_member": (0x1000, "fc 4e 2b a9"),
    "LVM2_member": (0x218, "4c 56 4d 32 20 30 30 31"),
}
GPT_MAGIC = "45 46 49 20 50 41 52 54"


class WipeError(Exception):
    pass


@dataclass
class Options:
    erase: bool = False
    no_act: bool = False
    quiet: bool = False
    types: list[str] | None = None
    devices: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Signature:
    device: str  # /dev/... as named on the command line
    name: str  # the kernel's name (nvme0n1, nvme0n1p2), as the listing shows it
    offset: int
    type: str
    magic: str

    def erased(self) -> str:
        size = len(self.magic.split())
        return f"{self.device}: {size} bytes were erased at offset 0x{self.offset:08x} ({self.type}): {self.magic}"


SHORT = {"a": "erase", "n": "no_act", "q": "quiet", "f": "", "b": ""}
LONG = {"--all": "erase", "--no-act": "no_act", "--quiet": "quiet", "--force": "", "--backup": ""}


def parse(argv: list[str]) -> Options:
    opts = Options()
    args = iter(argv)
    for arg in args:
        if arg in ("-t", "--types"):
            opts.types = next(args, "").split(",")
        elif arg.startswith("--types="):
            opts.types = arg.split("=", 1)[1].split(",")
        elif arg in LONG:
            if LONG[arg]:
                setattr(opts, LONG[arg], True)
        elif arg.startswith("--"):
            raise WipeError(f"wipefs: unrecognized option '{arg}'")
        elif arg.startswith("-") and len(arg) > 1:
            for flag in arg[1:]:
                if flag not in SHORT:
                    raise WipeError(f"wipefs: invalid option -- '{flag}'")
                if SHORT[flag]:
                    setattr(opts, SHORT[flag], True)
        else:
            opts.devices.append(arg)
    if not opts.devices:
        raise WipeError("wipefs: no device specified")
    return opts


def _load(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


def _resolve(device: str, sizes: dict[str, int]) -> tuple[str, int | None]:
    """(disk name, partition index or None) behind a device path; WipeError as wipefs words it."""
    path = os.path.realpath(device) if device.startswith("/dev/disk/") else device
    name = path[5:] if path.startswith("/dev/") else ""
    if name in sizes:
        return name, None
    m = re.fullmatch(r"(.+)p(\d+)", name)
    if m and m.group(1) in sizes:
        return m.group(1), int(m.group(2))
    raise WipeError(f"wipefs: error: {device}: probing initialization failed: No such file or directory")


def _wanted(kind: str, types: list[str] | None) -> bool:
    if not types:
        return True
    if all(t.startswith("no") for t in types):
        return kind not in {t[2:] for t in types}
    return kind in types


def signatures(device: str, disk: str, index: int | None, size: int, parts: list[dict[str, Any]]) -> list[Signature]:
    if index is None:
        if not parts:
            return []
        return [
            Signature(device, disk, 0x200, "gpt", GPT_MAGIC),
            Signature(device, disk, size - 512, "gpt", GPT_MAGIC),
            Signature(device, disk, 0x1FE, "PMBR", "55 aa"),
        ]
    if index > len(parts):
        raise WipeError(f"wipefs: error: {device}: probing initialization failed: No such file or directory")
    fstype = parts[index - 1].get("fstype")
    if not fstype:
        return []
    offset, magic = MAGIC.get(str(fstype), (0x0, "00"))
    return [Signature(device, f"{disk}p{index}", offset, str(fstype), magic)]


def _os_bootable(table: dict[str, list[dict[str, Any]]], os_disks: list[str]) -> bool:
    return any(p.get("fstype") for d in os_disks for p in table.get(d, []))


def _write(table: dict[str, list[dict[str, Any]]], os_disks: list[str]) -> None:
    path = DISK / "partitions.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(table, indent=1))
    tmp.replace(path)
    if os_disks and not _os_bootable(table, os_disks):
        (DISK / "installed.json").unlink(missing_ok=True)


def run(opts: Options) -> int:
    sizes = {d["name"]: int(d["size"]) for d in _load(HW_PATH, {}).get("disks", [])}
    table: dict[str, list[dict[str, Any]]] = _load(DISK / "partitions.json", {})
    record = _load(DISK / "installed.json", None)
    os_disks: list[str] = []
    if isinstance(record, dict):
        os_disks = list(record.get("disks") or [d for d, rows in table.items() if rows])
    found: list[Signature] = []
    for device in opts.devices:
        disk, index = _resolve(device, sizes)
        parts = table.get(disk, [])
        sigs = [s for s in signatures(device, disk, index, sizes[disk], parts) if _wanted(s.type, opts.types)]
        found += sigs
        if not opts.erase or not sigs:
            continue
        for sig in sigs:
            if not opts.quiet:
                print(sig.erased())
        if index is None:
            table[disk] = []
            if not opts.quiet:
                print(f"{device}: calling ioctl to re-read partition table: Success")
        else:
            parts[index - 1] = {**parts[index - 1], "fstype": None}
    if opts.erase and not opts.no_act:
        _write(table, os_disks)
    if not opts.erase and found and not opts.quiet:
        print_table(found)
    return 0


def print_table(found: list[Signature]) -> None:
    """libsmartcols' layout: columns as wide as their widest cell, one space apart, no trailing blanks."""
    rows = [["DEVICE", "OFFSET", "TYPE", "UUID", "LABEL"]]
    rows += [[sig.name, f"0x{sig.offset:x}", sig.type, "", ""] for sig in found]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(" ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def main(argv: list[str]) -> int:
    try:
        args = parse(argv)
        delay = float(_load(HW_PATH, {}).get("wipefs_seconds", 0.0))
        if delay > 0 and args.erase and not args.no_act:
            time.sleep(delay)  # a slow erase: room for a crash test to kill the operator mid-wipe
        return run(args)
    except WipeError as exc:
        print(str(exc), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
