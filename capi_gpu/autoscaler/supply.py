"""Free GPU devices in a workload cluster: what the NVIDIA driver publishes and no claim holds. Pure.

The claim-aware scaler subtracts these from pending demand before it adds a node: a pod that waits while
a matching device is free is waiting for something else (the gate, a taint, its own constraints), and a
new node would not help it. Only the newest generation of each pool counts (the rule every consumer of
ResourceSlices must follow); a device with a ``NoSchedule`` or ``NoExecute`` taint is not free, because
the scheduler won't allocate it. DeviceTaintRules are not read (the readiness gate keeps a node whose
devices are under one tainted, so its pods don't land there either, and this scaler may then add a node).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from capi_gpu import domain, usage
from capi_gpu.gpu import packing
from capi_gpu.readiness.decisions import pools
from capi_gpu.unstructured import as_map

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def allocated(claims: Iterable[Mapping[str, Any]]) -> set[tuple[str, str]]:
    """(pool, device) of every NVIDIA device an allocated claim holds (admin access holds none)."""
    out: set[tuple[str, str]] = set()
    for claim in claims:
        allocation = as_map(as_map(claim.get("status")).get("allocation"))
        for raw in as_map(allocation.get("devices")).get("results") or ():
            r = as_map(raw)
            if r.get("driver") == domain.NVIDIA_DRIVER and not r.get("adminAccess"):
                out.add((str(r.get("pool", "")), str(r.get("device", ""))))
    return out


def gpu_nodes(slices: Iterable[Mapping[str, Any]]) -> set[str]:
    """Nodes whose NVIDIA driver publishes a pool: a replica is no longer "coming" once its node is here."""
    return usage.gpu_nodes(slices)


def device_kind(device: pools.PoolDevice) -> str | None:
    """The planner's name for a published device: its MIG profile, WHOLE_GPU, or None (vfio and others)."""
    if device.type == "mig" and device.profile:
        return device.profile
    if device.type == "gpu":
        return packing.WHOLE_GPU
    return None


def free_devices(slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Free NVIDIA devices by profile (or WHOLE_GPU) across every node."""
    listed = list(slices)
    held = allocated(claims)
    free: Counter[str] = Counter()
    for node in sorted(gpu_nodes(listed)):
        for pool in pools.current_pools(listed, node).values():
            for device in pool.devices.values():
                kind = device_kind(device)
                if kind is None or (pool.name, device.name) in held:
                    continue
                if any(t.effect in BLOCKING_EFFECTS for t in device.taints):
                    continue
                free[kind] += 1
    return dict(free)
