"""GPU nodes as the readiness gate meets them, built by hand on the local control plane.

Why: the gate reads five objects per GPU node across two clusters (CAPI Machine, HetznerGPUMachine and
HetznerGPUHost in the management cluster; the Node and NVIDIA's ResourceSlices in the workload cluster).
The integration test and ``bench/gate_latency.py`` need the same set for many nodes in seconds, without
the machine and host controllers provisioning anything, so this writes each object in the state those
controllers leave it in once a host joined: the host ``Provisioned`` with the model and the MIG devices
nvidia-smi showed, the HetznerGPUMachine with ``spec.providerID`` and ``status.host``, owned by a real
CAPI Machine (CAPI core validates it and reconciles it; the gate server-side applies its condition), and
a Node registered with that providerID and the startup taint, as kubeadm join leaves it.

The NVIDIA side is the simulator's ``DraPublisher`` fed with the facts a GPU in that layout reports,
so the slices are the ones the publisher's static-MIG rules produce, not hand-made ones.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from capi_gpu import domain
from capi_gpu.api.host import GPUInfo
from capi_gpu.api.specs import GPUSpec, MigLayout
from capi_gpu.gpu import gpuplan
from capi_gpu.kube import (
    CAPI_CLUSTERS,
    CAPI_MACHINES,
    DEVICECLASSES,
    NODES,
    RESOURCECLAIMTEMPLATES,
    RESOURCESLICES,
    SECRETS,
    Kube,
    Obj,
    ours,
)
from capi_gpu_sim import binaries, nvidia_chart
from capi_gpu_sim.dra_publisher import DraPublisher, GpuFacts, MigFacts

CLUSTERS = ours("hetznergpuclusters")
MACHINES = ours("hetznergpumachines")
HOSTS = ours("hetznergpuhosts")
MIG_DEVICE_CLASS = "mig.nvidia.com"
MODEL = gpuplan.DEFAULT_MODEL  # the GEX131 GPU the gate world simulates
DEVICE_ID = "2bb5"  # RTX PRO 6000 Blackwell Server Edition (catalog)
CLAIM_TEMPLATES = binaries.REPO / "config/dra/claims/mig-profiles.yaml"
GATE_CLASS = binaries.REPO / "config/dra/gate-deviceclass.yaml"


def gpu_facts(plan: gpuplan.GPUPlan, seed: str) -> tuple[GpuFacts, list[MigFacts]]:
    """What nvidia-smi reports for ``plan``'s layout on one RTX PRO 6000 (UUIDs unique per ``seed``)."""
    gpu = GpuFacts(
        uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_OID, seed)}",
        product_name=plan.model.product_name,
        architecture=plan.model.architecture,
        brand="Nvidia",
        pci_bus_id="0000:c1:00.0",
        driver_version="580.95.05",
        cuda_version="13.0",
        compute_cap="12.0",
        memory_mib=97_887,
        mig_enabled=plan.layout is not None,
    )
    profiles = {p.name: p for p in plan.model.profiles}
    migs = [
        MigFacts(
            profile=d.profile,
            gi_profile_id=d.gi_profile_id,
            gi_id=index + 1,
            placement_start=d.placement_start,
            placement_size=len(d.memory_slices),
            uuid=f"MIG-{uuid.uuid5(uuid.NAMESPACE_OID, f'{seed}/{d.name}')}",
            multiprocessors=profiles[d.profile].multiprocessors or 0,
            copy_engines=profiles[d.profile].engines.copy_engines,
            decoders=profiles[d.profile].engines.decoders,
            encoders=profiles[d.profile].engines.encoders,
            jpeg_engines=profiles[d.profile].engines.jpeg,
            ofa_engines=profiles[d.profile].engines.ofa,
            memory_mib=int((profiles[d.profile].memory_gib or 0) * 1024),
        )
        for index, d in enumerate(plan.expected_devices())
    ]
    return gpu, migs


