"""The readiness gate on the real apiserver and kube-scheduler: node taint + GPUReady from NVIDIA-format
pools (incomplete, complete, deleted), the CAPI Machine's GPUReady by server-side apply, binding
conditions holding a MIG + gate claim allocated on a not-yet-ready node in PreBind until the gate writes
them (ready nodes, nodes turning not ready and one bad device: test_gate_fast_bind), and an impossible
layout refused by the machine controller before any host is claimed.

The gate runs in-process as the kopf daemon runs it: an asyncio task over a workload client built from
``<cluster>-kubeconfig``. Where a test needs the scheduler to allocate before the gate looks (the window
binding conditions exist for), it stops the gate and starts a fresh one, which must then pick the
claims up from its initial list, as a restarted operator does.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml
from kopf._core.engines import posting  # the contextvars kopf sets for handlers (machine_loop emits Events)

from capi_gpu import domain
from capi_gpu.api.specs import GPUSpec, MigLayout
from capi_gpu.controllers import machine_loop
from capi_gpu.kube import (
    CAPI_CLUSTERS,
    CAPI_MACHINES,
    EVENTS,
    NODES,
    PODS,
    RESOURCECLAIMS,
    RESOURCECLAIMTEMPLATES,
    RESOURCESLICES,
    SECRETS,
    AsyncKube,
    Kube,
)
from capi_gpu.provisioning.ansible import AnsibleRunner
from capi_gpu.readiness import decisions, gate_runner
from capi_gpu.readiness.gate import ClusterGate
from capi_gpu.runtime.deps import Deps, RobotClients
from capi_gpu.runtime.settings import Settings
from capi_gpu_sim.controlplane import ControlPlane
from capi_gpu_sim.dra_publisher import build_devices
from capi_gpu_sim.gate_world import HOSTS, MACHINES, GateWorld, GpuNode

pytestmark = pytest.mark.integration

Check = Callable[[], Any]


class Stopped:
    """kopf's DaemonStopped as the gate reads it: falsy until the daemon is asked to stop."""

    def __init__(self) -> None:
        self.flag = False

    def __bool__(self) -> bool:
        return self.flag


