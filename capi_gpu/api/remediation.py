"""HetznerGPURemediation(+Template): MachineHealthCheck external remediation by Robot reset.

MHC creates one per unhealthy Machine from the template. We reset the server, prove the reboot by a
changed boot id, retry up to a limit, then Reuse (give the host back) or Retire it, as CAPH does.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import Field

from capi_gpu.api.base import Conditions, KubeModel, ObjectMetaTemplate, immutable


class RemediationType(StrEnum):
    REBOOT = "Reboot"


class OnExhaustion(StrEnum):
    REUSE = "Reuse"
    """Delete the Machine and return the host to the pool."""
    RETIRE = "Retire"
    """Delete the Machine and retire the host (never chosen again)."""


class RemediationStrategy(KubeModel):
    """How to remediate."""

    type: RemediationType = RemediationType.REBOOT
    """Reboot is the only strategy."""
    retry_limit: Annotated[int, Field(ge=0, le=10)] = 1
    """Resets to try before giving up; 0 hands the Machine straight back to its owner."""
    timeout_seconds: Annotated[int, Field(ge=60, le=7200)] = 600
    """How long to wait for the node to become healthy after each reset."""
    cooldown_seconds: Annotated[int, Field(ge=0, le=86400)] = 1800
    """Minimum time between two remediations of the same host."""
    on_exhaustion: OnExhaustion = OnExhaustion.REUSE
    """What to do when the retries are used up."""


class HetznerGPURemediationSpec(KubeModel):
    """Remediation spec."""

    strategy: RemediationStrategy = RemediationStrategy()
    """The strategy."""


class RemediationPhase(StrEnum):
    RUNNING = "Running"
    WAITING = "Waiting"
    DELETING_MACHINE = "DeletingMachine"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class HetznerGPURemediationStatus(KubeModel):
    """Observed state."""

    phase: RemediationPhase | None = None
    """Running, Waiting, DeletingMachine, Succeeded or Failed."""
    retry_count: Annotated[int, Field(ge=0)] = 0
    """Resets sent."""
    last_remediated: datetime | None = None
    """When the last reset was sent."""
    boot_id_before: str | None = None
    """Boot id before the last reset; a different one proves the reset took effect."""
    conditions: Conditions = []
    """Ready."""


class HetznerGPURemediation(KubeModel):
    """Remediation of one Machine, created by MachineHealthCheck."""

    api_version: str = "infrastructure.cluster.x-k8s.io/v1alpha1"
    kind: str = "HetznerGPURemediation"
    metadata: dict[str, object] = {}
    spec: HetznerGPURemediationSpec = HetznerGPURemediationSpec()
    status: HetznerGPURemediationStatus = HetznerGPURemediationStatus()


class HetznerGPURemediationTemplateResource(KubeModel):
    """What remediations are created from."""

    metadata: ObjectMetaTemplate | None = None
    """Labels and annotations."""
    spec: HetznerGPURemediationSpec = HetznerGPURemediationSpec()
    """Remediation spec."""


class HetznerGPURemediationTemplateSpec(KubeModel):
    """Template spec."""

    template: Annotated[
        HetznerGPURemediationTemplateResource,
        Field(
            json_schema_extra=immutable(
                "spec.template is immutable, as CAPI templates are: create a new HetznerGPURemediationTemplate "
                "and point the MachineHealthCheck's remediation templateRef at it"
            )
        ),
    ]
    """The remediation template."""


class HetznerGPURemediationTemplate(KubeModel):
    """Template for HetznerGPURemediations, referenced by a MachineHealthCheck."""

    api_version: str = "infrastructure.cluster.x-k8s.io/v1alpha1"
    kind: str = "HetznerGPURemediationTemplate"
    metadata: dict[str, object] = {}
    spec: HetznerGPURemediationTemplateSpec
