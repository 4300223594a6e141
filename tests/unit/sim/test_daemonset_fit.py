"""Where a DaemonSet's pod runs (sim/daemonset_fit.py), from tables: nodeSelector, required node affinity
(every operator, matchFields, empty terms), taints against tolerations and the daemon pods' automatic ones,
and a running pod that stays through a NoSchedule taint but not a NoExecute one."""

from __future__ import annotations

from typing import Any

import pytest

from capi_gpu_sim import daemonset_fit


def node(labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "gex131-1", "labels": labels or {}}, "spec": {"taints": taints or []}}


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
        }
    }


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": op, "values": list(values)}]}


GPU = {"gpu.infrastructure.cluster.x-k8s.io/gpu": "true"}
STARTUP = {"key": "readiness.k8s.io/gpu-not-ready", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("spec", "the_node", "fits"),
    [
        ({}, node(), True),
        ({"nodeSelector": GPU}, node(GPU), True),
        ({"nodeSelector": GPU}, node(), False),
        ({"nodeSelector": GPU}, node({"gpu.infrastructure.cluster.x-k8s.io/gpu": "false"}), False),
        # Terms are ORed, expressions within a term ANDed.
        (affinity(expr("a", "In", "x"), expr("b", "In", "y")), node({"b": "y"}), True),
        (affinity(expr("a", "In", "x"), expr("b", "In", "y")), node({"c": "z"}), False),
        (
            affinity({"matchExpressions": [{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "Exists"}]}),
            node({"a": "1"}),
            False,
        ),
        (affinity(expr("a", "NotIn", "x")), node(), True),
        (affinity(expr("a", "NotIn", "x")), node({"a": "x"}), False),
        (affinity(expr("a", "DoesNotExist")), node({"a": "x"}), False),
        (affinity(expr("a", "Gt", "3")), node({"a": "4"}), True),
        (affinity(expr("a", "Gt", "3")), node({"a": "3"}), False),
        (affinity(expr("a", "Lt", "3")), node({"a": "two"}), False),
        (affinity({}), node({"a": "x"}), False),  # an empty term matches nothing
        (affinity({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gex131-1"]}]}), node(), True),
        (
            affinity({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gex131-2"]}]}),
            node(),
            False,
        ),
        # Taints: NoSchedule and NoExecute need a toleration; PreferNoSchedule does not.
        ({}, node(taints=[STARTUP]), False),
        ({"tolerations": [{"key": STARTUP["key"], "operator": "Exists"}]}, node(taints=[STARTUP]), True),
        (
            {"tolerations": [{"key": STARTUP["key"], "operator": "Exists", "effect": "NoExecute"}]},
            node(taints=[STARTUP]),
            False,
        ),
        ({"tolerations": [{"operator": "Exists"}]}, node(taints=[STARTUP]), True),
        (
            {"tolerations": [{"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}]},
            node(taints=[{"key": "k", "value": "w", "effect": "NoSchedule"}]),
            False,
        ),
        ({}, node(taints=[{"key": "k", "effect": "PreferNoSchedule"}]), True),
        # What every daemon pod tolerates without asking.
        ({}, node(taints=[{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]), True),
        ({}, node(taints=[{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]), True),
        ({}, node(taints=[{"key": "node.kubernetes.io/network-unavailable", "effect": "NoSchedule"}]), False),
    ],
)
def test_fit(spec: dict[str, Any], the_node: dict[str, Any], fits: bool) -> None:
    reason = daemonset_fit.misfit(spec, the_node)
    assert (reason is None) is fits, reason


@pytest.mark.parametrize(
    ("taint", "keeps_running"),
    [
        # cluster-autoscaler's scale-down mark and a cordon keep new pods off, not a running one.
        ({"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}, True),
        ({"key": "k", "effect": "NoExecute"}, False),
    ],
)
def test_a_running_pod_minds_only_noexecute_taints(taint: dict[str, str], keeps_running: bool) -> None:
    tainted = node(GPU, taints=[taint])
    assert daemonset_fit.misfit({"nodeSelector": GPU}, tainted) is not None  # no new pod either way
    assert (daemonset_fit.misfit({"nodeSelector": GPU}, tainted, running=True) is None) is keeps_running
    assert daemonset_fit.misfit({"nodeSelector": GPU}, node(), running=True) is not None  # selector still counts
