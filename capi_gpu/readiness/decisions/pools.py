"""Is a node's NVIDIA pool the pool its MIG layout promises? Decided from the ResourceSlices alone.

The NVIDIA DRA kubelet plugin publishes one pool per node (pool name == node name) and gives its devices
no binding conditions, so the only honest evidence that a GPU node can take GPU pods is the published pool
itself. A consumer must look only at the slices with the highest ``pool.generation`` and must have seen
``resourceSliceCount`` of them before it trusts the pool (DRA contract): a republish in flight leaves
slices of two generations side by side, and a half-seen pool lists too few devices.

What counts as ready, in the order the reasons are reported (the first problem found names the verdict,
every problem goes into the message):

* ``HostMismatch``: nvidia-smi on the host (checked over SSH at provisioning) disagrees with the layout;
  the root cause of anything the slices then show, so it is named first;
* ``PluginNotRunning``: no pod of NVIDIA's kubelet plugin, or of the gate's, is Running and Ready on the
  node (``plugin``); NVIDIA's slices may outlive its plugin by 30 s (the kubelet's wipe delay), and a pod
  placed meanwhile can't be prepared;
* ``NoSlices``: the plugin has published nothing for the node;
* ``PoolIncomplete``: fewer (or more) slices at the newest generation than ``resourceSliceCount``;
* ``StaleGeneration``: the newest complete pool lists MIG UUIDs the host no longer has: the plugin
  enumerated devices before the layout was (re)applied and, in static MIG mode, never republishes by
  itself. Named before ``LayoutMismatch`` because "restart the plugin" is the action to take;
* ``LayoutMismatch``: the MIG devices (type ``mig``, counted by ``profile``, and by name where the layout
  knows its placements) are not exactly the promised ones; a published full GPU means MIG is off;
* ``DeviceTainted``: the GPU is lost (the driver's ``gpu.nvidia.com/gpu-lost`` taint on any device) or
  no device is left without a ``NoSchedule``/``NoExecute`` taint. One bad MIG device (an XID) does not
  take the node down: the allocator avoids a tainted device by itself, the claim gate fails only the
  claims on it, and the node keeps serving its other devices; the Ready verdict's message names it.
  Effect ``None`` is informational and fine. DeviceTaintRules are *not* considered: those are operator
  decisions (tenant reservations, maintenance), not evidence that the GPU is broken.

Pure: plain dicts in, frozen dataclasses out, no clock needed.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from capi_gpu import domain
from capi_gpu.api.conditions import PoolReason
from capi_gpu.unstructured import as_map

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
GPU_LOST_TAINT = f"{domain.NVIDIA_XID_TAINT_PREFIX}gpu-lost"  # the driver's NVMLDeviceHealthCheck
_LIST_LIMIT = 8


@dataclasses.dataclass(frozen=True)
class DeviceTaint:
    key: str
    value: str
    effect: str

    @property
    def blocking(self) -> bool:
        return self.effect in BLOCKING_EFFECTS

    def describe(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclasses.dataclass(frozen=True)
class PoolDevice:
    """One published device, reduced to what readiness and the claim gate look at."""

    name: str
    type: str
    profile: str
    uuid: str
    taints: tuple[DeviceTaint, ...] = ()

    @property
    def blocking_taints(self) -> tuple[DeviceTaint, ...]:
        return tuple(t for t in self.taints if t.blocking)


@dataclasses.dataclass(frozen=True)
class CurrentPool:
    """The newest generation of one pool: the only slices a consumer may believe."""

    name: str
    generation: int
    slices_seen: int
    slices_expected: int
    older_slices: int
    devices: Mapping[str, PoolDevice]
    duplicates: frozenset[str] = frozenset()
    consistent_count: bool = True

    @property
    def complete(self) -> bool:
        return self.consistent_count and self.slices_seen == self.slices_expected


class LayoutDevice(Protocol):
    """What a layout says about one device (``capi_gpu.gpu.layout.ExpectedDevice`` fits)."""

    @property
    def name(self) -> str: ...

    @property
    def profile(self) -> str: ...


@dataclasses.dataclass(frozen=True)
class ExpectedPool:
    """What the node's layout promises, plus the host-side check recorded at provisioning.

    ``profiles`` maps a MIG profile (``"1g.24gb"``) to its count; ``device_names``, when the layout knows
    its placements, is the exact set of device names (``gpu-0-mig-1g24gb-14-0``). ``host_mig_uuids`` are
    the MIG UUIDs nvidia-smi reported; empty means "not known", and the staleness check is skipped.
    """

    profiles: Mapping[str, int] = dataclasses.field(default_factory=dict)
    device_names: frozenset[str] | None = None
    full_gpus: int = 0
    host_agrees: bool = True
    host_detail: str = ""
    host_mig_uuids: frozenset[str] = frozenset()

    @classmethod
    def from_devices(
        cls,
        devices: Iterable[LayoutDevice],
        *,
        host_agrees: bool = True,
        host_detail: str = "",
        host_mig_uuids: Iterable[str] = (),
    ) -> ExpectedPool:
        """Profiles and exact names from a layout's expected devices (``layout.expected_devices``)."""
        listed = list(devices)
        return cls(
            profiles=dict(collections.Counter(d.profile for d in listed)),
            device_names=frozenset(d.name for d in listed),
            host_agrees=host_agrees,
            host_detail=host_detail,
            host_mig_uuids=frozenset(host_mig_uuids),
        )


