"""Free devices: published by gpu.nvidia.com (newest pool generation only), minus what allocated claims hold,
minus NoSchedule/NoExecute-tainted devices; whole GPUs, other drivers and admin access; GPU nodes."""

from __future__ import annotations

from typing import Any

from capi_gpu.autoscaler import supply
from capi_gpu.gpu.packing import WHOLE_GPU


def mig_device(name: str, profile: str, taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    device: dict[str, Any] = {
        "name": name,
        "attributes": {
            "type": {"string": "mig"},
            "profile": {"string": profile},
            "uuid": {"string": f"MIG-{name}"},
            "productName": {"string": "NVIDIA RTX PRO 6000 Blackwell Server Edition"},
        },
        "capacity": {"memory": {"value": "25769803776"}},
    }
    if taints:
        device["taints"] = taints
    return device


BALANCED = [
    mig_device("gpu-0-mig-1g24gb-14-0", "1g.24gb"),
    mig_device("gpu-0-mig-1g24gb-14-1", "1g.24gb"),
    mig_device("gpu-0-mig-2g48gb-5-2", "2g.48gb"),
]


def nvidia_slice(
    node: str, devices: list[dict[str, Any]], generation: int = 1, driver: str = "gpu.nvidia.com", suffix: str = "abcde"
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}-{suffix}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "devices": devices,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
        },
    }


def allocated_claim(*held: tuple[str, str], driver: str = "gpu.nvidia.com", admin: bool = False) -> dict[str, Any]:
    results = [
        {"request": "mig", "driver": driver, "pool": pool, "device": dev, **({"adminAccess": True} if admin else {})}
        for pool, dev in held
    ]
    return {
        "metadata": {"name": "c", "namespace": "team-a"},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def test_published_minus_allocated() -> None:
    slices = [nvidia_slice("gex-1", BALANCED), nvidia_slice("gex-2", BALANCED)]
    claims = [allocated_claim(("gex-1", "gpu-0-mig-2g48gb-5-2"), ("gex-2", "gpu-0-mig-1g24gb-14-0"))]
    assert supply.free_devices(slices, claims) == {"1g.24gb": 3, "2g.48gb": 1}


def test_only_the_newest_generation_counts() -> None:
    slices = [
        nvidia_slice("gex-1", BALANCED, generation=1, suffix="old"),
        nvidia_slice("gex-1", [mig_device("gpu-0-mig-4g96gb-0-0", "4g.96gb")], generation=2),
    ]
    assert supply.free_devices(slices, []) == {"4g.96gb": 1}


def test_tainted_devices_are_not_free_unless_the_effect_is_none() -> None:
    devices = [
        mig_device("a", "1g.24gb", [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]),
        mig_device("b", "1g.24gb", [{"key": "gpu.nvidia.com/gpu-lost", "effect": "NoExecute"}]),
        mig_device("c", "1g.24gb", [{"key": "gpu.nvidia.com/unmonitored", "effect": "None"}]),
    ]
    assert supply.free_devices([nvidia_slice("gex-1", devices)], []) == {"1g.24gb": 1}


def test_whole_gpus_and_other_drivers() -> None:
    whole = {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}
    slices = [nvidia_slice("gex-1", [whole]), nvidia_slice("gex-1", [{"name": "gate"}], driver="gate.example.com")]
    assert supply.free_devices(slices, [allocated_claim(("gex-1", "gate"), driver="gate.example.com")]) == {
        WHOLE_GPU: 1
    }
    assert supply.gpu_nodes(slices) == {"gex-1"}


def test_admin_access_holds_no_device() -> None:
    slices = [nvidia_slice("gex-1", BALANCED)]
    claims = [allocated_claim(("gex-1", "gpu-0-mig-2g48gb-5-2"), admin=True)]
    assert supply.free_devices(slices, claims) == {"1g.24gb": 2, "2g.48gb": 1}
