"""The simulated GEX131's hardware, as the guest-side shims (lsblk, lspci, smartctl) read it.

Why a file and not code in the shims: the same description must be visible inside every boot of the
host (rescue or installed) and changeable from the test side while the host runs (a disk's SMART
health turning FAILED, the GPU falling off the bus). The simulator keeps it in the host's ``hw/``
directory, bind-mounted read-only at ``/run/sim/hw`` in the guest, and rewrites it atomically.

Defaults follow Hetzner's GEX131 (hetzner.md §4.1): a Xeon Gold 5412U (24 cores, 48 threads), 256 GB,
2 x 960 GB NVMe and an RTX PRO 6000 Blackwell (CPU and memory reach the guest through ``procfs`` and
the ``nproc`` shim);
the PCI device id is configurable (2bb5, the Server Edition, by default; the GEX131 edition is
unconfirmed). WWNs and serials are derived from the server number, so they are stable across runs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

HW_FILE = "hardware.json"
NVME_960GB_BYTES = 960_197_124_096
NVME_MODEL = "SAMSUNG MZQL2960HCJR-00A07"
DEFAULT_GPU_DEVICE_ID = "2bb5"
CPU_MODEL = "Intel(R) Xeon(R) Gold 5412U"
MEMORY_256GB = 256 * 1024**3
# What the kernel reports as MemTotal with 256 GB installed (firmware and kernel reservations taken off);
# the simulated kubelet's memory capacity is the same figure.
MEM_TOTAL_256GB_KIB = 263_856_952

# The name nvidia-smi / NVML report, by PCI device id.
SMI_NAMES: dict[str, str] = {
    "2bb5": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "2bb1": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
    "2bb4": "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
}
# (lspci class name, class code, device name) by PCI device id, as pci.ids names them.
GPU_NAMES: dict[str, tuple[str, str, str]] = {
    "2bb5": ("3D controller", "0302", "GB202GL [RTX PRO 6000 Blackwell Server Edition]"),
    "2bb1": ("VGA compatible controller", "0300", "GB202GL [RTX PRO 6000 Blackwell Workstation Edition]"),
    "2bb4": ("VGA compatible controller", "0300", "GB202GL [RTX PRO 6000 Blackwell Max-Q Workstation Edition]"),
}


@dataclass(frozen=True)
class Disk:
    name: str
    wwn: str
    serial: str
    size: int = NVME_960GB_BYTES
    model: str = NVME_MODEL
    smart: str = "PASSED"

    @property
    def by_id(self) -> tuple[str, ...]:
        """udev's /dev/disk/by-id names for an NVMe namespace (nvme-<WWN>, nvme-<model>_<serial>)."""
        return (f"nvme-{self.wwn}", f"nvme-{self.model.replace(' ', '_')}_{self.serial}")


