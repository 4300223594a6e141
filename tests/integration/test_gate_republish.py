"""Gate cases on the real apiserver: the gate puts its ResourceSlice back at once when it is deleted (the
kubelet deletes a node's slices when it starts and 30 s after a plugin goes away), driven by the slice
watch, well before the gate's 30 s resync, also when the simulated kubelet's own start-up wipe deletes it; and a node whose MIG instances NVML placed elsewhere than the
plan predicted (so the driver's device names differ) still becomes ready; a migMode Dynamic machine (a node
nothing could ever untaint) is refused before any host is claimed."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import time
from typing import Any, cast

import pytest
import test_readiness_gate as rg
from test_readiness_gate import Gates, is_, kopf_context, machine_conditions, node_condition, publish_complete, ready

from capi_gpu import domain
from capi_gpu.api.specs import GPUSpec, MigMode
from capi_gpu.controllers import machine_loop
from capi_gpu.kube import CAPI_CLUSTERS, RESOURCESLICES, Kube
from capi_gpu.readiness import decisions, gate
from capi_gpu.runtime.deps import Deps
from capi_gpu_sim.gate_world import HOSTS, GateWorld
from capi_gpu_sim.hosts.targets import Running, State
from capi_gpu_sim.kubelet import JOIN_RECORD, SimKubelet

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


class JoinedHost:
    """Just what SimKubelet reads of a simulated host: up in its installed OS, one boot, joined as ``node``.
    No kubelet unit, and the test's own publisher stands in for the NVIDIA plugin (``publish_dra=False``)."""

    def __init__(self, node: str, server: int) -> None:
        self.name, self.server_number, self.node = node, server, node
        self.state, self.running = State.UP, Running.INSTALLED
        self.guest_ip, self.boot_id = "127.0.0.1", "boot-1"

    def boot_count(self) -> int:
        return 1

    def read_file(self, path: str) -> bytes | None:
        join = {"nodeName": self.node, "joinedAt": "2026-12-03T22:00:00Z"}
        return json.dumps(join).encode() if path == JOIN_RECORD else None

    def exec(self, argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess[bytes]:
        return subprocess.CompletedProcess(argv, 0, b"LoadState=not-found\n", b"")


async def test_the_kubelet_wipes_the_nodes_slices_at_its_start_and_the_gate_republishes_at_once(
    kube: Kube, world: GateWorld, gates: Gates
) -> None:
    a = world.add_node()
    publish_complete(a)
    gates.start()
    await ready(gates, kube, a)
    name = decisions.gate_slice_name(a.node)
    before = kube.get(RESOURCESLICES, name)["metadata"]["uid"]
    host = cast(Any, JoinedHost(a.node, a.server))
    kubelet = SimKubelet(host, kube, poll_s=0.05, heartbeat_s=3600, publish_dra=False).start()
    try:
        assert await gates.wait("the kubelet's start-up wipe", lambda: kubelet.wiped == 1)
        started = time.monotonic()
        await gates.wait(
            "the gate slice republished",
            lambda: (s := kube.get_or_none(RESOURCESLICES, name)) is not None and s["metadata"]["uid"] != before,
            within=gate.RESYNC / 3,
        )
        took = time.monotonic() - started
    finally:
        kubelet.stop(delete_node=False)
    assert took < 5.0, f"republished after {took:.1f}s: the resync, not the watch"
    assert kubelet.errors == [], kubelet.errors
    nvidia = [s for s in kube.list(RESOURCESLICES) if s["spec"].get("nodeName") == a.node]
    assert [s["spec"]["driver"] for s in nvidia] == [domain.GATE_DRIVER], "the NVIDIA slices went too"
    await gates.wait("a tainted until its plugin republishes", lambda: rg.tainted(kube, a.node))


async def test_a_node_whose_instances_sit_elsewhere_than_predicted_becomes_ready(
    kube: Kube, world: GateWorld, gates: Gates
) -> None:
    a = world.add_node()
    gpu, migs = a.publisher.reader()
    predicted = {m.profile: m.placement_start for m in migs}
    assert predicted == {"2g.48gb": 0, "1g.24gb": 9}, predicted  # all-balanced as the plan places it
    # What NVML may choose instead for the same instances: both 1g first, the 2g last.
    moved = [
        dataclasses.replace(m, placement_start=start)
        for m, start in zip(
            sorted(migs, key=lambda m: (m.profile != "1g.24gb", m.placement_start)), (0, 3, 6), strict=True
        )
    ]
    a.publisher.reader = lambda: (gpu, moved)
    publish_complete(a)
    names = {
        d["name"]
        for s in kube.list(RESOURCESLICES)
        if s["spec"].get("nodeName") == a.node
        for d in s["spec"]["devices"]
        if s["spec"]["driver"] == "gpu.nvidia.com"
    }
    assert "gpu-0-mig-2g48gb-5-6" in names and "gpu-0-mig-2g48gb-5-0" not in names, names
    gates.start()
    await ready(gates, kube, a)
    assert is_(node_condition(kube, a.node), "True", "Ready")


async def test_a_dynamic_mig_machine_is_refused_before_any_host_is_claimed(
    kube: Kube, world: GateWorld, deps: Deps
) -> None:
    world.create_host("spare", 434343)  # Available, inspected RTX PRO 6000: claimable
    world.create_machine("gpu-dyn", GPUSpec(mig_mode=MigMode.DYNAMIC))
    for _ in range(100):  # bounded: CAPI mirrors the HetznerGPUCluster's provisioned into the Cluster
        cluster = kube.get(CAPI_CLUSTERS, world.cluster, world.namespace)
        if (cluster.get("status") or {}).get("initialization", {}).get("infrastructureProvisioned"):
            break
        await asyncio.sleep(0.3)
    with kopf_context() as emitted:
        await machine_loop.reconcile(deps, world.namespace, "gpu-dyn")
        notes = [emitted.get_nowait() for _ in range(emitted.qsize())]
    assert not kube.get(HOSTS, "spare", world.namespace)["spec"].get("consumerRef")
    layout = machine_conditions(kube, world.namespace, "gpu-dyn")["LayoutValid"]
    assert (layout["status"], layout["reason"]) == ("False", "DynamicMIGUnsupported"), layout
    assert "use migMode Static" in layout["message"]
    assert any(e.reason == "DynamicMIGUnsupported" and "no host is claimed" in e.message for e in notes)