@dataclass
class GpuNode:
    """One joined GPU machine: its names on both sides and the NVIDIA plugin stand-in for its node."""

    node: str
    server: int
    machine: str  # HetznerGPUMachine and CAPI Machine name
    host: str
    plan: gpuplan.GPUPlan
    publisher: DraPublisher

    @property
    def provider_id(self) -> str:
        return f"{domain.PROVIDER_ID_PREFIX}{self.server}"


@dataclass
class GateWorld:
    """One CAPI Cluster in ``namespace`` and its GPU nodes; ``close()`` deletes the cluster-scoped objects."""

    kube: Kube
    namespace: str
    cluster: str = "c1"
    layout: MigLayout = field(default_factory=lambda: MigLayout(preset="all-balanced"))
    nodes: dict[str, GpuNode] = field(default_factory=dict)
    _next_server: int = field(default_factory=lambda: 100_000 + uuid.uuid4().int % 800_000)

    def setup(self) -> GateWorld:
        """The DeviceClasses (NVIDIA's, rendered from its real chart, and ours), the shipped claim
        templates in the namespace, the bootstrap Secret, and the Cluster with a provisioned HetznerGPUCluster."""
        for cls in nvidia_chart.device_classes():  # the real chart's classes, rendered from its archive
            self.kube.apply(DEVICECLASSES, cls)
        self.kube.apply(DEVICECLASSES, _yaml_docs(GATE_CLASS)[0])
        for doc in _yaml_docs(CLAIM_TEMPLATES):
            self.kube.create(RESOURCECLAIMTEMPLATES, doc, self.namespace)
        self.kube.create(
            SECRETS,
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "boot"},
                "type": "cluster.x-k8s.io/secret",
                "stringData": {"value": "#cloud-config\n{}\n"},
            },
            self.namespace,
        )
        # The HetznerGPUCluster as the cluster controller leaves it; CAPI core mirrors "provisioned".
        infra = {"apiVersion": domain.API_VERSION, "kind": "HetznerGPUCluster", "metadata": {"name": self.cluster}}
        spec = {
            "robotCredentials": {"name": "robot"},
            "sshKeys": {"rescue": {"name": "ssh"}},
            "controlPlaneEndpoint": {"host": "127.0.0.1", "port": 6443},
        }
        self.kube.create(CLUSTERS, {**infra, "spec": spec}, self.namespace)
        provisioned = {"status": {"initialization": {"provisioned": True}}}
        self.kube.patch(CLUSTERS, self.cluster, provisioned, self.namespace, sub="status")
        self.kube.create(
            CAPI_CLUSTERS,
            {
                "apiVersion": domain.CAPI_API_VERSION,
                "kind": "Cluster",
                "metadata": {"name": self.cluster},
                "spec": {
                    "infrastructureRef": {"apiGroup": domain.GROUP, "kind": "HetznerGPUCluster", "name": self.cluster}
                },
            },
            self.namespace,
        )
        return self

    def add_node(self, name: str | None = None) -> GpuNode:
        """Host, HetznerGPUMachine, CAPI Machine and a tainted Node for one provisioned GPU server."""
        server = self._next_server
        self._next_server += 1
        node_name = name or f"gex-{server}"
        gpu = GPUSpec(layout=self.layout)
        plan = gpuplan.plan(gpu, MODEL)
        host, machine = f"host-{server}", f"gpu-{server}"
        self.create_host(host, server, plan=plan)
        self.create_machine(machine, gpu, server=server, host=host)
        node = self._create_node(node_name, f"{domain.PROVIDER_ID_PREFIX}{server}")
        facts = gpu_facts(plan, seed=node_name)
        publisher = DraPublisher(self.kube, node_name, node["metadata"]["uid"], lambda: facts)
        entry = GpuNode(node_name, server, machine, host, plan, publisher)
        self.nodes[node_name] = entry
        return entry

    def create_host(self, name: str, server: int, *, plan: gpuplan.GPUPlan | None = None) -> None:
        """A host with an inspected RTX PRO 6000: ``Provisioned`` in ``plan``'s layout, else ``Available``."""
        body = {"apiVersion": domain.API_VERSION, "kind": "HetznerGPUHost", "metadata": {"name": name}}
        self.kube.create(HOSTS, {**body, "spec": {"serverNumber": server}}, self.namespace)
        status: dict[str, Any] = {
            "state": "Available",
            "hardware": {
                "gpus": [GPUInfo(vendor_id="10de", device_id=DEVICE_ID, model=MODEL, mig_capable=True).wire()]
            },
        }
        if plan is not None:
            status["state"] = "Provisioned"
            status["layout"] = plan.key
            status["migDevices"] = sorted(d.profile for d in plan.expected_devices())
        self.kube.patch(HOSTS, name, {"status": status}, self.namespace, sub="status")

    def create_machine(self, name: str, gpu: GPUSpec, *, server: int | None = None, host: str | None = None) -> None:
        """A HetznerGPUMachine owned by a CAPI Machine of the same name; joined when ``server`` is given."""
        labels = {domain.CLUSTER_NAME_LABEL: self.cluster}
        spec: dict[str, Any] = {"gpu": gpu.wire()}
        if server is not None:
            spec["providerID"] = f"{domain.PROVIDER_ID_PREFIX}{server}"
        self.kube.create(
            MACHINES,
            {
                "apiVersion": domain.API_VERSION,
                "kind": "HetznerGPUMachine",
                "metadata": {"name": name, "labels": labels},
                "spec": spec,
            },
            self.namespace,
        )
        if host is not None:
            self.kube.patch(MACHINES, name, {"status": {"host": host}}, self.namespace, sub="status")
        capi = self.kube.create(
            CAPI_MACHINES,
            {
                "apiVersion": domain.CAPI_API_VERSION,
                "kind": "Machine",
                "metadata": {"name": name, "labels": labels},
                "spec": {
                    "clusterName": self.cluster,
                    "version": "v1.36.3",
                    "bootstrap": {"dataSecretName": "boot"},
                    "infrastructureRef": {"apiGroup": domain.GROUP, "kind": "HetznerGPUMachine", "name": name},
                    "readinessGates": [{"conditionType": domain.GPU_READY_CONDITION}],
                },
            },
            self.namespace,
        )
        owner = {
            "apiVersion": domain.CAPI_API_VERSION,
            "kind": "Machine",
            "name": name,
            "uid": capi["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        # CAPI core sets the same owner when it reconciles the Machine; writing it here saves the wait.
        self.kube.patch(MACHINES, name, {"metadata": {"ownerReferences": [owner]}}, self.namespace)

    def _create_node(self, name: str, provider_id: str) -> Obj:
        self.kube.create(
            NODES,
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {"kubernetes.io/hostname": name, domain.LABEL_GPU_PRESENT: "true"},
                },
                "spec": {
                    "providerID": provider_id,
                    "taints": [{"key": domain.NODE_STARTUP_TAINT, "effect": "NoSchedule"}],
                },
            },
        )
        status = {
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "sim",
                    "lastHeartbeatTime": "2026-12-02T00:00:00Z",
                    "lastTransitionTime": "2026-12-02T00:00:00Z",
                }
            ],
        }
        node: Obj = self.kube.patch(NODES, name, {"status": status}, sub="status")
        return node

    def close(self) -> None:
        """Delete the Nodes (their NVIDIA and gate slices are owned by them) and any slice left behind."""
        for name in self.nodes:
            self.kube.delete(NODES, name)
            for s in self.kube.list(RESOURCESLICES, field_selector=f"spec.nodeName={name}"):
                self.kube.delete(RESOURCESLICES, s["metadata"]["name"])


def _yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]