@dataclass(frozen=True)
class Hardware:
    disks: tuple[Disk, ...]
    gpu_device_id: str = DEFAULT_GPU_DEVICE_ID
    gpu_slot: str = "0000:01:00.0"
    gpu_on_bus: bool = True
    installimage_seconds: float = 1.0
    wipefs_seconds: float = 0.0  # how long `wipefs -a` takes (a crash test's window inside the Wipe step)
    kubeadm_writes_sentinel: bool = True
    # The firmware boots the rescue system in UEFI mode: /sys/firmware/efi exists there, which is what
    # installimage reads to demand an EFI System Partition (functions.sh: UEFI=1, "ESP missing").
    uefi: bool = False
    cpu_model: str = CPU_MODEL
    cpu_cores: int = 24
    cpu_threads: int = 48
    cpu_mhz: float = 2100.0
    memory_bytes: int = MEMORY_256GB  # installed
    mem_total_kib: int = MEM_TOTAL_256GB_KIB  # /proc/meminfo's MemTotal
    extra: dict[str, Any] = field(default_factory=dict)
    # GPU shim knobs over the identity below (config.json keys: driver_version, mig_toggle...): fault injection.
    gpu_shim: dict[str, Any] = field(default_factory=dict)

    def with_smart(self, disk: str, health: str) -> Hardware:
        return replace(self, disks=tuple(replace(d, smart=health) if d.name == disk else d for d in self.disks))

    def to_json(self) -> dict[str, Any]:
        cls_name, cls, dev_name = GPU_NAMES.get(self.gpu_device_id, ("3D controller", "0302", "Device"))
        pci = [
            _pci("0000:00:00.0", "Host bridge", "0600", "8086", "09a2", "Intel Corporation", "Device", "20"),
            {
                **_pci(self.gpu_slot, cls_name, cls, "10de", self.gpu_device_id, "NVIDIA Corporation", dev_name, "a1"),
                "lost": not self.gpu_on_bus,
            },
            _pci("0000:01:00.1", "Audio device", "0403", "10de", "22e8", "NVIDIA Corporation", "Device", "a1"),
        ]
        for i, _ in enumerate(self.disks):
            pci.append(
                _pci(
                    f"0000:{2 + i:02x}:00.0",
                    "Non-Volatile memory controller",
                    "0108",
                    "144d",
                    "a80a",
                    "Samsung Electronics Co Ltd",
                    "NVMe SSD Controller PM9A1/PM9A3/980PRO",
                    None,
                )
            )
        pci.append(
            _pci(
                "0000:10:00.0",
                "Ethernet controller",
                "0200",
                "8086",
                "1533",
                "Intel Corporation",
                "I210 Gigabit Network Connection",
                "03",
            )
        )
        return {
            "disks": [asdict(d) | {"rota": False} for d in self.disks],
            "gpu": {"vendor": "10de", "device": self.gpu_device_id, "slot": self.gpu_slot, "on_bus": self.gpu_on_bus},
            "pci": pci,
            "cpu": {"model": self.cpu_model, "cores": self.cpu_cores, "threads": self.cpu_threads},
            "memory": {"installed_bytes": self.memory_bytes, "mem_total_kib": self.mem_total_kib},
            "installimage_seconds": self.installimage_seconds,
            "wipefs_seconds": self.wipefs_seconds,
            "kubeadm_writes_sentinel": self.kubeadm_writes_sentinel,
            "uefi": self.uefi,
            **self.extra,
        }


def _pci(
    slot: str, class_name: str, cls: str, vendor: str, device: str, vendor_name: str, device_name: str, rev: str | None
) -> dict[str, Any]:
    return {
        "slot": slot,
        "class_name": class_name,
        "class": cls,
        "vendor": vendor,
        "device": device,
        "vendor_name": vendor_name,
        "device_name": device_name,
        "rev": rev,
    }


def gex131(server_number: int, gpu_device_id: str = DEFAULT_GPU_DEVICE_ID) -> Hardware:
    disks = []
    for i in range(2):
        digest = hashlib.sha256(f"gex131-{server_number}-nvme{i}".encode()).hexdigest()
        disks.append(Disk(name=f"nvme{i}n1", wwn=f"eui.36344830{digest[:24]}", serial=f"S64F{digest[24:32].upper()}"))
    return Hardware(disks=tuple(disks), gpu_device_id=gpu_device_id)


def gpu_shim_config(hw: Hardware, server_number: int, lost: bool = False) -> dict[str, Any]:
    """The GPU shim's knobs (``/var/lib/gpu-shim/config.json``) for this host's GPU: identity follows the
    hardware (PCI device id, a stable UUID and serial per server); the driver version stays the package's."""
    digest = hashlib.sha256(f"gex131-{server_number}-gpu".encode()).hexdigest()
    uuid = f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
    return {
        "device_id": f"0x{hw.gpu_device_id.upper()}10DE",
        "uuid": uuid,
        "name": SMI_NAMES.get(hw.gpu_device_id, "NVIDIA Graphics Device"),
        "bus_id": f"0000{hw.gpu_slot}",  # nvidia-smi's 8-digit domain form: 00000000:01:00.0
        "serial": str(1655025000000 + server_number % 1_000_000),
        "lost": lost,
        **hw.gpu_shim,
    }


def write(hw_dir: Path, hw: Hardware) -> None:
    hw_dir.mkdir(parents=True, exist_ok=True)
    tmp = hw_dir / f".{HW_FILE}.tmp"
    tmp.write_text(json.dumps(hw.to_json(), indent=1))
    tmp.replace(hw_dir / HW_FILE)


def disk_lines(hw: Hardware) -> str:
    """The boot script's fake-disk list: ``<name> <by-id link>...`` per line."""
    return "".join(f"{d.name} {' '.join(d.by_id)}\n" for d in hw.disks)