class Gates:
    """Runs gates (or the runner) as tasks on the test's loop; a gate that crashes fails the wait."""

    def __init__(self, deps: Deps, world: GateWorld, kubeconfig: dict[str, Any]) -> None:
        self.deps, self.world, self.kubeconfig = deps, world, kubeconfig
        self.task: asyncio.Task[None] | None = None
        self.gate: ClusterGate | None = None
        self._workload: AsyncKube | None = None

    def start(self) -> ClusterGate:
        assert self.task is None, "one gate at a time"
        self._workload = AsyncKube(Kube.from_kubeconfig_dict(self.kubeconfig), workers=4)
        self.gate = ClusterGate(self.deps, self.world.namespace, self.world.cluster, self._workload)
        self.task = asyncio.create_task(self.gate.run(Stopped()))
        return self.gate

    def start_runner(self, infra_cluster: str | None = None) -> None:
        """The production entry point: the runner finds ``<cluster>-kubeconfig`` and starts the gate; with
        ``infra_cluster``, the gate checks the NVIDIA plugin's pods as that HetznerGPUCluster says."""
        assert self.task is None, "one gate at a time"
        ns, cluster = self.world.namespace, self.world.cluster
        self.task = asyncio.create_task(gate_runner.run(self.deps, ns, cluster, Stopped(), infra_cluster))

    async def pause(self) -> None:
        """Stop the gate's loop and informers, keeping its caches and its client: its last view goes stale."""
        if self.task is not None:
            self.task.cancel()
            results = await asyncio.gather(self.task, return_exceptions=True)
            self.task = None
            if not isinstance(results[0], asyncio.CancelledError | None):
                raise results[0]

    async def stop(self) -> None:
        await self.pause()
        if self._workload is not None:
            self._workload.close()
            self._workload = None

    async def wait(self, what: str, check: Check, within: float = 30.0) -> Any:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.task is not None and self.task.done():
                raise AssertionError(f"the gate ended while waiting for {what}") from self.task.exception()
            value = await asyncio.to_thread(check)
            if value:
                return value
            await asyncio.sleep(0.2)
        raise AssertionError(f"timed out after {within:.0f}s waiting for {what}")

    async def hold(self, what: str, check: Check, seconds: float) -> None:
        """``check`` stays true for ``seconds``."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            assert await asyncio.to_thread(check), f"{what} stopped holding"
            await asyncio.sleep(0.5)


@pytest.fixture
def deps(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Deps]:
    kube = AsyncKube(control_plane.kube(), workers=4)
    settings = Settings()
    yield Deps(kube, settings, AnsibleRunner(artifacts_root=tmp_path), RobotClients(settings))
    kube.close()


@pytest.fixture
def world(kube: Kube, namespace: str) -> Iterator[GateWorld]:
    w = GateWorld(kube, namespace).setup()
    yield w
    w.close()


@pytest.fixture
async def gates(control_plane: ControlPlane, kube: Kube, deps: Deps, world: GateWorld) -> AsyncIterator[Gates]:
    control_plane.write_workload_kubeconfig(world.cluster, world.namespace)
    secret = kube.get(SECRETS, f"{world.cluster}-kubeconfig", world.namespace)
    g = Gates(deps, world, yaml.safe_load(base64.b64decode(secret["data"]["value"])))
    try:
        yield g
    finally:
        await g.stop()


# -- reading the three layers ------------------------------------------------------------------------


def tainted(kube: Kube, node: str) -> bool:
    taints = kube.get(NODES, node)["spec"].get("taints") or []
    return any(t["key"] == domain.NODE_STARTUP_TAINT for t in taints)


def node_condition(kube: Kube, node: str) -> dict[str, Any] | None:
    conditions = (kube.get(NODES, node).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == domain.GPU_READY_CONDITION), None)


def machine_condition(kube: Kube, namespace: str, machine: str) -> dict[str, Any] | None:
    conditions = (kube.get(CAPI_MACHINES, machine, namespace).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == domain.GPU_READY_CONDITION), None)


def is_(condition: dict[str, Any] | None, status: str, reason: str) -> bool:
    return condition is not None and (condition["status"], condition["reason"]) == (status, reason)


def gate_device_tainted(kube: Kube, node: str) -> bool | None:
    """Whether our gate slice for ``node`` taints its device; None while there is no gate slice."""
    gate = kube.get_or_none(RESOURCESLICES, decisions.gate_slice_name(node))
    if gate is None:
        return None
    return bool(gate["spec"]["devices"][0].get("taints"))


def publish_complete(gpu: GpuNode) -> None:
    gpu.publisher.start()


def gpu_pod(kube: Kube, namespace: str, name: str, template: str = "mig-1g-24gb") -> None:
    kube.create(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "containers": [
                    {"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "gpu"}]}}
                ],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            },
        },
        namespace,
    )


def pod_claim(kube: Kube, namespace: str, pod: str) -> dict[str, Any] | None:
    statuses = (kube.get(PODS, pod, namespace).get("status") or {}).get("resourceClaimStatuses") or []
    name = next((s.get("resourceClaimName") for s in statuses if s.get("name") == "gpu"), None)
    return kube.get_or_none(RESOURCECLAIMS, name, namespace) if name else None


def allocation(claim: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Allocation results by request name (``mig``, ``gate``); empty while unallocated."""
    results = (((claim or {}).get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
    return {r["request"]: r for r in results}


def gate_status(claim: dict[str, Any] | None) -> dict[str, str]:
    """The gate device's conditions on the claim: type -> status."""
    for entry in ((claim or {}).get("status") or {}).get("devices") or []:
        if entry.get("driver") == domain.GATE_DRIVER:
            return {c["type"]: c["status"] for c in entry.get("conditions") or []}
    return {}


def node_name(kube: Kube, namespace: str, pod: str) -> str | None:
    name: str | None = kube.get(PODS, pod, namespace)["spec"].get("nodeName")
    return name


def pod_events(kube: Kube, namespace: str, pod: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in kube.list(EVENTS, namespace) if e.get("reason") == reason and e["involvedObject"]["name"] == pod]


async def ready(gates: Gates, kube: Kube, gpu: GpuNode) -> None:
    await gates.wait(f"{gpu.node} untainted", lambda: not tainted(kube, gpu.node))
    await gates.wait(f"{gpu.node} gate device untainted", lambda: gate_device_tainted(kube, gpu.node) is False)


# -- 1. node and Machine layers ------------------------------------------------------------------------


async def test_incomplete_pool_keeps_node_tainted_until_complete(kube: Kube, world: GateWorld, gates: Gates) -> None:
    a = world.add_node()
    a.publisher.devices = build_devices(*a.publisher.reader())
    a.publisher.publish_incomplete()  # generation 1 announces 2 slices and publishes one
    gates.start_runner()

    cond = await gates.wait("GPUReady False/PoolIncomplete", lambda: node_condition(kube, a.node))
    assert is_(cond, "False", "PoolIncomplete"), cond
    assert "1 of 2 slices" in cond["message"]
    assert tainted(kube, a.node)
    assert await gates.wait("a tainted gate device", lambda: gate_device_tainted(kube, a.node))
    machine = await gates.wait(
        "Machine GPUReady False", lambda: machine_condition(kube, world.namespace, a.machine), within=30
    )
    assert is_(machine, "False", "PoolIncomplete"), machine

    publish_complete(a)  # the plugin republishes: generation 2, one slice of one
    await gates.wait("the startup taint lifted", lambda: not tainted(kube, a.node))
    assert is_(node_condition(kube, a.node), "True", "Ready")
    await gates.wait(
        "Machine GPUReady True",
        lambda: is_(machine_condition(kube, world.namespace, a.machine), "True", "Ready"),
    )
    await gates.wait("the gate device untainted", lambda: gate_device_tainted(kube, a.node) is False)
    # CAPI's own status writes on the Machine keep our condition (it is ours by server-side apply).
    await gates.hold(
        "Machine GPUReady True", lambda: is_(machine_condition(kube, world.namespace, a.machine), "True", "Ready"), 3
    )


async def test_deleting_the_driver_slice_retaints_the_node(kube: Kube, world: GateWorld, gates: Gates) -> None:
    a = world.add_node()
    publish_complete(a)
    gate = gates.start()
    await ready(gates, kube, a)
    assert len(gate.latencies) == 1, "one untaint, timed from the informer seeing the slice"

    a.publisher.stop()  # the NVIDIA plugin went away and its slices with it
    await gates.wait("the startup taint back", lambda: tainted(kube, a.node))
    # On a loss the taint is written before the condition (scheduling is protected first), so the
    # condition may land a round trip later.
    await gates.wait("GPUReady False/NoSlices", lambda: is_(node_condition(kube, a.node), "False", "NoSlices"))
    await gates.wait(
        "Machine GPUReady False/NoSlices",
        lambda: is_(machine_condition(kube, world.namespace, a.machine), "False", "NoSlices"),
    )
    await gates.wait("the gate device tainted", lambda: gate_device_tainted(kube, a.node))
    # Node events (kubelet heartbeats in production) re-evaluate the node but must not rewrite the slice.
    generation = kube.get(RESOURCESLICES, decisions.gate_slice_name(a.node))["spec"]["pool"]["generation"]
    for beat in range(3):
        kube.patch(NODES, a.node, {"metadata": {"labels": {"sim.example.com/beat": str(beat)}}})
    await gates.hold(
        "the gate slice generation",
        lambda: kube.get(RESOURCESLICES, decisions.gate_slice_name(a.node))["spec"]["pool"]["generation"] == generation,
        2,
    )


async def test_a_node_deleted_while_it_is_decided_gets_no_more_writes(
    kube: Kube, world: GateWorld, gates: Gates
) -> None:
    a = world.add_node()
    publish_complete(a)
    gate = gates.start()
    await ready(gates, kube, a)
    await gates.pause()
    slice_before = kube.get(RESOURCESLICES, decisions.gate_slice_name(a.node))
    machine_before = machine_condition(kube, world.namespace, a.machine)
    # The gate decides from a view in which the node still exists and its driver's slices are gone (a verdict
    # that needs writes), while the apiserver has already deleted the node.
    tgts = await gate._gpu_targets(force=True)
    for name in [n for n, s in gate.slices.items() if s["spec"]["driver"] != domain.GATE_DRIVER]:
        del gate.slices[name]
    kube.delete(NODES, a.node)
    await gates.wait("the node gone", lambda: kube.get_or_none(NODES, a.node) is None)
    assert await gate._evaluate_node(a.node, tgts) is False
    assert a.node not in gate.nodes and a.node not in gate.verdicts
    assert a.node not in gate._node_retry, "a failed write to retry, not a node that is gone"
    after = kube.get_or_none(RESOURCESLICES, decisions.gate_slice_name(a.node))
    assert after is None or after["metadata"]["resourceVersion"] == slice_before["metadata"]["resourceVersion"]
    assert machine_condition(kube, world.namespace, a.machine) == machine_before


# -- 2. and 3. the claim layer with the real scheduler ---------------------------------------------------


async def test_pod_waits_in_prebind_until_the_gate_writes_the_condition(
    kube: Kube, world: GateWorld, gates: Gates
) -> None:
    a = world.add_node()
    gates.start()  # no NVIDIA slices yet: the gate publishes the not-ready shape, binding conditions on
    await gates.wait("a GPUReady False/NoSlices", lambda: is_(node_condition(kube, a.node), "False", "NoSlices"))
    await gates.wait("a tainted gate device", lambda: gate_device_tainted(kube, a.node))
    await gates.stop()  # the plugin comes up while nobody answers for the gate device
    publish_complete(a)

    # A claim that tolerates the gate device's taint and a pod that tolerates the node's: only the binding
    # conditions hold it now (the shipped templates tolerate nothing and are never allocated here).
    spec = kube.get(RESOURCECLAIMTEMPLATES, "mig-1g-24gb", world.namespace)["spec"]["spec"]
    for request in spec["devices"]["requests"]:
        if request["name"] == "gate":
            request["exactly"]["tolerations"] = [{"key": domain.GATE_DEVICE_TAINT, "operator": "Exists"}]
    kube.create(RESOURCECLAIMS, {"metadata": {"name": "c"}, "spec": spec}, world.namespace)
    kube.create(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p"},
            "spec": {
                "tolerations": [{"operator": "Exists"}],
                "containers": [
                    {"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "gpu"}]}}
                ],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}],
            },
        },
        world.namespace,
    )
    await gates.wait(
        "BindingConditionsPending", lambda: pod_events(kube, world.namespace, "p", "BindingConditionsPending")
    )
    claim = kube.get(RESOURCECLAIMS, "c", world.namespace)
    results = allocation(claim)
    assert results["mig"]["pool"] == results["gate"]["pool"] == a.node
    assert results["mig"]["device"].startswith("gpu-0-mig-1g24gb-")
    assert results["gate"]["bindingConditions"] == [domain.GATE_BINDING_CONDITION]
    # Longer than the scheduler's 5 s poll: without our condition the pod stays unbound.
    await gates.hold(
        "the pod unbound and the claim unanswered",
        lambda: (
            not node_name(kube, world.namespace, "p")
            and not gate_status(kube.get(RESOURCECLAIMS, "c", world.namespace))
        ),
        6,
    )

    gate = gates.start()  # a fresh gate finds the waiting claim in its initial list
    bound = await gates.wait("the pod bound", lambda: node_name(kube, world.namespace, "p"), within=30)
    assert bound == a.node
    assert len(gate.claim_latencies) == 1
    conditions = gate_status(kube.get(RESOURCECLAIMS, "c", world.namespace))
    assert conditions == {domain.GATE_BINDING_CONDITION: "True", domain.GATE_FAILURE_CONDITION: "False"}