@dataclasses.dataclass(frozen=True)
class Problem:
    reason: PoolReason
    message: str


@dataclasses.dataclass(frozen=True)
class PoolVerdict:
    node: str
    reason: PoolReason
    message: str
    problems: tuple[Problem, ...] = ()
    generation: int | None = None

    @property
    def ready(self) -> bool:
        return self.reason is PoolReason.READY


def current_pools(
    slices: Iterable[Mapping[str, Any]], node_name: str, driver: str = domain.NVIDIA_DRIVER
) -> dict[str, CurrentPool]:
    """The newest generation of every pool ``driver`` publishes for ``node_name``, keyed by pool name."""
    by_pool: dict[str, list[Mapping[str, Any]]] = collections.defaultdict(list)
    for item in slices:
        spec = as_map(item.get("spec"))
        pool = as_map(spec.get("pool"))
        pool_name = str(pool.get("name", ""))
        on_node = spec.get("nodeName") == node_name or (not spec.get("nodeName") and pool_name == node_name)
        if spec.get("driver") == driver and on_node and pool_name:
            by_pool[pool_name].append(spec)
    return {name: _newest(name, specs, driver) for name, specs in sorted(by_pool.items())}


def _newest(pool_name: str, specs: list[Mapping[str, Any]], driver: str) -> CurrentPool:
    def generation(spec: Mapping[str, Any]) -> int:
        return int(as_map(spec.get("pool")).get("generation", 0))

    newest = max(generation(s) for s in specs)
    current = [s for s in specs if generation(s) == newest]
    counts = {int(as_map(s.get("pool")).get("resourceSliceCount", 1)) for s in current}
    devices: dict[str, PoolDevice] = {}
    duplicates: set[str] = set()
    for spec in current:
        for raw in spec.get("devices") or ():
            device = _device(as_map(raw), driver)
            if device.name in devices:
                duplicates.add(device.name)
            devices[device.name] = device
    return CurrentPool(
        name=pool_name,
        generation=newest,
        slices_seen=len(current),
        slices_expected=max(counts),
        older_slices=len(specs) - len(current),
        devices=devices,
        duplicates=frozenset(duplicates),
        consistent_count=len(counts) == 1,
    )


def _device(raw: Mapping[str, Any], driver: str) -> PoolDevice:
    attributes = as_map(raw.get("attributes"))
    taints = tuple(
        DeviceTaint(str(t.get("key", "")), str(t.get("value", "")), str(t.get("effect", "")))
        for t in (as_map(x) for x in raw.get("taints") or ())
    )
    return PoolDevice(
        name=str(raw.get("name", "")),
        type=_attribute(attributes, "type", driver),
        profile=_attribute(attributes, "profile", driver),
        uuid=_attribute(attributes, "uuid", driver),
        taints=taints,
    )


def _attribute(attributes: Mapping[str, Any], name: str, driver: str) -> str:
    """A driver-domain attribute: unqualified in the slice, or qualified with the driver name."""
    value = as_map(attributes.get(name) or attributes.get(f"{driver}/{name}"))
    for kind in ("string", "version", "int", "bool"):
        if kind in value:
            return str(value[kind])
    return ""


def pool_verdict(
    slices: Iterable[Mapping[str, Any]], node_name: str, expected: ExpectedPool, plugin_problem: str | None = None
) -> PoolVerdict:
    """Decide whether ``node_name``'s NVIDIA pool is exactly what its layout promises.

    ``plugin_problem`` is ``plugin.plugin_problem``'s answer where the caller watches the plugin's pods."""
    problems: list[Problem] = []
    if not expected.host_agrees:
        detail = expected.host_detail or "nvidia-smi on the host disagrees with the MIG layout"
        problems.append(Problem(PoolReason.HOST_MISMATCH, f"host check: {detail}"))
    if plugin_problem is not None:
        problems.append(Problem(PoolReason.PLUGIN_NOT_RUNNING, plugin_problem))
    pools = current_pools(slices, node_name)
    if not pools:
        problems.append(
            Problem(
                PoolReason.NO_SLICES,
                f"no {domain.NVIDIA_DRIVER} ResourceSlice for node {node_name} "
                "(is the NVIDIA DRA kubelet plugin running?)",
            )
        )
        return _verdict(node_name, problems, None, expected)
    generation = max(p.generation for p in pools.values())
    incomplete = [p for p in pools.values() if not p.complete]
    problems.extend(Problem(PoolReason.POOL_INCOMPLETE, _incomplete_message(p)) for p in incomplete)
    if incomplete:
        return _verdict(node_name, problems, generation, expected)
    devices = [d for p in pools.values() for d in p.devices.values()]
    problems.extend(_stale(devices, expected, generation))
    problems.extend(_layout(pools, devices, expected))
    problems.extend(_tainted(devices))
    return _verdict(node_name, problems, generation, expected, note=_tainted_note(devices))


