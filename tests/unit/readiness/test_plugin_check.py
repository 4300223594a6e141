"""The NVIDIA kubelet plugin's pods in the node verdict: slices a departed plugin left behind (the kubelet wipes
them only 30 s later) never make a node GPU-ready; a Running and Ready plugin pod on the node does not change
a verdict the slices decide."""

from __future__ import annotations

import dataclasses
from typing import Any

import nvidia_slices as nv
import pytest

from capi_gpu import domain
from capi_gpu.api.cluster import DRADriverAddon
from capi_gpu.api.conditions import PoolReason
from capi_gpu.readiness import decisions

NODE = "gex131-a"
BALANCED = decisions.ExpectedPool(profiles={"1g.24gb": 2, "2g.48gb": 1})
CHECK = decisions.PluginCheck(
    "NVIDIA DRA kubelet plugin", domain.NVIDIA_PLUGIN_NAMESPACE, domain.NVIDIA_PLUGIN_SELECTOR
)
ANY_NAMESPACE = dataclasses.replace(CHECK, namespace="")


def pod(
    name: str = "plugin-x",
    node: str = NODE,
    phase: str = "Running",
    ready: bool = True,
    namespace: str = domain.NVIDIA_PLUGIN_NAMESPACE,
    deleting: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-04T10:00:00Z"
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {"metadata": meta, "spec": {"nodeName": node}, "status": {"phase": phase, "conditions": conditions}}


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    pods: list[dict[str, Any]]
    running: bool
    says: tuple[str, ...] = ()
    check: decisions.PluginCheck = CHECK


CASES = [
    Case("running-ready", [pod()], True),
    Case(
        "none",
        [],
        False,
        ("no NVIDIA DRA kubelet plugin pod", domain.NVIDIA_PLUGIN_SELECTOR, f"in namespace {CHECK.namespace}", NODE),
    ),
    Case("other-node-only", [pod(node="gex131-b")], False),
    Case("pending", [pod(phase="Pending", ready=False)], False, ("plugin-x Pending",)),
    Case("running-not-ready", [pod(ready=False)], False, ("plugin-x not Ready",)),
    Case("crashed", [pod(phase="Failed", ready=False)], False, ("plugin-x Failed",)),
    Case("terminating", [pod(deleting=True)], False, ("plugin-x terminating",)),
    Case("old-terminating-new-running", [pod("old", deleting=True), pod("new")], True),
    Case("other-namespace", [pod(namespace="elsewhere")], False),
    Case("any-namespace", [pod(namespace="elsewhere")], True, check=ANY_NAMESPACE),
    Case(
        "no-status-yet", [{"metadata": {"name": "p", "namespace": CHECK.namespace}, "spec": {"nodeName": NODE}}], False
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_plugin_problem(case: Case) -> None:
    problem = decisions.plugin_problem(case.pods, NODE, case.check)
    assert (problem is None) is case.running, problem
    for fragment in case.says:
        assert problem is not None and fragment in problem, problem


def test_slices_left_behind_by_a_departed_plugin_are_not_ready() -> None:
    slices = [nv.nvidia_slice(NODE, nv.layout_devices(nv.BALANCED))]
    assert decisions.pool_verdict(slices, NODE, BALANCED).ready
    problem = decisions.plugin_problem([], NODE, CHECK)
    verdict = decisions.pool_verdict(slices, NODE, BALANCED, problem)
    assert verdict.reason is PoolReason.PLUGIN_NOT_RUNNING
    assert not verdict.ready and "kubelet plugin" in verdict.message


def test_a_running_plugin_leaves_the_slices_verdict_alone() -> None:
    for slices, reason in (
        ([nv.nvidia_slice(NODE, nv.layout_devices(nv.BALANCED))], PoolReason.READY),
        ([], PoolReason.NO_SLICES),
    ):
        problem = decisions.plugin_problem([pod()], NODE, CHECK)
        assert decisions.pool_verdict(slices, NODE, BALANCED, problem).reason is reason


def test_the_plugin_is_named_before_what_its_slices_show() -> None:
    """The root cause first: no plugin explains no or stale slices, not the other way round."""
    problem = decisions.plugin_problem([], NODE, CHECK)
    verdict = decisions.pool_verdict([], NODE, BALANCED, problem)
    assert [p.reason for p in verdict.problems] == [PoolReason.PLUGIN_NOT_RUNNING, PoolReason.NO_SLICES]


@pytest.mark.parametrize(
    "selector", ["", "a=b", "app.kubernetes.io/name=x,tier!=y", "k in (a,b)", "!k", "k notin (a, b), x==y"]
)
def test_the_plugin_selector_accepts_label_selectors(selector: str) -> None:
    assert DRADriverAddon(kubelet_plugin_selector=selector).kubelet_plugin_selector == selector


@pytest.mark.parametrize("selector", ["a b", "=x", "a=b c", "k in a", "a,,b", "a=b,", "a=(b)"])
def test_the_plugin_selector_refuses_what_the_apiserver_would(selector: str) -> None:
    with pytest.raises(ValueError, match=r"kubelet_plugin_selector|kubeletPluginSelector"):
        DRADriverAddon(kubelet_plugin_selector=selector)


def test_the_default_check_is_the_charts_kubelet_plugin() -> None:
    driver = DRADriverAddon()
    assert (driver.kubelet_plugin_namespace, driver.kubelet_plugin_selector) == (CHECK.namespace, CHECK.selector)
