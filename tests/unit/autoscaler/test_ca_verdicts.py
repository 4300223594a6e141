"""Next to cluster-autoscaler (``--claim-scaler-pods ca-declined``): CA's newest Event per pod is its verdict
(repeats by lastTimestamp or series, a same-second tie to TriggeredScaleUp, another pod of the same name,
other sources and kinds ignored); pending demand keeps only the GPU pods CA declined; and the decision over
the found double-provisioning case (CA scaling its MIG group from zero, the claim scaler owning groups for
both claims) raises only the whole-GPU group, before CA's replicas patch is visible as a coming node."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import pytest
from test_pending_demand import CLASSES, NOW, from_template, pod, templates
from test_scale_decision import ALL_1G, WHOLE, group

from capi_gpu.autoscaler import ca_verdicts, decide, demand
from capi_gpu.autoscaler.ca_verdicts import Verdict
from capi_gpu.gpu.packing import WHOLE_GPU, Request

T0 = datetime.datetime(2026, 12, 3, 21, 0, 0, tzinfo=datetime.UTC)
WHOLE_TEMPLATE = "whole-gpu"


def at(seconds: int) -> str:
    return (T0 + datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def event(
    pod_name: str,
    reason: str,
    last: int,
    *,
    uid: str | None = None,
    source: str = "cluster-autoscaler",
    kind: str = "Pod",
    series: int | None = None,
) -> dict[str, Any]:
    """A core/v1 Event as CA 1.36.1's recorder posts it (first seen at T0, last seen ``last`` s later)."""
    e: dict[str, Any] = {
        "metadata": {"name": f"{pod_name}.{reason}.{last}", "namespace": "team-a", "creationTimestamp": at(0)},
        "involvedObject": {
            "kind": kind,
            "namespace": "team-a",
            "name": pod_name,
            "uid": uid if uid is not None else f"uid-{pod_name}",
        },
        "reason": reason,
        "message": f"{reason} for {pod_name}",
        "source": {"component": source},
        "firstTimestamp": at(0),
        "lastTimestamp": at(last),
        "count": 1,
    }
    if series is not None:  # events.k8s.io style repeat: lastTimestamp stays, series moves
        e["series"] = {"count": 2, "lastObservedTime": at(series)}
    return e


@dataclass
class Case:
    name: str
    events: list[dict[str, Any]]
    want: dict[str, Verdict | None]  # pod -> verdict the claim scaler sees for the pod's current uid