def _incomplete_message(pool: CurrentPool) -> str:
    if pool.consistent_count:
        message = (
            f"pool {pool.name} generation {pool.generation}: {pool.slices_seen} of "
            f"{pool.slices_expected} slices published"
        )
    else:
        message = f"pool {pool.name} generation {pool.generation}: slices disagree on resourceSliceCount"
    if pool.older_slices:
        message += f" ({pool.older_slices} slices of older generations still present: republish in flight)"
    return message


def _stale(devices: list[PoolDevice], expected: ExpectedPool, generation: int) -> list[Problem]:
    if not expected.host_mig_uuids:
        return []
    published = {d.uuid for d in devices if d.type == "mig" and d.uuid}
    unknown = published - expected.host_mig_uuids
    absent = expected.host_mig_uuids - published
    if not unknown and not absent:
        return []
    parts = []
    if unknown:
        parts.append(f"lists MIG UUIDs the host does not have ({_names(unknown)})")
    if absent:
        parts.append(f"lacks host MIG UUIDs ({_names(absent)})")
    return [
        Problem(
            PoolReason.STALE_GENERATION,
            f"slices at generation {generation} {' and '.join(parts)}: the NVIDIA kubelet plugin has not "
            "republished since the MIG layout was applied; restart it",
        )
    ]


def _layout(pools: Mapping[str, CurrentPool], devices: list[PoolDevice], expected: ExpectedPool) -> list[Problem]:
    parts: list[str] = []
    duplicates = {name for p in pools.values() for name in p.duplicates}
    if duplicates:
        parts.append(f"published more than once: {_names(duplicates)}")
    have: collections.Counter[str] = collections.Counter()
    names_by_kind: dict[str, list[str]] = collections.defaultdict(list)
    for device in devices:
        kind = (device.profile or "mig") if device.type == "mig" else (device.type or "unknown")
        have[kind] += 1
        names_by_kind[kind].append(device.name)
    want = collections.Counter({p: n for p, n in expected.profiles.items() if n > 0})
    if expected.full_gpus:
        want["gpu"] = expected.full_gpus
    missing, extra = want - have, have - want
    if missing:
        parts.append("missing " + ", ".join(f"{k}={n}" for k, n in sorted(missing.items())))
    if extra:
        parts.append(
            "unexpected " + ", ".join(f"{k}={n} ({_names(names_by_kind[k])})" for k, n in sorted(extra.items()))
        )
    if expected.device_names is not None and not missing and not extra:
        published = {d.name for d in devices}
        if absent := expected.device_names - published:
            parts.append(f"missing devices {_names(absent)}")
        if unknown := published - expected.device_names:
            parts.append(f"unexpected devices {_names(unknown)}")
    if not parts:
        return []
    return [Problem(PoolReason.LAYOUT_MISMATCH, "pool differs from the MIG layout: " + "; ".join(parts))]


def _tainted_list(devices: list[PoolDevice]) -> str:
    tainted = [f"{d.name} ({', '.join(t.describe() for t in d.blocking_taints)})" for d in devices if d.blocking_taints]
    return _names(tainted, keep_order=True)


def _tainted(devices: list[PoolDevice]) -> list[Problem]:
    """Node-level only when the GPU is lost or nothing is usable; one device's taint is that device's."""
    blocked = [d for d in devices if d.blocking_taints]
    lost = any(t.key == GPU_LOST_TAINT for d in blocked for t in d.blocking_taints)
    if not blocked or not (lost or len(blocked) == len(devices)):
        return []
    why = "GPU lost" if lost else "no usable device left"
    return [Problem(PoolReason.DEVICE_TAINTED, f"{why}: tainted by the driver: {_tainted_list(devices)}")]


def _tainted_note(devices: list[PoolDevice]) -> str:
    if not any(d.blocking_taints for d in devices):
        return ""
    return f"; tainted by the driver (its claims fail, the other devices serve): {_tainted_list(devices)}"


def _verdict(
    node_name: str, problems: list[Problem], generation: int | None, expected: ExpectedPool, note: str = ""
) -> PoolVerdict:
    if not problems:
        promised = ", ".join(f"{p}={n}" for p, n in sorted(expected.profiles.items()) if n > 0)
        message = f"pool {node_name} generation {generation} matches the layout ({promised or 'no MIG devices'})"
        return PoolVerdict(node_name, PoolReason.READY, message + note, (), generation)
    order = list(PoolReason)
    ranked = sorted(problems, key=lambda p: order.index(p.reason))
    message = "; ".join(p.message for p in ranked)
    return PoolVerdict(node_name, ranked[0].reason, message, tuple(ranked), generation)


def _names(names: Iterable[str], *, keep_order: bool = False) -> str:
    """A bounded list for a message: conditions are read by people, and etcd objects have limits."""
    items = list(names) if keep_order else sorted(names)
    shown = ", ".join(items[:_LIST_LIMIT])
    return f"{shown} and {len(items) - _LIST_LIMIT} more" if len(items) > _LIST_LIMIT else shown
