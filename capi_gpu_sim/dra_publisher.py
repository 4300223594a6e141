"""A stand-in for the NVIDIA DRA kubelet plugin: publishes a joined host's GPU as ``gpu.nvidia.com`` slices.

Why: the readiness gate must be tested against what the real driver publishes (dra-nvidia.md §3,
kubernetes-sigs/dra-driver-nvidia-gpu ``deviceinfo.go``), not against what our checker expects. So
this follows the driver: one pool per node named after the node, slices named
``<node>-gpu.nvidia.com-<rand>`` (generateName) owned by the Node, ``nodeName`` set; with MIG enabled
only the MIG devices (``gpu-0-mig-1g24gb-14-0``: profile lower-cased, dots dropped, GI profile id,
placement start; built by ``capi_gpu.gpu.layout.dra_device_name``), without MIG the full ``gpu-0``.
Attributes ``type``, ``uuid``, ``parentUUID``, ``profile``, ``productName``, ``brand``, ``architecture``,
``cudaComputeCapability``/``driverVersion``/``cudaDriverVersion`` (semver values),
``resource.kubernetes.io/pciBusID``; capacities ``memory`` (bytes), ``multiprocessors``, ``copyEngines``,
``decoders``, ``encoders``, ``jpegEngines``, ``ofaEngines`` and, static MIG, ``memorySlice<N>`` = 1 per
placement unit.

Static-MIG semantics: the GPU is read ONCE when the publisher starts (the plugin enumerates at start
only), by running the GPU shim's own ``nvidia-smi --query-gpu``, ``-q -x``, ``-L`` and ``mig -lgi``
inside the host (its real output formats), parsed with the production parsers ``capi_gpu.gpu.nvidia_smi``
and ``nvidia_smi_xml``; the architecture comes from the GPU catalog by PCI device id. A MIG change afterwards leaves the
slices stale until ``restart()``, as with the real plugin.

Fault knobs: ``stop()`` (delete the slices), ``publish_stale()`` (an old-generation slice beside the
new one), ``publish_incomplete()`` (generation bumped, ``resourceSliceCount`` 2, one slice),
``add_xid_taint()`` (``gpu.nvidia.com/xid=<code>`` on a device), ``clear_faults()``. ``mark_gpu_lost()`` is
what the driver's health check (``NVMLDeviceHealthCheck``) does when NVML reports the GPU lost: every
device republished with ``gpu.nvidia.com/gpu-lost:NoSchedule``; only a restart (the next boot) clears it.
"""

from __future__ import annotations

import copy
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from capi_gpu import domain
from capi_gpu.gpu import catalog, layout, nvidia_smi, nvidia_smi_xml
from capi_gpu.kube import RESOURCESLICES, Kube, Obj

log = logging.getLogger(__name__)

DRIVER = domain.NVIDIA_DRIVER
GPU_LOST_TAINT = f"{domain.NVIDIA_XID_TAINT_PREFIX}gpu-lost"


class GpuUnavailable(RuntimeError):
    """nvidia-smi is missing or failing (driver not installed yet, GPU lost): nothing to publish."""


@dataclass(frozen=True)
class GpuFacts:
    uuid: str
    product_name: str
    architecture: str
    brand: str
    pci_bus_id: str  # "0000:01:00.0"
    driver_version: str
    cuda_version: str
    compute_cap: str
    memory_mib: int
    mig_enabled: bool
    minor: int = 0


@dataclass(frozen=True)
class MigFacts:
    profile: str
    gi_profile_id: int
    gi_id: int
    placement_start: int
    placement_size: int
    uuid: str
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    memory_mib: int


def semver(version: str) -> str:
    """Masterminds-style normalisation as the driver does: ``575.57.08`` -> ``575.57.8``, ``12.9`` -> ``12.9.0``."""
    parts = [str(int(p)) for p in re.findall(r"\d+", version)[:3]]
    return ".".join([*parts, "0", "0", "0"][:3])


QUERY_FIELDS = (
    "uuid",
    "name",
    "pci.bus_id",
    "pci.device_id",
    "driver_version",
    "memory.total",
    "mig.mode.current",
    "compute_cap",
)


