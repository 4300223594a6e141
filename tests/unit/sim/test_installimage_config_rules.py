"""The installimage shim's config checks, in installimage's order and words: drives against the
server's disks, SWRAID/level consistency, PART mount/fs/size rules with one `all` last, IMAGE suffix
and architecture, BOOTLOADER, HOSTNAME; sizes with M/G/T suffixes; a good config names the disks used.
On a UEFI-booted rescue system (``/sys/firmware/efi``) exactly one ESP at /boot/efi of at least 256M."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capi_gpu_sim.host_shims import installimage
from capi_gpu_sim.hosts import hardware


@pytest.fixture(autouse=True)
def _hw(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hw = tmp_path / "hardware.json"
    hw.write_text(json.dumps(hardware.gex131(42).to_json()))
    images = tmp_path / "images"
    images.mkdir()
    (images / "Ubuntu-2404-noble-amd64-base.tar.gz").write_bytes(b"")
    monkeypatch.setattr(installimage, "HW_PATH", hw)
    monkeypatch.setattr(installimage, "DEBUG", tmp_path / "debug.txt")
    # BIOS mode unless a test says otherwise, whatever firmware the test machine itself booted with.
    monkeypatch.setattr(installimage, "EFI_DIR", tmp_path / "no-efi")
    monkeypatch.setenv("IMG", str(images / "Ubuntu-2404-noble-amd64-base.tar.gz"))


def config(image: str, **over: str) -> str:
    base = {
        "DRIVE1": "/dev/nvme0n1",
        "DRIVE2": "/dev/nvme1n1",
        "SWRAID": "1",
        "SWRAIDLEVEL": "1",
        "BOOTLOADER": "grub",
        "HOSTNAME": "bm-gpu-1",
        "IMAGE": image,
    }
    base.update(over)
    lines = [f"{k} {v}" for k, v in base.items() if v != "-"]
    parts = over.get("PARTS", "PART /boot ext4 1024M\nPART / ext4 all")
    return "\n".join(line for line in lines if not line.startswith("PARTS")) + "\n" + parts + "\n"


def image() -> str:
    import os

    return os.environ["IMG"]


def test_a_good_config_uses_both_raid_disks() -> None:
    assert installimage.validate(installimage.parse(config(image()))) == ["nvme0n1", "nvme1n1"]
    single = config(image(), SWRAID="0", DRIVE2="-", SWRAIDLEVEL="-")
    assert installimage.validate(installimage.parse(single)) == ["nvme0n1"]


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"DRIVE1": "/dev/sda"}, "ERROR: Value for DRIVE1 is not correct: /dev/sda"),
        ({"DRIVE2": "/dev/nvme0n1"}, "Duplicate DRIVE definition. /dev/nvme0n1 used for DRIVE1 and DRIVE2"),
        ({"SWRAID": "2"}, "ERROR: Value for SWRAID is not correct"),
        ({"SWRAIDLEVEL": "4"}, "ERROR: Value for SWRAIDLEVEL is not correct"),
        ({"SWRAIDLEVEL": "5"}, "ERROR: Not enough disks for RAID level 5"),
        (
            {"SWRAIDLEVEL": "0", "PARTS": "PART / ext4 all"},
            "ERROR: You need a /boot partition when using software RAID level 0",
        ),
        (
            {"PARTS": "PART / ext4 all\nPART /var ext4 all"},
            'ERROR: Partition size "all" has to be on the last partition',
        ),
        ({"PARTS": "PART /boot ext4 1024M\nPART /home xfs 10G"}, "ERROR: You dont have a partition for /"),
        ({"PARTS": "PART boot ext4 1G\nPART / ext4 all"}, "ERROR: Mountpoint for partition 1 is not correct"),
        ({"PARTS": "PART /boot ntfs 1G\nPART / ext4 all"}, "ERROR: Filesystem for partition 1 is not correct"),
        (
            {"PARTS": "PART /boot ext4 1x\nPART / ext4 all"},
            "ERROR: The size of the partition PART /boot is not a valid",
        ),
        ({"PARTS": "PART / ext4 1000M"}, "ERROR: Your / partition has to be at least 1500M (current size: 1000)"),
        ({"PARTS": "PART /boot ext4 1G\nPART /boot ext4 all"}, "ERROR: There are identical mountpoints in the config"),
        ({"PARTS": "PART / ext4 2T"}, "ERROR: You are going to use more space than your drives have available."),
        ({"PARTS": ""}, "ERROR: The config has no partitions"),
        ({"BOOTLOADER": "lilo"}, "ERROR: No valid BOOTLOADER"),
        ({"HOSTNAME": "-"}, "ERROR: HOSTNAME may not be empty"),
        ({"IMAGE": "-"}, "ERROR: No valid IMAGEPATH"),
    ],
)
def test_malformed_configs_fail_with_installimage_messages(over: dict[str, str], message: str) -> None:
    with pytest.raises(installimage.ConfigError) as err:
        installimage.validate(installimage.parse(config(image(), **over)))
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("Ubuntu-2404-noble-amd64-base.img", "ERROR: img is no valid FILETYPE for images"),
        ("Ubuntu-2404-noble-arm64-base.tar.gz", "ERROR: can not install an arm64 image on a x86_64 system"),
        ("custom.tar.gz", "ERROR: can not install an custom.tar.gz image on a x86_64 system"),
        ("Ubuntu-custom-base.tar.gz", "ERROR: can not determine image arch from filename"),
        ("Debian-1208-bookworm-amd64-base.tar.zst", "not found"),
    ],
)
def test_image_names(name: str, message: str) -> None:
    with pytest.raises(installimage.ConfigError, match=message):
        installimage.validate(installimage.parse(config(f"/nonexistent/{name}")))


def test_sizes_and_comments() -> None:
    cfg = installimage.parse("# a comment\nPART /boot ext4 1G  # inline\nPART swap swap 4096\nPART / ext4 all\n")
    assert [(p.mount, p.size) for p in cfg.parts] == [("/boot", "1024"), ("swap", "4096"), ("/", "all")]


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ("PART /boot ext4 1024M\nPART / ext4 all", "ERROR: ESP missing or multiple ESP found"),
        (
            "PART /boot/efi esp 256M\nPART /boot2/efi esp 256M\nPART / ext4 all",
            "ERROR: EFI System Partition (ESP) must be mounted at /boot/efi",
        ),
        ("PART /boot/efi esp 128M\nPART / ext4 all", "ERROR: EFI System Partition (ESP) has to be at least 256M"),
        ("PART /boot/efi esp all", "ERROR: EFI System Partition MUST NOT be all remaining disk space"),
    ],
)
def test_uefi_needs_exactly_one_esp(parts: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "efi").mkdir()
    monkeypatch.setattr(installimage, "EFI_DIR", tmp_path / "efi")
    with pytest.raises(installimage.ConfigError) as err:
        installimage.validate(installimage.parse(config(image(), PARTS=parts)))
    assert message in str(err.value)
    good = "PART /boot/efi esp 256M\nPART /boot ext4 1024M\nPART / ext4 all"
    assert installimage.validate(installimage.parse(config(image(), PARTS=good))) == ["nvme0n1", "nvme1n1"]
