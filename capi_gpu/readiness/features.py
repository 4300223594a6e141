"""Does the workload cluster's apiserver keep the ResourceSlice fields the gate relies on?

An apiserver drops a field whose feature gate is off, silently: a gate device without
``bindingConditions`` lets kube-scheduler bind at once (the claim layer is gone), and one without
``taints`` keeps new allocations coming to a node that lost its GPU. So the operator asks the workload
apiserver to store a probe slice shaped like a not-ready gate slice, as a dry run (nothing is written), and
compares what came back. The cluster controller probes each cluster again every ``RECHECK``
(``controllers.cluster_addons``), so a control plane whose gates are turned on later is seen without an
operator restart, and reports a missing field as the HetznerGPUCluster condition
``GateFeaturesAvailable=False`` naming the feature gates to turn on and the components that need each,
plus a Warning Event; the gate still runs, because the node taint does not depend on these fields.
"""

from __future__ import annotations

from datetime import datetime, timedelta
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
# The feature gate -> every component that needs it on. The probe sees only the apiserver, so the message
# names the rest: kube-scheduler honours binding conditions and device taints, and kube-controller-manager
# runs the device-taint eviction (a NoExecute taint deletes the pods on a device that lost its GPU).
COMPONENTS: Final = {
    "DRADeviceBindingConditions": ("kube-apiserver", "kube-scheduler"),
    "DRADeviceTaints": ("kube-apiserver", "kube-scheduler", "kube-controller-manager"),
}
# How long one probe's answer stands. Short enough that turning a gate on shows within minutes, long enough
# that a dry run is a few requests an hour per cluster.
RECHECK: Final = timedelta(minutes=5)


def probe() -> Obj:
    """A not-ready gate slice for a node that doesn't exist (a dry run never stores it)."""
    return decisions.gate_slice(PROBE_NODE, 1, devices=1, ready=False)


def missing(stored: Obj) -> list[str]:
    """The feature gates whose fields the apiserver dropped from the probe (pure)."""
    devices: list[dict[str, Any]] = (stored.get("spec") or {}).get("devices") or [{}]
    return sorted({gate for field, gate in FIELDS.items() if not devices[0].get(field)})


def recheck_in(last: datetime | None, now: datetime) -> float:
    """Seconds until the next probe of a cluster last probed at ``last`` (None: never); 0 when due (pure)."""
    return 0.0 if last is None else max(0.0, (last + RECHECK - now).total_seconds())


async def check(workload: AsyncKube) -> list[str]:
    return missing(await workload.create(RESOURCESLICES, probe(), dry_run=True))


def condition(gates: list[str]) -> tuple[bool, c.Reason, str]:
    """``GateFeaturesAvailable``: status, reason and message for the feature gates ``check`` found missing."""
    if not gates:
        return True, c.Reason.FEATURES_AVAILABLE, "the workload apiserver keeps binding conditions and device taints"
    where = "; ".join(f"{gate} on {_listed(COMPONENTS.get(gate, ('kube-apiserver',)))}" for gate in gates)
    return (
        False,
        c.Reason.FEATURES_MISSING,
        f"the workload apiserver drops the gate device's fields; enable the feature gate(s) {where}: until then"
        " pods bind without waiting for the GPU check",
    )


def _listed(names: tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
