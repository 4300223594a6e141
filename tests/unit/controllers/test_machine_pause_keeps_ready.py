"""A paused HetznerGPUMachine writes nothing but its Paused condition: its Ready condition stays as it was.
Found by the real `clusterctl move` (e2e/flow/test_clusterctl_move.py): the source's machines, paused by
clusterctl, turned Ready=False (reason Paused) before they were deleted."""

from __future__ import annotations

from typing import Any

import pytest

from capi_gpu.api import conditions as c
from capi_gpu.api.machine import HetznerGPUMachine
from capi_gpu.controllers.machine_loop import Scope, _ready

NOW = "2026-12-03T22:00:00Z"


def machine(ready: tuple[str, str, str] | None, provisioned: bool = True) -> Scope:
    conds: list[dict[str, Any]] = []
    if ready is not None:
        status, reason, message = ready
        conds.append(
            {"type": "Ready", "status": status, "reason": reason, "message": message, "lastTransitionTime": NOW}
        )
    obj = {
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "HetznerGPUMachine",
        "metadata": {"name": "m", "namespace": "gpu", "generation": 1},
        "spec": {},
        "status": {"conditions": conds, "initialization": {"provisioned": provisioned}},
    }
    return Scope(obj, HetznerGPUMachine.model_validate(obj), "gpu", "m")


@pytest.mark.parametrize(
    ("ready", "paused", "expected"),
    [
        (("True", "Ready", "provisioned"), True, (True, "Ready", "provisioned")),  # kept, not flipped
        (("False", "HostNotReady", "host Configure"), True, (False, "HostNotReady", "host Configure")),
        (None, True, (False, c.Reason.PAUSED, "paused")),  # nothing to keep (created by move, no status)
        (("True", "Ready", "provisioned"), False, (True, "Ready", "provisioned")),
    ],
)
def test_ready_while_paused(ready: tuple[str, str, str] | None, paused: bool, expected: tuple[bool, str, str]) -> None:
    s = machine(ready)
    if paused:
        s.cond(c.Type.PAUSED, True, c.Reason.PAUSED, "Cluster or machine is paused")
    assert _ready(s) == expected