CASES = [
    Case("no Event: not answered", [], {"p": None}),
    Case("declined", [event("p", "NotTriggerScaleUp", 5)], {"p": Verdict.DECLINED}),
    Case("triggered", [event("p", "TriggeredScaleUp", 5)], {"p": Verdict.TRIGGERED}),
    Case(
        "declined, then CA found a group: CA's",
        [event("p", "NotTriggerScaleUp", 5), event("p", "TriggeredScaleUp", 9)],
        {"p": Verdict.TRIGGERED},
    ),
    Case(
        "triggered, then declined (CA's group failed, now backed off): ours",
        [event("p", "TriggeredScaleUp", 5), event("p", "NotTriggerScaleUp", 60)],
        {"p": Verdict.DECLINED},
    ),
    Case(
        "same second: CA's (the side that cannot add a second node)",
        [event("p", "NotTriggerScaleUp", 5), event("p", "TriggeredScaleUp", 5)],
        {"p": Verdict.TRIGGERED},
    ),
    Case(
        "a repeat counted in series.lastObservedTime wins over an older lastTimestamp",
        [event("p", "TriggeredScaleUp", 9), event("p", "NotTriggerScaleUp", 5, series=30)],
        {"p": Verdict.DECLINED},
    ),
    Case(
        "a verdict on an earlier pod of the same name does not count",
        [event("p", "NotTriggerScaleUp", 5, uid="uid-old")],
        {"p": None},
    ),
    Case(
        "other components and other kinds are not CA's verdict",
        [
            event("p", "NotTriggerScaleUp", 5, source="default-scheduler"),
            event("p", "NotTriggerScaleUp", 5, kind="Node"),
            event("p", "FailedScheduling", 6),
        ],
        {"p": None},
    ),
    Case(
        "per pod",
        [event("a", "TriggeredScaleUp", 5), event("b", "NotTriggerScaleUp", 5)],
        {"a": Verdict.TRIGGERED, "b": Verdict.DECLINED, "c": None},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_verdict_table(case: Case) -> None:
    said = ca_verdicts.verdicts(case.events)
    for name, want in case.want.items():
        why = ca_verdicts.left_to_ca(pod(name, []), said)
        assert (why is None) == (want is Verdict.DECLINED), (name, why)
        if want is Verdict.TRIGGERED:
            assert why is not None and "scales up for it" in why and f"TriggeredScaleUp for {name}" in why
        if want is None:
            assert why == "cluster-autoscaler has not answered for it yet"


def whole_template() -> dict[str, Any]:
    req = {"exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}}
    gate = {"exactly": {"deviceClassName": "gate.gpu.infrastructure.cluster.x-k8s.io"}}
    return {
        "metadata": {"name": WHOLE_TEMPLATE, "namespace": "team-a"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", **req}, {"name": "gate", **gate}]}}},
    }


def pending(policy_events: list[dict[str, Any]] | None) -> demand.Demand:
    """A MIG 1g pod ("mig") and a whole-GPU pod ("whole"), both Unschedulable, plus a pod with no claim."""
    pods = [
        pod("mig", [from_template("gpu", "mig-1g-24gb")]),
        pod("whole", [from_template("gpu", WHOLE_TEMPLATE)]),
        pod("cpu-only", []),
    ]
    tpl = templates() | {("team-a", WHOLE_TEMPLATE): whole_template()}
    said = ca_verdicts.verdicts(policy_events) if policy_events is not None else None
    return demand.pending_demand(pods, {}, tpl, CLASSES, NOW, ca_said=said)


def test_policy_all_takes_every_gpu_pod() -> None:
    got = pending(None)
    assert got.requests == (Request.exact("1g.24gb"), Request.exact(WHOLE_GPU))
    assert got.left_to_ca == ()


def test_ca_declined_takes_only_what_ca_declined() -> None:
    got = pending([event("mig", "TriggeredScaleUp", 3), event("whole", "NotTriggerScaleUp", 3)])
    assert got.requests == (Request.exact(WHOLE_GPU),)
    assert got.pods == ("team-a/whole",)
    assert [(i.pod, i.reason) for i in got.left_to_ca] == [
        ("team-a/mig", "cluster-autoscaler scales up for it (TriggeredScaleUp for mig)")
    ]


def test_ca_declined_waits_for_ca_s_answer() -> None:
    got = pending([])
    assert got.requests == ()
    # Only GPU pods are reported: a pod without claims is nobody's business here.
    assert sorted(i.pod for i in got.left_to_ca) == ["team-a/mig", "team-a/whole"]


def test_found_double_provisioning_case_gets_one_node_per_claim() -> None:
    """CA has raised its MIG group from its cached node, but the patch is not visible yet (coming=0): both
    scalers decide in the same seconds. ``all`` raised a claim-scaler 1g group for the claim CA serves;
    ``ca-declined`` raises only the whole-GPU group, for the claim CA declined."""
    groups = [
        group("ca-mig", ALL_1G, owned=False),  # CA's, min 0, at zero
        group("cs-mig", ALL_1G),
        group("cs-whole", WHOLE),
    ]
    both = decide.decide(pending(None).requests, {}, groups)
    assert {u.group: u.target for u in both.scale_ups} == {"cs-mig": 1, "cs-whole": 1}  # + CA's: 3 nodes, 2 claims
    said = [event("mig", "TriggeredScaleUp", 2), event("whole", "NotTriggerScaleUp", 2)]
    only = decide.decide(pending(said).requests, {}, groups)
    assert [(u.group, u.current, u.target, u.serves) for u in only.scale_ups] == [("cs-whole", 0, 1, ((WHOLE_GPU, 1),))]
    assert only.unserved == ()


@pytest.mark.parametrize(
    ("declined_at", "grace", "taken"),
    [
        (0, 0, True),  # no grace: taken on the first decline
        (0, 60, False),  # declined 30 s ago, grace 60 s: CA may still copy its node and scale
        (-40, 60, True),  # declined 70 s ago: CA had its minute
    ],
)
def test_decline_grace(declined_at: int, grace: int, taken: bool) -> None:
    """The bench's case: CA declines while its group's node is under a minute old, then scales from it."""
    said = ca_verdicts.verdicts([event("p", "NotTriggerScaleUp", declined_at)])
    now = T0 + datetime.timedelta(seconds=30)
    why = ca_verdicts.left_to_ca(pod("p", []), said, now, datetime.timedelta(seconds=grace))
    assert (why is None) is taken, why
    if not taken:
        assert why is not None and "declined it at 21:00:00" in why and "waiting 60s" in why
