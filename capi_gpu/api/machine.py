"""HetznerGPUMachine(+Template): the CAPI InfraMachine and the template CAPI clones it from.

The template's status carries ``capacity`` and ``nodeInfo`` (the v1beta2 scale-from-zero contract) so
cluster-autoscaler can build a template node for a MachineDeployment at zero replicas.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import ConfigDict, Field

from capi_gpu.api.base import (
    INT_OR_STRING,
    Conditions,
    Initialization,
    KubeModel,
    LabelSelector,
    MachineAddress,
    ObjectMetaTemplate,
    cel,
    immutable,
    validations,
)
from capi_gpu.api.specs import GPUSpec, InstallImageSpec, NodeImageSpec


class HetznerGPUMachineSpec(KubeModel):
    """Desired state of one GPU (or control-plane) machine on a Robot host."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "!has(oldSelf.providerID) || (has(self.providerID) && self.providerID == oldSelf.providerID)",
                "providerID is set by the controller when it claims a host and can't change: "
                "delete the Machine to move it to another host",
                field=".providerID",
            ),
        )
    )

    provider_id: Annotated[str | None, Field(min_length=1, max_length=512, pattern=r"^hrobot://[0-9]+$")] = None
    """hrobot://<serverNumber>; set by the controller once a host is claimed, never changed."""
    host_selector: LabelSelector = LabelSelector()
    """Which HetznerGPUHosts may be claimed (labels written from inspected hardware can be used)."""
    install_image: InstallImageSpec = InstallImageSpec()
    """OS image and partitioning for installimage."""
    gpu: GPUSpec | None = None
    """NVIDIA stack and MIG layout; a machine without it (control plane) gets no GPU stack."""
    kubernetes_version: Annotated[str | None, Field(pattern=r"^v1\.[0-9]+\.[0-9]+$")] = None
    """kubelet/kubeadm version to install; the Machine's spec.version when unset."""
    image: NodeImageSpec | None = None
    """A baked node image to install instead of plain Ubuntu plus the full node install (docs/node-images.md).
    Not available in this release: the webhook refuses a spec that sets it."""


class HetznerGPUMachineStatus(KubeModel):
    """Observed state, as the v1beta2 InfraMachine contract defines it."""

    initialization: Initialization = Initialization()
    """initialization.provisioned turns true when the node joined."""
    addresses: Annotated[list[MachineAddress], Field(max_length=32)] = []
    """Addresses of the host."""
    failure_domain: Annotated[str | None, Field(max_length=256)] = None
    """Hetzner datacenter of the host, e.g. fsn1-dc14."""
    host: str | None = None
    """Name of the claimed HetznerGPUHost."""
    layout: str | None = None
    """Validated MIG layout key."""
    conditions: Conditions = []
    """Ready, HostAssociated, HostProvisioned, LayoutValid, BootstrapDataReady, Paused."""


class HetznerGPUMachine(KubeModel):
    """A CAPI InfraMachine backed by a Hetzner Robot GPU server."""

    api_version: str = "infrastructure.cluster.x-k8s.io/v1alpha1"
    kind: str = "HetznerGPUMachine"
    metadata: dict[str, object] = {}
    spec: HetznerGPUMachineSpec = HetznerGPUMachineSpec()
    status: HetznerGPUMachineStatus = HetznerGPUMachineStatus()


class HetznerGPUMachineTemplateResource(KubeModel):
    """What a HetznerGPUMachine is cloned from."""

    metadata: ObjectMetaTemplate | None = None
    """Labels and annotations for the clone."""
    spec: HetznerGPUMachineSpec
    """Spec of the clone."""


class TemplateStandby(KubeModel):
    """A warm pool of hosts prepared with this template's spec."""

    size: Annotated[int, Field(ge=0, le=100)] = 0
    """Hosts to keep prepared up to the join."""


class HetznerGPUMachineTemplateSpec(KubeModel):
    """Template spec."""

    template: Annotated[
        HetznerGPUMachineTemplateResource,
        Field(
            json_schema_extra=immutable(
                "spec.template is immutable, as CAPI templates are: create a new HetznerGPUMachineTemplate "
                "and point the MachineDeployment's infrastructureRef at it (spec.standby may change in place)"
            )
        ),
    ]
    """The machine template."""
    standby: TemplateStandby | None = None
    """Warm standby pool among the hosts the template's hostSelector matches."""


class Architecture(StrEnum):
    AMD64 = "amd64"
    ARM64 = "arm64"
    S390X = "s390x"
    PPC64LE = "ppc64le"


class NodeInfo(KubeModel):
    """Node facts for scale-from-zero (CA 1.35+)."""

    architecture: Architecture | None = None
    """CPU architecture."""
    operating_system: Annotated[str | None, Field(pattern=r"^[a-z]+$")] = None
    """Operating system, linux."""


class HetznerGPUMachineTemplateStatus(KubeModel):
    """Scale-from-zero facts, the minimum across matching hosts."""

    capacity: dict[str, Annotated[str, Field(json_schema_extra=INT_OR_STRING)]] | None = None
    """cpu, memory, ephemeral-storage and the GPU count of the smallest matching host."""
    node_info: NodeInfo | None = None
    """Architecture and operating system."""
    matching_hosts: Annotated[int, Field(ge=0)] = 0
    """Hosts the hostSelector matches."""
    standby_hosts: Annotated[int, Field(ge=0)] = 0
    """Hosts prepared and waiting on standby for this template."""
    conditions: Conditions = []
    """CapacityKnown, StandbyPoolReady."""


class HetznerGPUMachineTemplate(KubeModel):
    """Template for HetznerGPUMachines, referenced by MachineDeployments."""

    api_version: str = "infrastructure.cluster.x-k8s.io/v1alpha1"
    kind: str = "HetznerGPUMachineTemplate"
    metadata: dict[str, object] = {}
    spec: HetznerGPUMachineTemplateSpec
    status: HetznerGPUMachineTemplateStatus = HetznerGPUMachineTemplateStatus()
