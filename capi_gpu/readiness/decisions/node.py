"""What a pool verdict means for the Node and for the CAPI Machine: the smallest change, or none.

The daemon watching a workload cluster reacts to every Node and ResourceSlice event, so most evaluations
change nothing; writing anyway would bump resourceVersions, wake every other watcher and feed back into
our own watch. Hence: a patch only when status, reason or message of ``GPUReady`` changes, and
``lastTransitionTime`` moves only when the status does.

Two subresources are involved and the apiserver keeps them apart (the Node strategy resets ``status`` on
a main-resource write and ``spec`` on a status write), so "one patch" means at most one per subresource:

* ``nodes/status``: a strategic-merge patch of ``status.conditions`` (merged by ``type``, so other
  conditions are untouched);
* ``nodes``: ``spec.taints``, which has no merge key and is replaced whole, as a JSON patch whose first
  op *tests* the taint list it was computed from. A concurrent taint writer (node lifecycle controller,
  cordon, Node Readiness Controller) makes it fail (422) instead of being silently overwritten; the
  caller re-reads and decides again. The precondition is on the taints, not on ``resourceVersion``,
  because the status write that precedes it bumps the resourceVersion itself. A node without taints
  (only ever when adding ours, which goes first) is guarded by a test of ``metadata.resourceVersion``.

Order matters for observers: becoming ready writes the condition before lifting the taint (whoever sees
an untainted node sees ``GPUReady=True``); becoming unready taints first, so scheduling stops as early
as possible. ``own_taint=False`` leaves the taint to a NodeReadinessRule that reads our condition.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Mapping
from typing import Any

from capi_gpu import domain
from capi_gpu.readiness.decisions import pools
from capi_gpu.unstructured import as_map

STARTUP_TAINT_EFFECT = "NoSchedule"
MESSAGE_LIMIT = 4096
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class NodeSubresource(enum.StrEnum):
    NODE = "node"
    STATUS = "status"


@dataclasses.dataclass(frozen=True)
class NodeWrite:
    """One PATCH: to ``nodes/<name>`` or ``nodes/<name>/status``, with this content type and body."""

    subresource: NodeSubresource
    content_type: str
    body: Any


@dataclasses.dataclass(frozen=True)
class NodePatch:
    """What to write to the Node; ``None`` where that subresource needs no write.

    ``status`` is a strategic-merge body for ``nodes/status``; ``taint_ops`` a JSON patch for ``nodes``.
    """

    status: dict[str, Any] | None = None
    taint_ops: list[dict[str, Any]] | None = None
    taint_first: bool = False

    @property
    def empty(self) -> bool:
        return self.status is None and self.taint_ops is None

    def ordered(self) -> tuple[NodeWrite, ...]:
        """The writes to make, in the order that keeps observers safe."""
        writes = []
        if self.status is not None:
            writes.append(NodeWrite(NodeSubresource.STATUS, STRATEGIC_MERGE_PATCH, self.status))
        if self.taint_ops is not None:
            writes.append(NodeWrite(NodeSubresource.NODE, JSON_PATCH, self.taint_ops))
        if self.taint_first:
            writes.reverse()
        return tuple(writes)


def rfc3339(now: datetime.datetime) -> str:
    """metav1.Time as the apiserver writes it: UTC, second precision. A naive clock is a bug, not UTC."""
    if now.tzinfo is None:
        raise ValueError("the clock must be timezone-aware")
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_gate_patch(
    node: Mapping[str, Any], verdict: pools.PoolVerdict, now: datetime.datetime, *, own_taint: bool = True
) -> NodePatch:
    """The Node changes that make ``GPUReady`` and the startup taint agree with ``verdict``."""
    status = "True" if verdict.ready else "False"
    message = truncate(verdict.message)
    conditions = as_map(node.get("status")).get("conditions") or []
    previous = next((as_map(c) for c in conditions if as_map(c).get("type") == domain.GPU_READY_CONDITION), None)
    status_body: dict[str, Any] | None = None
    if previous is None or (previous.get("status"), previous.get("reason"), previous.get("message")) != (
        status,
        verdict.reason.value,
        message,
    ):
        stamp = rfc3339(now)
        transition = stamp
        if previous is not None and previous.get("status") == status and previous.get("lastTransitionTime"):
            transition = str(previous["lastTransitionTime"])
        condition = {
            "type": domain.GPU_READY_CONDITION,
            "status": status,
            "reason": verdict.reason.value,
            "message": message,
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": transition,
        }
        status_body = {"status": {"conditions": [condition]}}
    taint_ops = _taint_ops(node, want_taint=not verdict.ready) if own_taint else None
    return NodePatch(status=status_body, taint_ops=taint_ops, taint_first=not verdict.ready)


def _taint_ops(node: Mapping[str, Any], *, want_taint: bool) -> list[dict[str, Any]] | None:
    taints = [dict(as_map(t)) for t in as_map(node.get("spec")).get("taints") or []]
    ours = [t for t in taints if t.get("key") == domain.NODE_STARTUP_TAINT]
    exact = len(ours) == 1 and ours[0].get("effect") == STARTUP_TAINT_EFFECT
    if exact if want_taint else not ours:
        return None
    # Our key with any other effect or duplicated is normalised to exactly one NoSchedule taint.
    kept = [t for t in taints if t.get("key") != domain.NODE_STARTUP_TAINT]
    if want_taint:
        kept.append({"key": domain.NODE_STARTUP_TAINT, "effect": STARTUP_TAINT_EFFECT})
    if taints:
        return [
            {"op": "test", "path": "/spec/taints", "value": taints},
            {"op": "replace", "path": "/spec/taints", "value": kept},
        ]
    ops: list[dict[str, Any]] = []
    resource_version = as_map(node.get("metadata")).get("resourceVersion")
    if resource_version:
        ops.append({"op": "test", "path": "/metadata/resourceVersion", "value": str(resource_version)})
    ops.append({"op": "add", "path": "/spec/taints", "value": kept})
    return ops


def machine_condition(
    verdict: pools.PoolVerdict,
    now: datetime.datetime,
    observed_generation: int,
    previous: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The CAPI Machine's ``GPUReady`` condition (metav1.Condition), named by the readinessGates.

    ``previous`` is the condition currently on the Machine, so ``lastTransitionTime`` survives a
    re-evaluation that does not flip the status.
    """
    status = "True" if verdict.ready else "False"
    transition = rfc3339(now)
    if previous and previous.get("status") == status and previous.get("lastTransitionTime"):
        transition = str(previous["lastTransitionTime"])
    return {
        "type": domain.GPU_READY_CONDITION,
        "status": status,
        "observedGeneration": observed_generation,
        "lastTransitionTime": transition,
        "reason": verdict.reason.value,
        "message": truncate(verdict.message),
    }


def truncate(message: str) -> str:
    return message if len(message) <= MESSAGE_LIMIT else message[: MESSAGE_LIMIT - 1] + "…"
