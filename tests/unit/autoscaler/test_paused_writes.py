"""Pause on every write of the autoscaling loops: the claim scaler sends no replicas raise to a paused
Cluster (and then stops, so the source of a clusterctl move stays still between the supervisor's 30 s
checks) nor to a paused MachineDeployment, and ``--sync-autoscaler-annotations`` writes no annotation on a
MachineDeployment that is paused or whose Cluster is."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, cast

import pytest
from test_ca_annotations import BALANCED, machinedeployment, template

from capi_gpu import domain
from capi_gpu.autoscaler import decide, sync
from capi_gpu.autoscaler.scaler import ClaimScaler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "controllers"))
from fake_kube import NS, FakeKube

UP = decide.ScaleUp(group="c1-gpu", current=0, target=1, serves=(("2g.48gb", 1),))
PAUSED = {domain.PAUSED_ANNOTATION: ""}

# (Cluster.spec.paused, annotation on the Cluster, annotation on the MachineDeployment) -> written, scaler ends
TABLE = [
    (False, False, False, True, False),
    (True, False, False, False, True),
    (False, True, False, False, True),
    (False, False, True, False, False),
]


def _world(spec_paused: bool, cluster_ann: bool, md_ann: bool) -> FakeKube:
    cluster = {
        "metadata": {"name": "c1", "annotations": PAUSED if cluster_ann else {}},
        "spec": {"paused": spec_paused},
    }
    return FakeKube(
        ("clusters", cluster),
        ("machinedeployments", machinedeployment(PAUSED if md_ann else None)),
        ("hetznergpumachinetemplates", template(BALANCED)),
    )


def _deps(kube: FakeKube) -> Any:
    return type("D", (), {"kube": kube})()


def _md_writes(kube: FakeKube) -> list[Any]:
    return [w for w in kube.writes if w[1] == "machinedeployments"]


@pytest.mark.parametrize(("spec_paused", "cluster_ann", "md_ann", "written", "ends"), TABLE)
async def test_the_claim_scaler_raises_nothing_that_is_paused(
    spec_paused: bool, cluster_ann: bool, md_ann: bool, written: bool, ends: bool
) -> None:
    kube = _world(spec_paused, cluster_ann, md_ann)
    said: list[tuple[str, str]] = []
    scaler = ClaimScaler(
        _deps(kube), NS, "c1", cast(Any, None), emit=lambda obj, reason, msg, *_a, **_k: said.append((reason, msg))
    )
    md = kube.objs[("machinedeployments", NS, "c1-gpu")]
    assert await scaler.raise_all((UP,), {"c1-gpu": md}) is written
    assert bool(_md_writes(kube)) is written and md["spec"]["replicas"] == (1 if written else 0)
    assert bool(said) is written  # no ClaimScaleUp Event for a raise never sent
    assert scaler.cluster_paused is ends


@pytest.mark.parametrize(("spec_paused", "cluster_ann", "md_ann", "written", "_ends"), TABLE)
async def test_the_annotation_sync_writes_nothing_that_is_paused(
    spec_paused: bool, cluster_ann: bool, md_ann: bool, written: bool, _ends: bool
) -> None:
    kube = _world(spec_paused, cluster_ann, md_ann)
    assert await sync.reconcile(_deps(kube), NS, "c1-gpu") == sync.RESYNC
    assert bool(_md_writes(kube)) is written
