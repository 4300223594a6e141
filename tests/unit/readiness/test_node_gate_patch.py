"""Node gate patches (condition, startup taint, no-op, ordering, re-tainting) and the Machine condition."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest

from capi_gpu import domain
from capi_gpu.api.conditions import PoolReason
from capi_gpu.readiness import decisions
from capi_gpu.readiness.decisions import NodeSubresource

NOW = datetime.datetime(2026, 9, 1, 12, 0, 0, tzinfo=datetime.UTC)
EARLIER = "2026-09-01T11:00:00Z"
READY = decisions.PoolVerdict("n1", PoolReason.READY, "pool n1 generation 1 matches the layout", (), 1)
INCOMPLETE = decisions.PoolVerdict("n1", PoolReason.POOL_INCOMPLETE, "pool n1 generation 2: 1 of 2 slices", (), 2)
TAINTED = decisions.PoolVerdict("n1", PoolReason.DEVICE_TAINTED, "tainted by the driver: gpu-0-mig-…", (), 3)
STARTUP = {"key": domain.NODE_STARTUP_TAINT, "effect": "NoSchedule"}
OTHER = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


def node(taints: list[dict[str, Any]], condition: dict[str, Any] | None = None) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True"}]
    if condition is not None:
        conditions.append({"type": domain.GPU_READY_CONDITION, "lastTransitionTime": EARLIER, **condition})
    return {
        "metadata": {"name": "n1", "resourceVersion": "42"},
        "spec": {"taints": taints},
        "status": {"conditions": conditions},
    }


def cond(verdict: decisions.PoolVerdict) -> dict[str, Any]:
    status = "True" if verdict.ready else "False"
    return {"status": status, "reason": verdict.reason.value, "message": verdict.message}


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    node: dict[str, Any]
    verdict: decisions.PoolVerdict
    taints_after: list[dict[str, Any]] | None  # None: no taint write
    condition_status: str | None  # None: no status write
    transition_kept: bool = False


CASES = [
    Case("fresh-node-becomes-ready", node([STARTUP, OTHER]), READY, [OTHER], "True"),
    Case("fresh-node-not-ready-yet", node([STARTUP]), INCOMPLETE, None, "False"),
    Case("ready-and-settled", node([OTHER], cond(READY)), READY, None, None),
    Case("not-ready-and-settled", node([STARTUP], cond(INCOMPLETE)), INCOMPLETE, None, None),
    Case("ready-node-goes-stale", node([OTHER], cond(READY)), INCOMPLETE, [OTHER, STARTUP], "False"),
    Case("ready-node-xid", node([], cond(READY)), TAINTED, [STARTUP], "False"),
    Case("reason-changes-status-stays", node([STARTUP], cond(INCOMPLETE)), TAINTED, None, "False", True),
    Case("taint-removed-by-someone", node([], cond(INCOMPLETE)), INCOMPLETE, [STARTUP], None),
    Case("wrong-effect-normalised", node([{**STARTUP, "effect": "NoExecute"}]), INCOMPLETE, [STARTUP], "False"),
    Case("duplicate-taint-normalised", node([STARTUP, STARTUP], cond(INCOMPLETE)), INCOMPLETE, [STARTUP], None),
    Case("node-without-spec-taints", {"metadata": {"name": "n1"}, "spec": {}}, READY, None, "True"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_node_gate_patch(case: Case) -> None:
    patch = decisions.node_gate_patch(case.node, case.verdict, NOW)
    if case.taints_after is None:
        assert patch.taint_ops is None
    else:
        before = case.node["spec"].get("taints")
        precondition = (
            {"op": "test", "path": "/spec/taints", "value": before}
            if before
            else {"op": "test", "path": "/metadata/resourceVersion", "value": "42"}
        )
        assert patch.taint_ops == [
            precondition,
            {"op": "replace" if before else "add", "path": "/spec/taints", "value": case.taints_after},
        ]
    if case.condition_status is None:
        assert patch.status is None
    else:
        assert patch.status is not None
        (condition,) = patch.status["status"]["conditions"]
        assert condition["type"] == domain.GPU_READY_CONDITION
        assert condition["status"] == case.condition_status
        assert condition["reason"] == case.verdict.reason.value
        assert condition["message"] == case.verdict.message
        assert condition["lastHeartbeatTime"] == "2026-09-01T12:00:00Z"
        assert condition["lastTransitionTime"] == (EARLIER if case.transition_kept else "2026-09-01T12:00:00Z")
    assert patch.empty is (case.taints_after is None and case.condition_status is None)


def test_ready_writes_condition_before_lifting_taint() -> None:
    patch = decisions.node_gate_patch(node([STARTUP]), READY, NOW)
    writes = [(w.subresource, w.content_type) for w in patch.ordered()]
    assert writes == [
        (NodeSubresource.STATUS, "application/strategic-merge-patch+json"),
        (NodeSubresource.NODE, "application/json-patch+json"),
    ]
    # The taint write is guarded by the taints it read, not by the resourceVersion the status write bumps.
    assert patch.taint_ops is not None
    assert all(op["path"] != "/metadata/resourceVersion" for op in patch.taint_ops)


def test_unready_taints_before_writing_condition() -> None:
    patch = decisions.node_gate_patch(node([], cond(READY)), TAINTED, NOW)
    assert [w.subresource for w in patch.ordered()] == [NodeSubresource.NODE, NodeSubresource.STATUS]


def test_taint_left_to_node_readiness_rule() -> None:
    patch = decisions.node_gate_patch(node([STARTUP]), READY, NOW, own_taint=False)
    assert patch.taint_ops is None
    assert patch.status is not None
    assert [w.subresource for w in patch.ordered()] == [NodeSubresource.STATUS]


def test_long_messages_are_truncated() -> None:
    verdict = dataclasses.replace(INCOMPLETE, message="x" * 10_000)
    patch = decisions.node_gate_patch(node([STARTUP]), verdict, NOW)
    assert patch.status is not None
    message = patch.status["status"]["conditions"][0]["message"]
    assert len(message) == 4096
    assert message.endswith("…")
    settled = node([STARTUP], {"status": "False", "reason": "PoolIncomplete", "message": message})
    assert decisions.node_gate_patch(settled, verdict, NOW).empty


def test_naive_clock_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        decisions.node_gate_patch(node([STARTUP]), READY, datetime.datetime(2026, 9, 1))


@pytest.mark.parametrize(
    ("verdict", "previous", "status", "transition"),
    [
        (READY, None, "True", "2026-09-01T12:00:00Z"),
        (INCOMPLETE, None, "False", "2026-09-01T12:00:00Z"),
        (READY, {"status": "True", "lastTransitionTime": EARLIER}, "True", EARLIER),
        (TAINTED, {"status": "True", "lastTransitionTime": EARLIER}, "False", "2026-09-01T12:00:00Z"),
        (TAINTED, {"status": "False", "lastTransitionTime": EARLIER}, "False", EARLIER),
    ],
)
def test_machine_condition(
    verdict: decisions.PoolVerdict, previous: dict[str, Any] | None, status: str, transition: str
) -> None:
    condition = decisions.machine_condition(verdict, NOW, 7, previous)
    assert condition == {
        "type": "GPUReady",
        "status": status,
        "observedGeneration": 7,
        "lastTransitionTime": transition,
        "reason": verdict.reason.value,
        "message": verdict.message,
    }
