"""Measured GPU utilization: the fraction of MIG slices held by ResourceClaims over a time window.

The cost report's answer turns on utilization, and a guessed one flatters the leased host. The
cluster already records what is held: every allocated ResourceClaim names its ``gpu.nvidia.com``
devices, and the NVIDIA DRA driver names a MIG device after its placement
(``gpu-<minor>-mig-<profile>-<GI profile ID>-<start>``, see ``gpu.layout.dra_device_name``), so
the catalog turns each name into memory slices. ``allocationTimestamp`` says since when.

    utilization = Σ slices * hours held inside the window / (nodes * slices per GPU * window hours)

It is a **lower bound**: claims released before the reading are gone from the API, so only the
claims allocated now count (each from its allocation, or the window's start). A whole-GPU device
(``gpu-<minor>``) holds every slice. Devices the catalog cannot name are reported, not guessed.
``adminAccess`` results (monitoring) hold nothing. Pure: the caller lists the objects and passes the
clock; ``capi_gpu.cli.cost`` does the reading.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from capi_gpu import domain
from capi_gpu.gpu import catalog, layout
from capi_gpu.unstructured import as_map, parse_time

_MIG_DEVICE = re.compile(r"^gpu-(?P<minor>\d+)-mig-(?P<profile>[a-z0-9.-]+)-(?P<gi>\d+)-(?P<start>\d+)$")
_WHOLE_GPU = re.compile(r"^gpu-(?P<minor>\d+)$")
_WINDOW_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class UsageError(ValueError):
    """A window that cannot be parsed, or nothing to measure against."""


def parse_window(text: str) -> datetime.timedelta:
    """``24h``, ``90m``, ``7d``, ``1h30m`` -> a positive timedelta."""
    compact = text.strip().lower()
    parts = _WINDOW_PART.findall(compact)
    if not parts or "".join(n + u for n, u in parts) != compact:
        raise UsageError(f"{text!r} is not a window (e.g. 24h, 90m, 7d, 1h30m)")
    seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    if seconds <= 0:
        raise UsageError(f"the window {text!r} is empty")
    return datetime.timedelta(seconds=seconds)


def device_slices(model: catalog.GpuModel, device: str) -> int | None:
    """Memory slices a ``gpu.nvidia.com`` device holds, or None when the name is not one we know."""
    if _WHOLE_GPU.match(device):
        return model.memory_slices
    match = _MIG_DEVICE.match(device)
    if match is None:
        return None
    try:
        profile = model.profile(match["gi"])
    except catalog.CatalogError:
        return None
    expected = layout.dra_device_name(int(match["minor"]), profile.name, profile.gi_profile_id, int(match["start"]))
    return profile.memory_slices if expected == device else None


@dataclass(frozen=True, slots=True)
class HeldDevice:
    """One allocated device: where, how many slices, since when."""

    claim: str  # namespace/name
    pool: str
    device: str
    slices: int
    since: datetime.datetime


@dataclass(frozen=True, slots=True)
class Usage:
    """Slice-hours held in a window against the capacity of the nodes seen."""

    nodes: int
    slices_per_gpu: int
    window: datetime.timedelta
    slice_hours_held: float
    slices_held_now: int
    claims: int
    held: tuple[HeldDevice, ...]
    unrecognised: tuple[str, ...]

    @property
    def slices_total(self) -> int:
        return self.nodes * self.slices_per_gpu

    @property
    def capacity_slice_hours(self) -> float:
        return self.slices_total * self.window.total_seconds() / 3600

    @property
    def utilization(self) -> float:
        """Time-weighted fraction of the window's slice-hours held (a lower bound)."""
        capacity = self.capacity_slice_hours
        return min(self.slice_hours_held / capacity, 1.0) if capacity > 0 else 0.0

    @property
    def utilization_now(self) -> float:
        return self.slices_held_now / self.slices_total if self.slices_total else 0.0


def gpu_nodes(slices: Iterable[Mapping[str, Any]]) -> set[str]:
    """Nodes that publish ``gpu.nvidia.com`` ResourceSlices (the NVIDIA pool is named after the node)."""
    nodes: set[str] = set()
    for s in slices:
        spec = as_map(s.get("spec"))
        if spec.get("driver") != domain.NVIDIA_DRIVER:
            continue
        node = spec.get("nodeName") or as_map(spec.get("pool")).get("name")
        if isinstance(node, str) and node:
            nodes.add(node)
    return nodes


def held_devices(
    claims: Iterable[Mapping[str, Any]], model: catalog.GpuModel, nodes: set[str]
) -> tuple[list[HeldDevice], list[str]]:
    """Allocated NVIDIA devices on ``nodes``, one entry per device (the earliest claim wins)."""
    by_device: dict[tuple[str, str], HeldDevice] = {}
    unknown: list[str] = []
    for claim in claims:
        meta, status = as_map(claim.get("metadata")), as_map(claim.get("status"))
        allocation = as_map(status.get("allocation"))
        since = parse_time(allocation.get("allocationTimestamp")) or parse_time(meta.get("creationTimestamp"))
        if not allocation or since is None:
            continue
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        for result in as_map(allocation.get("devices")).get("results") or []:
            r = as_map(result)
            pool, device = str(r.get("pool", "")), str(r.get("device", ""))
            if r.get("driver") != domain.NVIDIA_DRIVER or r.get("adminAccess") or pool not in nodes:
                continue
            slices = device_slices(model, device)
            if slices is None:
                unknown.append(f"{pool}/{device}")
                continue
            held = HeldDevice(key, pool, device, slices, since)
            current = by_device.get((pool, device))
            if current is None or held.since < current.since:
                by_device[(pool, device)] = held
    return sorted(by_device.values(), key=lambda h: (h.pool, h.device)), sorted(set(unknown))


def measure(
    claims: Iterable[Mapping[str, Any]],
    nodes: set[str],
    model: catalog.GpuModel,
    now: datetime.datetime,
    window: datetime.timedelta,
) -> Usage:
    """Slice-hours held by the currently allocated claims over ``[now - window, now]``."""
    if window <= datetime.timedelta(0):
        raise UsageError("the window must be positive")
    start = now - window
    held, unknown = held_devices(claims, model, nodes)
    hours = sum(h.slices * max((now - max(h.since, start)).total_seconds(), 0.0) / 3600 for h in held)
    return Usage(
        nodes=len(nodes),
        slices_per_gpu=model.memory_slices,
        window=window,
        slice_hours_held=hours,
        slices_held_now=sum(h.slices for h in held),  # allocated now, even if our clock trails the scheduler's
        claims=len({h.claim for h in held}),
        held=tuple(held),
        unrecognised=tuple(unknown),
    )
