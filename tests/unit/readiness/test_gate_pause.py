"""The gate writes no Machine of a paused Cluster: the pause is asked right before each Machine write, a
paused Machine is skipped (and written on a later pass), and a paused Cluster also ends the gate, so the
source of a clusterctl move is not written in the up to 30 s its supervisor takes to notice the pause."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest

from capi_gpu import domain
from capi_gpu.api.conditions import PoolReason
from capi_gpu.readiness import decisions
from capi_gpu.readiness.gate import ClusterGate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "controllers"))
from fake_kube import NS, FakeKube

PAUSED = {domain.PAUSED_ANNOTATION: ""}
READY = decisions.PoolVerdict("gex-1", PoolReason.READY, "layout matches")

# (Cluster.spec.paused, annotation on the Cluster, annotation on the Machine) -> written, gate ends
TABLE = [
    (False, False, False, True, False),
    (True, False, False, False, True),
    (False, True, False, False, True),
    (False, False, True, False, False),
]


def _gate(kube: FakeKube) -> ClusterGate:
    deps = type("D", (), {"kube": kube, "clock": staticmethod(lambda: datetime(2026, 12, 5, tzinfo=UTC))})()
    return ClusterGate(cast(Any, deps), NS, "dev", cast(Any, None))


@pytest.mark.parametrize(("spec_paused", "cluster_ann", "machine_ann", "written", "ends"), TABLE)
async def test_no_machine_write_on_a_paused_machine_or_cluster(
    spec_paused: bool, cluster_ann: bool, machine_ann: bool, written: bool, ends: bool
) -> None:
    cluster = {
        "metadata": {"name": "dev", "annotations": PAUSED if cluster_ann else {}},
        "spec": {"paused": spec_paused},
    }
    machine = {"metadata": {"name": "w-1", "generation": 1, "annotations": PAUSED if machine_ann else {}}, "spec": {}}
    kube = FakeKube(("clusters", cluster), ("machines", machine))
    gate = _gate(kube)
    assert await gate._write_machine("w-1", READY) is written
    assert [w[1] for w in kube.writes] == (["machines"] if written else [])
    assert gate.cluster_paused is ends