def parse_gpu(
    query_csv: str, xml_text: str, list_text: str, lgi_text: str, brand: str
) -> tuple[GpuFacts, list[MigFacts]]:
    """GPU 0 from ``--query-gpu``, ``-q -x``, ``-L`` and ``mig -lgi`` output, with the project's parsers."""
    rows = nvidia_smi.parse_query_csv(query_csv, QUERY_FIELDS)
    if not rows:
        raise GpuUnavailable("nvidia-smi reports no GPU")
    row = rows[0]
    query = nvidia_smi.gpu_query(row)
    report = nvidia_smi_xml.parse_query_xml(xml_text)
    model = catalog.builtin_catalog().for_device_id(query.pci_device_id) if query.pci_device_id else None
    bus = row["pci.bus_id"]
    facts = GpuFacts(
        uuid=query.uuid or "",
        product_name=query.name or "",
        architecture=model.architecture if model else "Unknown",
        brand=brand,
        pci_bus_id=bus[-12:] if len(bus) > 12 else bus,
        driver_version=query.driver_version or "",
        cuda_version=report.cuda_version or "",
        compute_cap=row.get("compute_cap", "0.0"),
        memory_mib=query.memory_total_mib or 0,
        mig_enabled=query.mig_current is nvidia_smi.MigMode.ENABLED,
        minor=(report.gpus[0].minor if report.gpus else None) or 0,
    )
    migs: list[MigFacts] = []
    if not facts.mig_enabled:
        return facts, migs
    listed = nvidia_smi.parse_list(list_text)
    uuids = {m.device_index: m.uuid for m in listed[0].mig_devices} if listed else {}
    gis = {g.instance_id: g for g in nvidia_smi.parse_lgi(lgi_text)}
    for dev in report.gpus[0].mig_devices if report.gpus else ():
        gi = gis.get(dev.gpu_instance_id)
        if gi is None:
            continue
        migs.append(
            MigFacts(
                profile=gi.profile,
                gi_profile_id=gi.profile_id,
                gi_id=gi.instance_id,
                placement_start=gi.start,
                placement_size=gi.size,
                uuid=uuids.get(dev.index, ""),
                multiprocessors=dev.multiprocessors or 0,
                copy_engines=dev.copy_engines or 0,
                decoders=dev.decoders or 0,
                encoders=dev.encoders or 0,
                jpeg_engines=dev.jpeg or 0,
                ofa_engines=dev.ofa or 0,
                memory_mib=dev.memory_total_mib or 0,
            )
        )
    return facts, migs


def _common(gpu: GpuFacts) -> dict[str, Any]:
    return {
        "productName": {"string": gpu.product_name},
        "brand": {"string": gpu.brand},
        "architecture": {"string": gpu.architecture},
        "cudaComputeCapability": {"version": semver(gpu.compute_cap)},
        "driverVersion": {"version": semver(gpu.driver_version)},
        "cudaDriverVersion": {"version": semver(gpu.cuda_version)},
        "resource.kubernetes.io/pciBusID": {"string": gpu.pci_bus_id},
    }


def build_devices(gpu: GpuFacts, migs: list[MigFacts], minor: int | None = None) -> list[Obj]:
    """The devices the driver announces for this GPU state (pure); named after the GPU's minor number."""
    minor = gpu.minor if minor is None else minor
    if not gpu.mig_enabled:
        return [
            {
                "name": f"gpu-{minor}",
                "attributes": {"type": {"string": "gpu"}, "uuid": {"string": gpu.uuid}, **_common(gpu)},
                "capacity": {"memory": {"value": str(gpu.memory_mib * 1024 * 1024)}},
            }
        ]
    devices = []
    for m in sorted(migs, key=lambda m: m.placement_start):
        capacity = {
            "multiprocessors": {"value": str(m.multiprocessors)},
            "copyEngines": {"value": str(m.copy_engines)},
            "decoders": {"value": str(m.decoders)},
            "encoders": {"value": str(m.encoders)},
            "jpegEngines": {"value": str(m.jpeg_engines)},
            "ofaEngines": {"value": str(m.ofa_engines)},
            "memory": {"value": str(m.memory_mib * 1024 * 1024)},
        }
        for i in range(m.placement_start, m.placement_start + m.placement_size):
            capacity[f"memorySlice{i}"] = {"value": "1"}
        devices.append(
            {
                "name": layout.dra_device_name(minor, m.profile, m.gi_profile_id, m.placement_start),
                "attributes": {
                    "type": {"string": "mig"},
                    "uuid": {"string": m.uuid},
                    "parentUUID": {"string": gpu.uuid},
                    "profile": {"string": m.profile},
                    **_common(gpu),
                },
                "capacity": capacity,
            }
        )
    return devices


Reader = Callable[[], tuple[GpuFacts, list[MigFacts]]]


