"""The simulated DaemonSet controller's rolling update, from tables: how many old pods it deletes per pass
against ``maxUnavailable`` (a count, a percentage rounded up, 0 meaning 1), nodes already unavailable
counting against it, an unavailable old pod replaced regardless, OnDelete deleting nothing; and its status."""

from __future__ import annotations

from typing import Any

import pytest

from capi_gpu_sim.daemonset_roll import NodePod, max_unavailable, status, template_hash, to_delete


def ds(max_unavailable: Any = 1, kind: str = "RollingUpdate") -> dict[str, Any]:
    strategy: dict[str, Any] = {"type": kind}
    if kind == "RollingUpdate":
        strategy["rollingUpdate"] = {"maxUnavailable": max_unavailable}
    return {"metadata": {"generation": 3}, "spec": {"updateStrategy": strategy, "template": {"spec": {}}}}


OLD = NodePod("old", updated=False, available=True)


def old(n: int) -> dict[str, NodePod | None]:
    return {f"n{i}": NodePod(f"p{i}", updated=False, available=True) for i in range(n)}


@pytest.mark.parametrize(
    ("value", "desired", "want"),
    [(1, 3, 1), (2, 3, 2), ("100%", 3, 3), ("25%", 3, 1), ("50%", 3, 2), ("10%", 20, 2), (0, 3, 1), ("0%", 3, 1)],
)
def test_max_unavailable_scales_percentages_up(value: Any, desired: int, want: int) -> None:
    assert max_unavailable(ds(value), desired) == want


@pytest.mark.parametrize(
    ("value", "pods", "want"),
    [
        (1, old(3), ["p0"]),
        ("100%", old(3), ["p0", "p1", "p2"]),
        (2, old(3), ["p0", "p1"]),
        # a node being rolled (no pod, or a new pod not Ready yet) uses the budget up
        (1, {**old(3), "n0": None}, []),
        (1, {**old(3), "n0": NodePod("new", updated=True, available=False)}, []),
        (2, {**old(3), "n0": None}, ["p1"]),
        # rolled and Ready: the next one goes
        (1, {**old(3), "n0": NodePod("new", updated=True, available=True)}, ["p1"]),
        # an old pod that is not available is replaced whatever the budget
        (1, {**old(3), "n0": None, "n1": NodePod("sick", updated=False, available=False)}, ["sick"]),
        (1, {f"n{i}": NodePod(f"new{i}", updated=True, available=True) for i in range(3)}, []),
    ],
)
def test_rolling_update_deletes_within_max_unavailable(
    value: Any, pods: dict[str, NodePod | None], want: list[str]
) -> None:
    assert to_delete(ds(value), pods) == want


def test_on_delete_deletes_nothing() -> None:
    assert to_delete(ds(kind="OnDelete"), old(3)) == []


def test_status_counts_updated_and_available_nodes() -> None:
    pods: dict[str, NodePod | None] = {
        "a": NodePod("new", updated=True, available=True),
        "b": NodePod("starting", updated=True, available=False),
        "c": None,
        "d": OLD,
    }
    assert status(ds(), pods) == {
        "observedGeneration": 3,
        "desiredNumberScheduled": 4,
        "currentNumberScheduled": 3,
        "numberMisscheduled": 0,
        "numberReady": 2,
        "numberAvailable": 2,
        "numberUnavailable": 2,
        "updatedNumberScheduled": 2,
    }


def test_the_hash_follows_the_pod_template_only() -> None:
    a, b = ds(1), ds("100%")
    assert template_hash(a) == template_hash(b), "the strategy is not part of the template"
    b["spec"]["template"]["metadata"] = {"annotations": {"kubectl.kubernetes.io/restartedAt": "now"}}
    assert template_hash(a) != template_hash(b)
