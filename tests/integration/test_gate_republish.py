"""The gate puts its ResourceSlice back at once when it is deleted (the kubelet deletes a node's slices when
it starts and 30 s after a plugin goes away), driven by the slice watch, well before the gate's 30 s resync,
on the real apiserver."""

from __future__ import annotations

import time

import pytest
import test_readiness_gate as rg
from test_readiness_gate import Gates, publish_complete, ready

from capi_gpu.kube import RESOURCESLICES, Kube
from capi_gpu.readiness import decisions, gate
from capi_gpu.sim.gate_world import GateWorld

pytestmark = pytest.mark.integration
deps, world, gates = rg.deps, rg.world, rg.gates  # the gate fixtures of test_readiness_gate


async def test_a_deleted_gate_slice_is_republished_at_once(kube: Kube, world: GateWorld, gates: Gates) -> None:
    a = world.add_node()
    publish_complete(a)
    gates.start()
    await ready(gates, kube, a)
    name = decisions.gate_slice_name(a.node)
    before = kube.get(RESOURCESLICES, name)
    kube.delete(RESOURCESLICES, name)  # as the kubelet does at its start
    started = time.monotonic()
    back = await gates.wait(
        "the gate slice republished",
        lambda: (
            (s := kube.get_or_none(RESOURCESLICES, name)) is not None
            and s["metadata"]["uid"] != before["metadata"]["uid"]
        ),
        within=gate.RESYNC / 3,
    )
    took = time.monotonic() - started
    assert back
    assert took < 5.0, f"republished after {took:.1f}s: the resync, not the watch"
    again = kube.get(RESOURCESLICES, name)
    assert again["spec"]["devices"] and not any(d.get("taints") for d in again["spec"]["devices"])
