"""Does the workload cluster's apiserver keep the ResourceSlice fields the gate relies on?

An apiserver drops a field whose feature gate is off, silently: a gate device without
``bindingConditions`` lets kube-scheduler bind at once (the claim layer is gone), and one without
``taints`` keeps new allocations coming to a node that lost its GPU. So the operator asks the workload
apiserver to store a probe slice shaped like a not-ready gate slice, as a dry run (nothing is written), and
compares what came back. The cluster controller checks once per operator process and cluster
(``controllers.cluster_addons``) and reports a missing field as the HetznerGPUCluster condition
``GateFeaturesAvailable=False`` naming the feature gates to turn on, plus a Warning Event; the gate still
runs, because the node taint does not depend on these fields.
"""

from __future__ import annotations

from typing import Any, Final

from capi_gpu.api import conditions as c
from capi_gpu.kube import RESOURCESLICES, AsyncKube, Obj
from capi_gpu.readiness import decisions

PROBE_NODE: Final = "capi-gpu-feature-probe"
# The device field the gate writes -> the kube-apiserver feature gate that keeps it (Kubernetes 1.36).
FIELDS: Final = {
    "bindingConditions": "DRADeviceBindingConditions",
    "bindingFailureConditions": "DRADeviceBindingConditions",
    "taints": "DRADeviceTaints",
}


def probe() -> Obj:
    """A not-ready gate slice for a node that doesn't exist (a dry run never stores it)."""
    return decisions.gate_slice(PROBE_NODE, 1, devices=1, ready=False)


def missing(stored: Obj) -> list[str]:
    """The feature gates whose fields the apiserver dropped from the probe (pure)."""
    devices: list[dict[str, Any]] = (stored.get("spec") or {}).get("devices") or [{}]
    return sorted({gate for field, gate in FIELDS.items() if not devices[0].get(field)})


async def check(workload: AsyncKube) -> list[str]:
    return missing(await workload.create(RESOURCESLICES, probe(), dry_run=True))


def condition(gates: list[str]) -> tuple[bool, c.Reason, str]:
    """``GateFeaturesAvailable``: status, reason and message for the feature gates ``check`` found missing."""
    if not gates:
        return True, c.Reason.FEATURES_AVAILABLE, "the workload apiserver keeps binding conditions and device taints"
    return (
        False,
        c.Reason.FEATURES_MISSING,
        f"the workload apiserver drops the gate device's fields; enable the feature gate(s) {', '.join(gates)} on "
        "kube-apiserver and kube-scheduler: until then pods bind without waiting for the GPU check",
    )
