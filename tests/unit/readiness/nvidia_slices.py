"""Builders for ResourceSlices exactly as the NVIDIA DRA kubelet plugin publishes them (dra-nvidia.md §3).

One pool per node named after the node, slices named ``<node>-gpu.nvidia.com-<rand>``, MIG devices named
``gpu-<minor>-mig-<profile: lower-cased, dots removed, other invalid characters -> "-">-<GI id>-<start>``,
attributes in the driver domain unqualified (``type``, ``uuid``, ``parentUUID``, ``profile``, product,
brand, architecture, versions) plus ``resource.kubernetes.io/`` PCI attributes, capacities in bytes and
counts, and static MIG's ``memorySlice<N>`` capacities. Not a test module: the readiness tests import it.
"""

from __future__ import annotations

import re
import uuid as uuidlib
from typing import Any

GPU_UUID = "GPU-5d0d1f6a-7c43-4c8e-9b1e-2f7c6a1b9e01"
PRODUCT = "NVIDIA RTX PRO 6000 Blackwell Server Edition"

# profile -> (GI profile id, memory slices, multiprocessors, decoders, encoders, jpeg, ofa)
RTX_PRO_6000: dict[str, tuple[int, int, int, int, int, int, int]] = {
    "1g.24gb": (14, 1, 46, 1, 1, 1, 0),
    "1g.24gb+me": (21, 1, 46, 1, 1, 1, 1),
    "1g.24gb+gfx": (47, 1, 46, 1, 1, 1, 0),
    "1g.24gb+me.all": (65, 1, 46, 4, 4, 4, 1),
    "1g.24gb-me": (67, 1, 46, 0, 0, 0, 0),
    "2g.48gb": (5, 2, 94, 2, 2, 2, 0),
    "2g.48gb+gfx": (35, 2, 94, 2, 2, 2, 0),
    "2g.48gb+me.all": (64, 2, 94, 4, 4, 4, 1),
    "2g.48gb-me": (66, 2, 94, 0, 0, 0, 0),
    "4g.96gb": (0, 4, 188, 4, 4, 4, 1),
    "4g.96gb+gfx": (32, 4, 188, 4, 4, 4, 1),
}
_SLICE_BYTES = 24_696_061_952  # ~23 GiB per memory slice, as lgip reports on R580


def canonical_profile(profile: str) -> str:
    """NVIDIA's device-name form of a profile: lower-cased, dots removed, invalid characters -> '-'."""
    return re.sub(r"[^a-z0-9-]", "-", profile.lower().replace(".", ""))


def mig_name(profile: str, placement: int, minor: int = 0) -> str:
    gi = RTX_PRO_6000[profile][0]
    return f"gpu-{minor}-mig-{canonical_profile(profile)}-{gi}-{placement}"


def mig_uuid(profile: str, placement: int, seed: str = "") -> str:
    return f"MIG-{uuidlib.uuid5(uuidlib.NAMESPACE_OID, f'{seed}{profile}/{placement}')}"


def mig_device(
    profile: str, placement: int, *, seed: str = "", taints: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    _gi, slices, sms, dec, enc, jpeg, ofa = RTX_PRO_6000[profile]
    capacity: dict[str, Any] = {
        "multiprocessors": {"value": str(sms)},
        "copyEngines": {"value": str(slices)},
        "decoders": {"value": str(dec)},
        "encoders": {"value": str(enc)},
        "jpegEngines": {"value": str(jpeg)},
        "ofaEngines": {"value": str(ofa)},
        "memory": {"value": str(slices * _SLICE_BYTES)},
    }
    # Static MIG announces the NVML placement units a device covers; RTX PRO 6000 has 12, 3 per slice.
    for index in range(placement, placement + 3 * slices):
        capacity[f"memorySlice{index}"] = {"value": "1"}
    device: dict[str, Any] = {
        "name": mig_name(profile, placement),
        "attributes": {
            "type": {"string": "mig"},
            "uuid": {"string": mig_uuid(profile, placement, seed)},
            "parentUUID": {"string": GPU_UUID},
            "profile": {"string": profile},
            "productName": {"string": PRODUCT},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Blackwell"},
            "cudaComputeCapability": {"version": "12.0.0"},
            "driverVersion": {"version": "580.95.5"},
            "cudaDriverVersion": {"version": "13.0.0"},
            "resource.kubernetes.io/pciBusID": {"string": "0000:c1:00.0"},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:c0"},
        },
        "capacity": capacity,
    }
    if taints:
        device["taints"] = taints
    return device


def full_gpu_device() -> dict[str, Any]:
    """What the plugin publishes when MIG is off: the whole GPU as ``gpu-0``."""
    return {
        "name": "gpu-0",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": GPU_UUID},
            "productName": {"string": PRODUCT},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Blackwell"},
            "cudaComputeCapability": {"version": "12.0.0"},
            "driverVersion": {"version": "580.95.5"},
            "cudaDriverVersion": {"version": "13.0.0"},
            "resource.kubernetes.io/pciBusID": {"string": "0000:c1:00.0"},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:c0"},
        },
        "capacity": {"memory": {"value": str(4 * _SLICE_BYTES)}},
    }


def layout_devices(layout: list[tuple[str, int]], *, seed: str = "") -> list[dict[str, Any]]:
    """MIG devices for ``[(profile, placement start), ...]``; starts are NVML placement units (0/3/6/9)."""
    return [mig_device(p, start, seed=seed) for p, start in layout]


# Placement starts as nvidia-smi mig -lgipp reports them on RTX PRO 6000: quarters at 0/3/6/9, halves at 0/6.
# BALANCED is where capi_gpu.gpu.layout places all-balanced (largest first, lowest free start).
BALANCED = [("1g.24gb", 6), ("1g.24gb", 9), ("2g.48gb", 0)]
ALL_1G = [("1g.24gb", i) for i in (0, 3, 6, 9)]


def nvidia_slice(
    node: str,
    devices: list[dict[str, Any]],
    *,
    generation: int = 1,
    count: int = 1,
    suffix: str = "x7k2p",
    driver: str = "gpu.nvidia.com",
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}-{suffix}", "resourceVersion": "1"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
            "devices": devices,
        },
    }


def xid_taint(code: int = 79, effect: str = "NoSchedule") -> dict[str, Any]:
    return {
        "key": "gpu.nvidia.com/xid",
        "value": str(code),
        "effect": effect,
        "timeAdded": "2026-09-01T10:00:00Z",
    }


def gpu_lost_taint() -> dict[str, Any]:
    """What the driver's NVMLDeviceHealthCheck puts on every device when NVML reports the GPU lost."""
    return {"key": "gpu.nvidia.com/gpu-lost", "effect": "NoSchedule", "timeAdded": "2026-09-01T10:00:00Z"}
