"""Parsing what servers print: lsblk JSON from util-linux 2.38 (numbers, booleans) and 2.34 (strings),
SMART health lines (ATA and SCSI), cloud-init status lines across versions, the other-Linux check, and
a GPU that fell off the bus (rev ff)."""

from __future__ import annotations

import json

import pytest

from capi_gpu.gpu import nvidia_smi
from capi_gpu.provisioning import hostfacts
from capi_gpu.provisioning.model import CloudInitState

LSBLK_238 = {
    "blockdevices": [
        {
            "name": "nvme0n1",
            "wwn": "eui.36344830528020740025384500000001",
            "size": 960197124096,
            "model": "SAMSUNG MZQL2960HCJR-00A07",
            "serial": "S64FNE0R123456",
            "rota": False,
            "type": "disk",
            "fstype": None,
            "children": [
                {
                    "name": "nvme0n1p1",
                    "wwn": "eui.36344830528020740025384500000001",
                    "size": 1073741824,
                    "model": None,
                    "serial": None,
                    "rota": False,
                    "type": "part",
                    "fstype": "ext4",
                }
            ],
        },
        {
            "name": "nvme1n1",
            "wwn": "eui.36344830528020740025384500000002",
            "size": 960197124096,
            "model": "SAMSUNG MZQL2960HCJR-00A07",
            "serial": "S64FNE0R654321",
            "rota": False,
            "type": "disk",
            "fstype": None,
        },
        {"name": "loop0", "wwn": None, "size": 4096, "model": None, "serial": None, "rota": False, "type": "loop"},
    ]
}
LSBLK_234 = {
    "blockdevices": [
        {
            "name": "sda",
            "wwn": "0x5000c500a1b2c3d4",
            "size": "4000787030016",
            "model": "ST4000NM0035-1V4107  ",
            "serial": "ZC1ABCDE",
            "rota": "1",
            "type": "disk",
            "fstype": None,
        }
    ]
}


def test_lsblk_238_disks_with_partitions() -> None:
    disks = hostfacts.parse_lsblk(json.dumps(LSBLK_238))
    assert [d.name for d in disks] == ["nvme0n1", "nvme1n1"]
    assert disks[0].size_bytes == 960197124096 and not disks[0].rotational
    assert disks[0].partitions == (hostfacts.Partition("nvme0n1p1", 1073741824, "ext4"),)


def test_lsblk_234_strings() -> None:
    (disk,) = hostfacts.parse_lsblk(json.dumps(LSBLK_234))
    assert disk.size_bytes == 4000787030016 and disk.rotational and disk.model == "ST4000NM0035-1V4107"


def test_other_linux_skips_the_root_disks() -> None:
    disks = hostfacts.parse_lsblk(json.dumps(LSBLK_238))
    assert hostfacts.other_linux(disks, ["eui.36344830528020740025384500000001"]) == []
    found = hostfacts.other_linux(disks, ["eui.36344830528020740025384500000002"])
    assert found == ["nvme0n1p1 (ext4) on eui.36344830528020740025384500000001"]


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("=== START OF SMART DATA SECTION ===\nSMART overall-health self-assessment test result: PASSED\n", True),
        (
            "SMART overall-health self-assessment test result: FAILED!\n- NVM subsystem reliability has been degraded",
            False,
        ),
        ("=== START OF READ SMART DATA SECTION ===\nSMART Health Status: OK\n", True),
        ("Smartctl open device: /dev/nvme9n1 failed: No such device\n", False),
    ],
)
def test_smart_health(text: str, ok: bool) -> None:
    assert hostfacts.smart_passed(text) is ok


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ("status: done\n", CloudInitState.DONE),
        ("\nstatus: running\n", CloudInitState.RUNNING),
        ("status: error\n", CloudInitState.ERROR),
        ("status: not run\n", CloudInitState.NOT_STARTED),
        ("status: not started\n", CloudInitState.NOT_STARTED),
        ("status: disabled\n", CloudInitState.DISABLED),
        ("status: degraded done\n", CloudInitState.DONE),
        ("bash: cloud-init: command not found\n", CloudInitState.UNKNOWN),
    ],
)
def test_cloud_init_status(text: str, state: CloudInitState) -> None:
    assert hostfacts.parse_cloud_init_status(text) is state


def test_a_gpu_reading_all_ones_fell_off_the_bus() -> None:
    text = (
        "01:00.0 3D controller [0302]: NVIDIA Corporation GB202GL [RTX PRO 6000 Blackwell Server Edition] "
        "[10de:2bb5] (rev ff)\n"
    )
    (gpu,) = nvidia_smi.nvidia_gpus(text)
    assert hostfacts.fell_off_bus(gpu)
    assert not hostfacts.fell_off_bus(nvidia_smi.nvidia_gpus(text.replace("rev ff", "rev a1"))[0])