@dataclass
class DraPublisher:
    """Publishes one node's pool; the reader runs nvidia-smi inside the host (see ``kubelet``)."""

    kube: Kube
    node_name: str
    node_uid: str
    reader: Reader
    devices: list[Obj] = field(default_factory=list)
    generation: int = 0
    published: bool = False
    gpu_lost: bool = False
    enumerated_at: float | None = None  # time.monotonic() of the last enumeration (the guest's clock too)

    def start(self) -> None:
        """Enumerate once (raises ``GpuUnavailable`` if the GPU can't be read) and publish."""
        enumerated_at = time.monotonic()
        gpu, migs = self.reader()
        self.enumerated_at = enumerated_at
        if gpu.mig_enabled and not migs:
            log.warning("%s: MIG mode enabled but no configured MIG devices", self.node_name)
        self.devices = build_devices(gpu, migs)
        existing = self._ours()
        self.generation = max((s["spec"]["pool"]["generation"] for s in existing), default=0)
        self._sync(self.devices, count=1, bump=not _same(existing, self.devices))
        self.published = True

    def restart(self) -> None:
        """What restarting the plugin pod does: enumerate again, republish if changed."""
        self.start()

    def _ours(self) -> list[Obj]:
        return [
            s
            for s in self.kube.list(RESOURCESLICES, field_selector=f"spec.nodeName={self.node_name}")
            if s["spec"].get("driver") == DRIVER
        ]

    def _body(self, devices: list[Obj], generation: int, count: int) -> Obj:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {
                "generateName": f"{self.node_name}-{DRIVER}-",
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": self.node_name,
                        "uid": self.node_uid,
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "driver": DRIVER,
                "nodeName": self.node_name,
                "devices": devices,
                "pool": {"name": self.node_name, "generation": generation, "resourceSliceCount": count},
            },
        }

    def _sync(self, devices: list[Obj], count: int, bump: bool) -> Obj:
        """One slice carrying ``devices``; any other slice of ours is deleted."""
        existing = self._ours()
        if bump or not existing:
            self.generation += 1
        keep, extra = (existing[0], existing[1:]) if existing else (None, [])
        for s in extra:
            self.kube.delete(RESOURCESLICES, s["metadata"]["name"])
        body = self._body(devices, self.generation, count)
        if keep is None:
            return self.kube.create(RESOURCESLICES, body)
        keep = copy.deepcopy(keep)
        keep["spec"] = body["spec"]
        return self.kube.replace(RESOURCESLICES, keep)

    # -- fault knobs ----------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop publishing: delete the pool's slices (the plugin was removed)."""
        for s in self._ours():
            self.kube.delete(RESOURCESLICES, s["metadata"]["name"])
        self.published = False

    def publish_stale(self) -> None:
        """Keep an old-generation slice beside a newer one (consumers must ignore the old one)."""
        self._sync(self.devices, count=1, bump=True)
        self.kube.create(RESOURCESLICES, self._body(self.devices, self.generation - 1, 1))

    def publish_incomplete(self) -> None:
        """Bump the generation and announce two slices while publishing one."""
        self._sync(self.devices, count=2, bump=True)

    def add_xid_taint(self, device: str | None = None, code: int = 79, effect: str = "NoSchedule") -> str:
        """Taint one device as the driver does on an XID error; returns the device name."""
        if not self.devices:
            raise ValueError(f"{self.node_name}: no devices published")
        target = device or self.devices[0]["name"]
        for d in self.devices:
            if d["name"] == target:
                d["taints"] = [{"key": f"{domain.NVIDIA_XID_TAINT_PREFIX}xid", "value": str(code), "effect": effect}]
        self._sync(self.devices, count=1, bump=True)
        return target

    def mark_gpu_lost(self) -> None:
        """Taint every device ``gpu-lost`` (NoSchedule, as the driver's health check does) and republish."""
        taint = {"key": GPU_LOST_TAINT, "effect": "NoSchedule"}
        for d in self.devices:
            d["taints"] = [*[t for t in d.get("taints", []) if t["key"] != GPU_LOST_TAINT], taint]
        self._sync(self.devices, count=1, bump=True)
        self.gpu_lost = True

    def clear_faults(self) -> None:
        for d in self.devices:
            d.pop("taints", None)
        self._sync(self.devices, count=1, bump=True)
        self.published = True


def _same(existing: list[Obj], devices: list[Obj]) -> bool:
    return (
        len(existing) == 1
        and existing[0]["spec"].get("devices") == devices
        and existing[0]["spec"]["pool"].get("resourceSliceCount") == 1
    )
