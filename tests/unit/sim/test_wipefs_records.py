"""The wipefs shim on the simulator's disk records: -a on a disk drops its partition table (lsblk shows it
bare, other-Linux finds nothing), on a partition its filesystem; the OS stops booting once no disk of it
keeps a filesystem (a RAID 1 mirror keeps it alive); listing, --no-act, --types and unknown devices."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from capi_gpu.provisioning import hostfacts, ssh
from capi_gpu_sim import host_shims
from capi_gpu_sim.hosts import hardware

SHIMS = Path(host_shims.__file__).parent
HW = hardware.gex131(2_000_001)
OS_PARTS = [
    {"size": 1024**3, "fstype": "ext4", "mount": "/boot"},
    {"size": 900 * 1024**3, "fstype": "ext4", "mount": "/"},
]


class Disk:
    """A host's disk records in a temp dir, and the shims run against them."""

    def __init__(self, root: Path, table: dict[str, Any], os_disks: list[str] | None) -> None:
        self.root = root
        hardware.write(root / "hw", HW)
        (root / "disk").mkdir()
        (root / "disk" / "partitions.json").write_text(json.dumps(table))
        if os_disks is not None:
            (root / "disk" / "installed.json").write_text(json.dumps({"hostname": "x", "disks": os_disks}))
        (root / "lsblk").symlink_to(SHIMS / "hwinfo.py")

    def _run(self, script: Path, *args: str) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": os.environ["PATH"],
            "SIM_DISK": str(self.root / "disk"),
            "SIM_HW_PATH": str(self.root / "hw" / hardware.HW_FILE),
            "SIM_PARTS_PATH": str(self.root / "disk" / "partitions.json"),
        }
        return subprocess.run(
            [sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=30, check=False
        )

    def wipefs(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self._run(SHIMS / "wipefs.py", *args)

    def disks(self) -> list[hostfacts.Disk]:
        out = self._run(self.root / "lsblk", *ssh.LSBLK.split()[1:])
        assert out.returncode == 0, out.stderr
        return hostfacts.parse_lsblk(out.stdout)

    @property
    def bootable(self) -> bool:
        return (self.root / "disk" / "installed.json").exists()


@pytest.fixture
def previous_os(tmp_path: Path) -> Disk:
    return Disk(tmp_path, {"nvme0n1": OS_PARTS}, ["nvme0n1"])


def test_wiping_the_disk_of_another_os_leaves_nothing_bootable_on_it(previous_os: Disk) -> None:
    _, d1 = (d.wwn or "" for d in previous_os.disks())
    assert hostfacts.other_linux(previous_os.disks(), [d1]) != []
    res = previous_os.wipefs("-a", "/dev/nvme0n1")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        "/dev/nvme0n1: 8 bytes were erased at offset 0x00000200 (gpt): 45 46 49 20 50 41 52 54",
        f"/dev/nvme0n1: 8 bytes were erased at offset 0x{HW.disks[0].size - 512:08x} (gpt): 45 46 49 20 50 41 52 54",
        "/dev/nvme0n1: 2 bytes were erased at offset 0x000001fe (PMBR): 55 aa",
        "/dev/nvme0n1: calling ioctl to re-read partition table: Success",
    ]
    disks = previous_os.disks()
    assert hostfacts.other_linux(disks, [d1]) == []
    assert [(d.name, len(d.partitions)) for d in disks] == [("nvme0n1", 0), ("nvme1n1", 0)]
    assert not previous_os.bootable, "the OS's only disk lost its partition table"
    assert previous_os.wipefs("-a", "/dev/nvme0n1").stdout == "", "nothing left to erase"


def test_a_partition_loses_its_filesystem_only(previous_os: Disk) -> None:
    res = previous_os.wipefs("--all", "/dev/nvme0n1p2")
    assert res.stdout == "/dev/nvme0n1p2: 2 bytes were erased at offset 0x00000438 (ext4): 53 ef\n"
    parts = previous_os.disks()[0].partitions
    assert [p.fstype for p in parts] == ["ext4", None]
    assert previous_os.bootable, "/boot still holds a filesystem"
    previous_os.wipefs("-a", "/dev/nvme0n1p1")
    assert not previous_os.bootable


def test_a_raid1_mirror_keeps_the_os_until_both_halves_are_wiped(tmp_path: Path) -> None:
    raid = [{**p, "fstype": "linux_raid_member"} for p in OS_PARTS]
    disk = Disk(tmp_path, {"nvme0n1": raid, "nvme1n1": raid}, ["nvme0n1", "nvme1n1"])
    disk.wipefs("-qa", "/dev/nvme1n1")
    assert disk.bootable and [len(d.partitions) for d in disk.disks()] == [2, 0]
    assert disk.wipefs("-a", "-q", "/dev/nvme0n1").stdout == ""
    assert not disk.bootable


def test_listing_no_act_types_and_unknown_devices(previous_os: Disk) -> None:
    listing = previous_os.wipefs("/dev/nvme0n1", "/dev/nvme0n1p1")
    assert listing.stdout.splitlines() == [
        "DEVICE    OFFSET       TYPE UUID LABEL",
        "nvme0n1   0x200        gpt",
        f"nvme0n1   0x{HW.disks[0].size - 512:x} gpt",
        "nvme0n1   0x1fe        PMBR",
        "nvme0n1p1 0x438        ext4",
    ]
    dry = previous_os.wipefs("-a", "-n", "/dev/nvme0n1")
    assert "calling ioctl" in dry.stdout and len(previous_os.disks()[0].partitions) == 2
    only_pmbr = previous_os.wipefs("-a", "-t", "PMBR", "/dev/nvme0n1")
    assert only_pmbr.stdout.count("erased") == 1 and "(PMBR)" in only_pmbr.stdout
    assert previous_os.wipefs("-a", "--types=noext4", "/dev/nvme0n1p2").stdout == ""
    missing = previous_os.wipefs("-a", "/dev/sda")
    assert (missing.returncode, missing.stderr.strip()) == (
        1,
        "wipefs: error: /dev/sda: probing initialization failed: No such file or directory",
    )
    assert previous_os.wipefs("-a").stderr.strip() == "wipefs: no device specified"
    assert previous_os.wipefs("-z", "/dev/nvme0n1").returncode == 1