# -- 5. the layout is refused before a host is touched ----------------------------------------------------


@contextlib.contextmanager
def kopf_context() -> Iterator[asyncio.Queue[posting.K8sEvent]]:
    """What kopf sets around a handler, so ``events.emit`` queues instead of failing; yields the queue."""
    queue: asyncio.Queue[posting.K8sEvent] = asyncio.Queue()
    tokens = (
        posting.settings_var.set(kopf.OperatorSettings()),
        posting.event_queue_var.set(queue),
        posting.event_queue_loop_var.set(asyncio.get_running_loop()),
    )
    try:
        yield queue
    finally:
        posting.event_queue_loop_var.reset(tokens[2])
        posting.event_queue_var.reset(tokens[1])
        posting.settings_var.reset(tokens[0])


def machine_conditions(kube: Kube, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    conditions = (kube.get(MACHINES, name, namespace).get("status") or {}).get("conditions") or []
    return {c["type"]: c for c in conditions}


async def test_impossible_layout_is_refused_before_any_host_is_claimed(
    kube: Kube, world: GateWorld, gates: Gates, deps: Deps
) -> None:
    world.create_host("spare", 424242)  # Available, inspected RTX PRO 6000: claimable
    impossible = GPUSpec(layout=MigLayout(profiles={"2g.48gb": 1, "1g.24gb": 3}))
    world.create_machine("gpu-0", impossible)
    await gates.wait(
        "Cluster infrastructure provisioned",
        lambda: (
            (kube.get(CAPI_CLUSTERS, world.cluster, world.namespace).get("status") or {})
            .get("initialization", {})
            .get("infrastructureProvisioned")
        ),
    )

    with kopf_context() as emitted:
        await machine_loop.reconcile(deps, world.namespace, "gpu-0")
        host = kube.get(HOSTS, "spare", world.namespace)
        assert not host["spec"].get("consumerRef"), host["spec"]
        layout = machine_conditions(kube, world.namespace, "gpu-0")["LayoutValid"]
        assert (layout["status"], layout["reason"]) == ("False", "ImpossibleLayout")
        assert "needs 5 memory slices, the GPU has 4" in layout["message"]
        assert "Nearest valid layouts: 1g.24gb=2,2g.48gb=1" in layout["message"]
        notes = [emitted.get_nowait() for _ in range(emitted.qsize())]
        assert any(e.reason == "ImpossibleLayout" and "no host is claimed" in e.message for e in notes)

        # The same machine with one of the suggested layouts claims the host: the refusal was the layout's.
        possible = GPUSpec(layout=MigLayout(profiles={"2g.48gb": 1, "1g.24gb": 2}))
        kube.patch(MACHINES, "gpu-0", {"spec": {"gpu": possible.wire()}}, world.namespace)
        await machine_loop.reconcile(deps, world.namespace, "gpu-0")
    consumer = kube.get(HOSTS, "spare", world.namespace)["spec"].get("consumerRef") or {}
    assert consumer.get("name") == "gpu-0"
    assert machine_conditions(kube, world.namespace, "gpu-0")["LayoutValid"]["status"] == "True"
