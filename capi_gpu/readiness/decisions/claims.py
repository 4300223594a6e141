"""The claim layer of the gate: our gate device's slice, and when its binding condition turns True.

NVIDIA's slices carry no ``bindingConditions`` and belong to NVIDIA's kubelet plugin, so we publish our
own node-local pool of ``gate-<i>`` devices, one per GPU device the node's layout promises. The shipped
ResourceClaimTemplates ask for a MIG device *and* a gate device.

**Binding conditions only while the node is not GPU ready.** kube-scheduler (1.36) waits in PreBind on a
device's ``bindingConditions`` by polling the claim every 5 s, with the first look right after it wrote
the allocation, before anyone could have answered; so every gated pod paid one full 5 s poll (pod create
-> bound p50 5.5 s even on a node ready for hours). A result without binding conditions returns from
PreBind at once. Hence two shapes of the gate device (``gate_slice``):

* node GPU ready: a bare device. The allocator copies no binding conditions, the pod binds at once;
* node not ready: ``bindingConditions``/``bindingFailureConditions`` plus a device taint, so new
  allocations avoid the node even for pods that tolerate its startup taint, and any allocation that
  does happen (a claim tolerating the taint) still waits for our verdict in PreBind.

**The race, closed by the taint's effect.** A scheduler whose slice informer still shows the ready shape
when the node turns not ready can allocate a bare gate device and bind at once; nothing can veto that
bind. So the not-ready shape taints every gate device that no claim held while the node was ready
``NoExecute``: kube-controller-manager's device-taint eviction controller then deletes any pod
allocated such a device from the stale view, wherever our own watch is. Devices held by claims the gate saw
allocated while the node was ready get ``NoSchedule`` only: their pods were placed on a ready GPU and
keep running (a driver restart must not evict every workload); the driver's own taints speak for the
device itself.

Co-location needs no ``matchAttribute`` constraint: both the NVIDIA slice and the gate slice set
``nodeName``, and the allocator only offers a pod node-local devices of the node it is filtering, so
both results always name the pod's node as their pool. We still check it, and fail the claim if it
ever does not hold. ``bindsToNode`` is left unset: a ``nodeName`` slice already pins the allocation.

Policy for a claim whose gate result carries binding conditions (``claim_gate_decision``; a bare result
is ``NOT_GATED``), measured from ``allocation.allocationTimestamp``:

* bind when the node's verdict is Ready and every GPU result is in the node's current pool without a
  ``NoSchedule``/``NoExecute`` taint the result does not tolerate;
* fail at once when waiting cannot help: a GPU device tainted, missing from a complete and ready pool,
  on another node than the gate, or the node's verdict is ``HostMismatch``, ``LayoutMismatch`` or
  ``DeviceTainted``;
* wait while the cause may be our watch lagging the scheduler's or a republish in flight (no verdict
  yet, ``NoSlices``, ``PoolIncomplete``, ``StaleGeneration``, a device not yet seen in an incomplete
  pool), for at most ``grace`` (60 s, well under the scheduler's 600 s ``bindingTimeout``, so the pod
  gets a reason and another node instead of a silent timeout); then fail.

Decisions are sticky: once either condition is True on the claim nothing more is written.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import hashlib
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from capi_gpu import domain
from capi_gpu.api.conditions import GateReason, PoolReason
from capi_gpu.readiness.decisions import node as node_decisions
from capi_gpu.readiness.decisions import pools
from capi_gpu.unstructured import as_map

DEFAULT_GATE_GRACE = datetime.timedelta(seconds=60)
_NAME_LIMIT = 253


class GateOutcome(enum.StrEnum):
    NOT_GATED = "NotGated"
    SETTLED = "Settled"
    WAIT = "Wait"
    BIND = "Bind"
    FAIL = "Fail"


@dataclasses.dataclass(frozen=True)
class ClaimGateDecision:
    """``entries`` are the whole ``status.devices[]`` items to upsert (key driver+pool+device+shareID)."""

    outcome: GateOutcome
    reason: GateReason | None = None
    message: str = ""
    node: str | None = None
    entries: tuple[dict[str, Any], ...] = ()
    recheck_at: datetime.datetime | None = None


@dataclasses.dataclass(frozen=True)
class _Finding:
    reason: GateReason
    message: str
    transient: bool


def gate_slice_name(node_name: str) -> str:
    name = f"{node_name}-{domain.GATE_DRIVER}"
    if len(name) <= _NAME_LIMIT:
        return name
    digest = hashlib.sha256(node_name.encode()).hexdigest()[:10]
    return f"{node_name[: _NAME_LIMIT - len(digest) - 6]}-{digest}-gate"


def gate_device_count(expected: pools.ExpectedPool) -> int:
    """One gate device per GPU device the layout promises: every claim holds one, so none runs out first."""
    return max(1, sum(expected.profiles.values()) + expected.full_gpus)


def gate_slice(
    node_name: str,
    generation: int,
    *,
    devices: int = 1,
    ready: bool = True,
    node_uid: str | None = None,
    held: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """The ResourceSlice our gate driver publishes for one GPU node (one pool, one slice).

    ``devices`` exclusive gate devices, not one shared device: cluster-autoscaler rates a node by its
    busiest pool (``HighestDynamicResourceUtilization``, allocated / published devices). A single device
    that every claim shares counts as 100 % used once any claim holds it, so a node with one of four MIG
    devices busy would never be drained to consolidate; with one gate device per GPU device the gate pool
    is exactly as busy as the GPU pool. Pass ``gate_device_count(expected)``.

    ``ready`` (pass the node verdict) gives bare devices: no binding conditions, so kube-scheduler binds
    without its 5 s PreBind poll. ``ready=False`` adds the binding conditions and a taint: ``NoSchedule``
    on the devices named in ``held`` (claimed while the node was ready), ``NoExecute`` on every other one,
    so a pod allocated one from a stale view is evicted (module docstring). Bump ``generation`` whenever
    the slice changes: consumers trust only the highest. With ``node_uid`` the slice is owned by the
    Node, so deleting the Node garbage-collects it.
    """
    metadata: dict[str, Any] = {"name": gate_slice_name(node_name)}
    if node_uid:
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid, "controller": True}
        ]
    items: list[dict[str, Any]] = []
    for i in range(max(1, devices)):
        name = f"{domain.GATE_DEVICE_NAME}-{i}"
        device: dict[str, Any] = {"name": name}
        if not ready:
            effect = "NoSchedule" if name in held else "NoExecute"
            device["bindingConditions"] = [domain.GATE_BINDING_CONDITION]
            device["bindingFailureConditions"] = [domain.GATE_FAILURE_CONDITION]
            device["taints"] = [{"key": domain.GATE_DEVICE_TAINT, "value": "true", "effect": effect}]
        items.append(device)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": {
            "driver": domain.GATE_DRIVER,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
            "nodeName": node_name,
            "devices": items,
        },
    }


def gate_results(claim: Mapping[str, Any], *, gated_only: bool = True) -> list[Mapping[str, Any]]:
    """The claim's allocation results on our gate driver; with ``gated_only`` only those the scheduler
    copied binding conditions into (allocated while the node was not ready)."""
    allocation = as_map(as_map(claim.get("status")).get("allocation"))
    results = [as_map(r) for r in as_map(allocation.get("devices")).get("results") or []]
    return [
        r for r in results if r.get("driver") == domain.GATE_DRIVER and (r.get("bindingConditions") or not gated_only)
    ]


def claim_gate_decision(
    claim: Mapping[str, Any],
    node_verdicts: Mapping[str, pools.PoolVerdict],
    current_pool_devices: Mapping[str, pools.CurrentPool],
    now: datetime.datetime,
    *,
    grace: datetime.timedelta = DEFAULT_GATE_GRACE,
) -> ClaimGateDecision:
    """Decide the gate device's binding condition for one allocated claim.

    ``node_verdicts`` and ``current_pool_devices`` (from ``pools.current_pools``) are keyed by node name,
    which is also the NVIDIA and the gate pool name.
    """
    status = as_map(claim.get("status"))
    allocation = as_map(status.get("allocation"))
    results = [as_map(r) for r in as_map(allocation.get("devices")).get("results") or []]
    gates = [r for r in results if r.get("driver") == domain.GATE_DRIVER and r.get("bindingConditions")]
    if not gates:  # none, or bare: allocated on a ready node, the scheduler binds without us
        return ClaimGateDecision(GateOutcome.NOT_GATED)
    existing = [as_map(d) for d in status.get("devices") or []]
    node_name = str(gates[0].get("pool", ""))
    if _settled(gates, existing):
        return ClaimGateDecision(GateOutcome.SETTLED, node=node_name)
    gpus = [r for r in results if r.get("driver") == domain.NVIDIA_DRIVER]
    finding = _assess(node_name, gates, gpus, node_verdicts.get(node_name), current_pool_devices.get(node_name))
    generation = as_map(claim.get("metadata")).get("generation")
    if finding is None:
        message = f"node {node_name} GPU ready and the claim's devices are in its current pool"
        entries = _entries(
            gates,
            existing,
            ready=True,
            reason=GateReason.GPU_READY,
            message=message,
            now=now,
            generation=generation,
        )
        return ClaimGateDecision(GateOutcome.BIND, GateReason.GPU_READY, message, node_name, entries)
    deadline = _allocated_at(claim) + grace if finding.transient else None
    if deadline is not None and now < deadline:
        return ClaimGateDecision(GateOutcome.WAIT, finding.reason, finding.message, node_name, recheck_at=deadline)
    message = finding.message if deadline is None else f"{finding.message} (still after {grace})"
    entries = _entries(
        gates, existing, ready=False, reason=finding.reason, message=message, now=now, generation=generation
    )
    return ClaimGateDecision(GateOutcome.FAIL, finding.reason, message, node_name, entries)


def _assess(
    node_name: str,
    gates: Sequence[Mapping[str, Any]],
    gpus: Sequence[Mapping[str, Any]],
    verdict: pools.PoolVerdict | None,
    pool: pools.CurrentPool | None,
) -> _Finding | None:
    """The first reason not to bind, most decisive first: a fatal device problem beats the node's state,
    which beats a device we have not seen yet (the node's state usually explains that)."""
    elsewhere = sorted({str(r.get("pool")) for r in [*gates, *gpus]} - {node_name})
    if elsewhere:
        message = f"gate on {node_name} but devices in pools {', '.join(elsewhere)}"
        return _Finding(GateReason.NOT_COLOCATED, message, transient=False)
    devices = pool.devices if pool is not None else {}
    for result in gpus:
        device = devices.get(str(result.get("device", "")))
        if device is not None and (tainted := _untolerated(node_name, result, device)) is not None:
            return tainted
    if verdict is None:
        return _Finding(GateReason.NODE_UNKNOWN, f"node {node_name} has not been evaluated yet", transient=True)
    if not verdict.ready:
        message = f"node {node_name} not GPU ready: {verdict.reason}: {verdict.message}"
        return _Finding(GateReason.NODE_NOT_READY, message, transient=_transient(verdict.reason))
    missing = sorted(str(r.get("device", "")) for r in gpus if str(r.get("device", "")) not in devices)
    if missing:
        where = f"generation {pool.generation} of pool {node_name}" if pool is not None else f"pool {node_name}"
        trusted = pool is not None and pool.complete
        message = f"{', '.join(missing)} not in {where}"
        return _Finding(GateReason.DEVICE_MISSING, message, transient=not trusted)
    return None


def _untolerated(node_name: str, result: Mapping[str, Any], device: pools.PoolDevice) -> _Finding | None:
    tolerations = [as_map(t) for t in result.get("tolerations") or []]
    untolerated = [t for t in device.blocking_taints if not any(_tolerates(x, t) for x in tolerations)]
    if not untolerated:
        return None
    taints = ", ".join(t.describe() for t in untolerated)
    message = f"device {device.name} on {node_name} is tainted ({taints})"
    return _Finding(GateReason.DEVICE_TAINTED, message, transient=False)


def _transient(reason: PoolReason) -> bool:
    """Whether a node verdict may clear on its own within the grace period."""
    match reason:
        case (
            PoolReason.PLUGIN_NOT_RUNNING
            | PoolReason.NO_SLICES
            | PoolReason.POOL_INCOMPLETE
            | PoolReason.STALE_GENERATION
        ):
            return True  # a restarting plugin (a relayout, a chart upgrade) comes back by itself
        case PoolReason.HOST_MISMATCH | PoolReason.LAYOUT_MISMATCH | PoolReason.DEVICE_TAINTED | PoolReason.READY:
            return False
        case _:
            typing.assert_never(reason)


def _tolerates(toleration: Mapping[str, Any], taint: pools.DeviceTaint) -> bool:
    """DeviceToleration semantics (KEP-5055): empty effect matches all, Exists with empty key matches all."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.effect:
        return False
    key = toleration.get("key") or ""
    if (toleration.get("operator") or "Equal") == "Exists":
        return not key or key == taint.key
    return key == taint.key and (toleration.get("value") or "") == taint.value


def _settled(gates: Sequence[Mapping[str, Any]], existing: Sequence[Mapping[str, Any]]) -> bool:
    def true(entry: Mapping[str, Any] | None, condition: str) -> bool:
        conditions = as_map(entry).get("conditions") or []
        return any(as_map(c).get("type") == condition and as_map(c).get("status") == "True" for c in conditions)

    entries = [_matching(g, existing) for g in gates]
    bound = all(true(e, domain.GATE_BINDING_CONDITION) for e in entries)
    return bound or any(true(e, domain.GATE_FAILURE_CONDITION) for e in entries)


def _entries(
    gates: Sequence[Mapping[str, Any]],
    existing: Sequence[Mapping[str, Any]],
    *,
    ready: bool,
    reason: GateReason,
    message: str,
    now: datetime.datetime,
    generation: object,
) -> tuple[dict[str, Any], ...]:
    message = node_decisions.truncate(message)
    wanted = {domain.GATE_BINDING_CONDITION: ready, domain.GATE_FAILURE_CONDITION: not ready}
    out = []
    for gate in gates:
        entry = {k: gate[k] for k in ("driver", "pool", "device", "shareID") if gate.get(k)}
        previous = as_map(_matching(gate, existing))
        old = {str(as_map(c).get("type")): as_map(c) for c in previous.get("conditions") or []}
        conditions = [dict(c) for t, c in old.items() if t not in wanted]
        for condition_type, is_true in wanted.items():
            status = "True" if is_true else "False"
            transition = node_decisions.rfc3339(now)
            before = old.get(condition_type)
            if before and before.get("status") == status and before.get("lastTransitionTime"):
                transition = str(before["lastTransitionTime"])
            condition: dict[str, Any] = {
                "type": condition_type,
                "status": status,
                "reason": reason.value,
                "message": message,
                "lastTransitionTime": transition,
            }
            if isinstance(generation, int):
                condition["observedGeneration"] = generation
            conditions.append(condition)
        entry["conditions"] = conditions
        out.append(entry)
    return tuple(out)


def device_status_key(entry: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """The ``status.devices`` map key: driver, pool, device, shareID."""
    return (
        str(entry.get("driver", "")),
        str(entry.get("pool", "")),
        str(entry.get("device", "")),
        str(entry.get("shareID") or ""),
    )


def merged_device_statuses(claim: Mapping[str, Any], entries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The claim's whole ``status.devices`` with ``entries`` upserted, for writers that replace the list."""
    merged = {
        device_status_key(d): dict(d) for d in (as_map(x) for x in as_map(claim.get("status")).get("devices") or [])
    }
    for entry in entries:
        merged[device_status_key(entry)] = dict(entry)
    return list(merged.values())


def _matching(gate: Mapping[str, Any], existing: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    key = device_status_key(gate)
    return next((e for e in existing if device_status_key(e) == key), None)


def _allocated_at(claim: Mapping[str, Any]) -> datetime.datetime:
    """When the grace period started; falls back to the claim's creation, then to the epoch (fail now)."""
    status = as_map(claim.get("status"))
    for raw in (
        as_map(status.get("allocation")).get("allocationTimestamp"),
        as_map(claim.get("metadata")).get("creationTimestamp"),
    ):
        if isinstance(raw, str) and raw:
            return datetime.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    return datetime.datetime.fromtimestamp(0, datetime.UTC)
