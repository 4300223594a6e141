"""A node whose host arrived by clusterctl move and has no status yet gets no verdict: the gate leaves it as
it is until the host's snapshot is restored. Judged on an empty status (no MIG devices recorded), the node
of a running GPU host was tainted again on the target (the move e2e saw it once the snapshot waited for
Robot's check)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, cast

import pytest

from capi_gpu import domain
from capi_gpu.readiness import targets

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "controllers"))
from fake_kube import NS, FakeKube

PID = f"{domain.PROVIDER_ID_PREFIX}2000001"


def _machine() -> dict[str, Any]:
    return {
        "apiVersion": domain.API_VERSION,
        "kind": "HetznerGPUMachine",
        "metadata": {"name": "dev-gpu-1", "labels": {domain.CLUSTER_NAME_LABEL: "dev"}},
        "spec": {"providerID": PID, "gpu": {"layout": {"preset": "all-balanced"}}},
        "status": {"host": "gex131-2000001"},
    }


def _host(status: dict[str, Any] | None) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": "gex131-2000001"}, "spec": {"serverNumber": 2000001}}
    if status is not None:
        obj["status"] = status
    return obj


@pytest.mark.parametrize(
    ("status", "judged"),
    [
        (None, False),  # created by clusterctl move, never reconciled here
        ({"conditions": [{"type": "Ready", "status": "False", "reason": "StatusSnapshotUnchecked"}]}, False),
        ({"state": "Provisioned", "migDevices": ["1g.24gb", "1g.24gb", "2g.48gb"]}, True),
        ({"state": "Provisioned"}, True),  # a host that reported nothing is judged (and found wanting)
    ],
)
async def test_a_host_without_state_gives_its_node_no_verdict(status: dict[str, Any] | None, judged: bool) -> None:
    kube = FakeKube(("hetznergpumachines", _machine()), ("hetznergpuhosts", _host(status)))
    found = await targets.load(cast(Any, kube), NS, "dev")
    assert (PID in found) is judged
