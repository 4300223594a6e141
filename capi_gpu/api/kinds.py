"""The registry of our kinds: model class, names, printer columns. The CRD generator reads it.

Printer columns are part of the user interface (`kubectl get`), so they are chosen here, next to the
models, and not in hand-written YAML.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel

from capi_gpu import domain
from capi_gpu.api import cluster, host, machine, remediation


@dataclass(frozen=True)
class Column:
    name: str
    json_path: str
    type: str = "string"
    priority: int = 0
    description: str = ""


def _ready(prio: int = 0) -> Column:
    return Column(
        "Ready", '.status.conditions[?(@.type=="Ready")].status', priority=prio, description="Ready condition"
    )


AGE = Column("Age", ".metadata.creationTimestamp", type="date")


@dataclass(frozen=True)
class Kind:
    kind: str
    plural: str
    short_names: tuple[str, ...]
    model: type[BaseModel]
    columns: tuple[Column, ...] = ()
    status: bool = True
    extra_labels: dict[str, str] = field(default_factory=dict)

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{domain.GROUP}"


KINDS: tuple[Kind, ...] = (
    Kind(
        "HetznerGPUCluster",
        "hetznergpuclusters",
        ("hgc",),
        cluster.HetznerGPUCluster,
        (
            _ready(),
            Column("Endpoint", ".spec.controlPlaneEndpoint.host"),
            Column("Provisioned", ".status.initialization.provisioned", type="boolean"),
            AGE,
        ),
    ),
    Kind(
        "HetznerGPUClusterTemplate",
        "hetznergpuclustertemplates",
        ("hgct",),
        cluster.HetznerGPUClusterTemplate,
        (AGE,),
        status=False,
    ),
    Kind(
        "HetznerGPUHost",
        "hetznergpuhosts",
        ("hgh", "gpuhost"),
        host.HetznerGPUHost,
        (
            Column("State", ".status.state", description="Lifecycle state"),
            Column("Step", ".status.step", description="Current sub-step"),
            Column("Server", ".spec.serverNumber", type="integer", description="Robot server number"),
            Column("GPU", ".status.hardware.gpus[0].model", description="Inspected GPU"),
            Column("Layout", ".status.layout", description="Applied MIG layout"),
            Column("Consumer", ".spec.consumerRef.name", description="HetznerGPUMachine using the host"),
            _ready(),
            Column("Error", ".status.errorType", priority=1),
            AGE,
        ),
        extra_labels={domain.MOVE_LABEL: ""},
    ),
    Kind(
        "HetznerGPUMachine",
        "hetznergpumachines",
        ("hgm",),
        machine.HetznerGPUMachine,
        (
            Column("Host", ".status.host", description="Claimed HetznerGPUHost"),
            Column("ProviderID", ".spec.providerID"),
            Column("Layout", ".status.layout", description="MIG layout"),
            Column("Provisioned", ".status.initialization.provisioned", type="boolean"),
            _ready(),
            AGE,
        ),
    ),
    Kind(
        "HetznerGPUMachineTemplate",
        "hetznergpumachinetemplates",
        ("hgmt",),
        machine.HetznerGPUMachineTemplate,
        (
            Column("GPU", ".status.capacity.nvidia\\.com/gpu"),
            Column("Hosts", ".status.matchingHosts", type="integer"),
            Column("Standby", ".status.standbyHosts", type="integer"),
            AGE,
        ),
    ),
    Kind(
        "HetznerGPURemediation",
        "hetznergpuremediations",
        ("hgr",),
        remediation.HetznerGPURemediation,
        (
            Column("Phase", ".status.phase"),
            Column("Retries", ".status.retryCount", type="integer"),
            AGE,
        ),
    ),
    Kind(
        "HetznerGPURemediationTemplate",
        "hetznergpuremediationtemplates",
        ("hgrt",),
        remediation.HetznerGPURemediationTemplate,
        (AGE,),
        status=False,
        # A MachineHealthCheck names it, and nothing owns it: without the label clusterctl move leaves it
        # behind and the target's MHC reports RemediationTemplateNotFound.
        extra_labels={domain.MOVE_LABEL: ""},
    ),
)

BY_KIND = {k.kind: k for k in KINDS}
