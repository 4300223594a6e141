"""The Install step asks the rescue system whether it booted in UEFI mode and, if so, gives installimage
the EFI System Partition it demands there; in BIOS mode the config stays as the spec says. Each config
is checked by the simulated installimage's own rules, in the matching firmware mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capi_gpu.api.host import DiskInfo, HardwareDetails, HetznerGPUHost, HetznerGPUHostSpec
from capi_gpu.controllers import host_actions
from capi_gpu.controllers.host_context import HostEnv
from capi_gpu.provisioning.hostkeys import HostKeyPair
from capi_gpu.provisioning.model import Outcome
from capi_gpu_sim.host_shims import installimage as sim_installimage
from capi_gpu_sim.hosts import hardware

IMAGE = "Ubuntu-2404-noble-amd64-base.tar.zst"


class Shell:
    def __init__(self, uefi: bool) -> None:
        self._uefi = uefi
        self.autosetup: str | None = None

    def uefi(self) -> bool:
        return self._uefi

    def start_installimage(self, autosetup: str, post_install: str | None = None) -> None:
        self.autosetup = autosetup


def _host() -> HetznerGPUHost:
    hw = hardware.gex131(7)
    host = HetznerGPUHost(metadata={"name": "bm-gpu-7"}, spec=HetznerGPUHostSpec(server_number=7))
    host.status.hardware = HardwareDetails(disks=[DiskInfo(wwn=d.wwn, size_bytes=d.size) for d in hw.disks])
    return host


@pytest.fixture
def sim_rescue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The simulated installimage's view of server 7: its disks (by-id names resolved), the image, BIOS."""
    hw = hardware.gex131(7)
    (tmp_path / "hardware.json").write_text(json.dumps(hw.to_json()))
    monkeypatch.setattr(sim_installimage, "HW_PATH", tmp_path / "hardware.json")
    monkeypatch.setattr(sim_installimage, "DEBUG", tmp_path / "debug.txt")
    monkeypatch.setattr(sim_installimage, "EFI_DIR", tmp_path / "efi")
    by_id = {f"/dev/disk/by-id/{d.by_id[0]}": f"/dev/{d.name}" for d in hw.disks}
    monkeypatch.setattr(sim_installimage.os.path, "realpath", lambda p: by_id.get(p, p))
    (tmp_path / IMAGE).write_bytes(b"")
    return tmp_path


def _run_install(uefi: bool, sim_rescue: Path) -> sim_installimage.Config:
    shell = Shell(uefi)
    env = HostEnv(None, "", "ssh-ed25519 AAAA x", HostKeyPair("priv", "ssh-ed25519 AAAA host"), None)  # type: ignore[arg-type]
    result = host_actions._install(_host(), env, shell)  # type: ignore[arg-type]
    assert result.outcome is Outcome.OK and shell.autosetup is not None
    cfg = sim_installimage.parse(shell.autosetup)
    cfg.image = str(sim_rescue / IMAGE)  # the rescue system's image directory, here a temp dir
    if uefi:
        (sim_rescue / "efi").mkdir()
    assert sim_installimage.validate(cfg) == ["nvme0n1", "nvme1n1"]
    return cfg


def test_a_uefi_rescue_gets_an_esp_first(sim_rescue: Path) -> None:
    cfg = _run_install(True, sim_rescue)
    assert [(p.mount, p.fs, p.size) for p in cfg.parts] == [
        ("/boot/efi", "esp", "256"),
        ("/boot", "ext4", "1024"),
        ("/", "ext4", "all"),
    ]


def test_a_bios_rescue_gets_the_spec_partitions_only(sim_rescue: Path) -> None:
    cfg = _run_install(False, sim_rescue)
    assert [p.mount for p in cfg.parts] == ["/boot", "/"]
