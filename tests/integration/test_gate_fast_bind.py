"""Gate cases on the real apiserver, kube-scheduler and kube-controller-manager (issue 15):

* a pod on a GPU-ready node binds without waiting in PreBind: the ready node's gate devices carry no
  binding conditions, so kube-scheduler has no 5 s poll to sit out;
* a node that turns not ready takes no new GPU pod (even one tolerating its startup taint), keeps the pod it
  already runs, and a pod that a lagging scheduler allocated from the ready shape of the gate slice is
  evicted (the not-ready shape taints unheld gate devices NoExecute);
* one bad MIG device (an XID) fails only the claim on it: the node stays ready and the pod is placed on
  a healthy device of the same node; only a lost GPU takes the node down.

Pod -> bound latency itself is measured in bench/gate_latency.py, not timed here.
"""

from __future__ import annotations

import copy
import datetime
from typing import Any

import pytest
import test_readiness_gate as rg
from test_readiness_gate import (
    Gates,
    allocation,
    gpu_pod,
    is_,
    node_condition,
    node_name,
    pod_claim,
    pod_events,
    publish_complete,
    ready,
    tainted,
)

from capi_gpu import domain
from capi_gpu.kube import PODS, RESOURCECLAIMS, RESOURCECLAIMTEMPLATES, RESOURCESLICES, Kube
from capi_gpu.readiness import decisions
from capi_gpu_sim.gate_world import HOSTS, GateWorld, GpuNode

pytestmark = pytest.mark.integration
deps, world, gates = rg.deps, rg.world, rg.gates  # the gate fixtures of test_readiness_gate

EVERY_NODE_TAINT = [{"operator": "Exists"}]  # as a DaemonSet-style pod tolerates: only the gate device protects


def gate_taints(kube: Kube, node: str) -> dict[str, str]:
    """Gate device -> its taint effect ("" when bare)."""
    body = kube.get(RESOURCESLICES, decisions.gate_slice_name(node))
    return {d["name"]: ",".join(t["effect"] for t in d.get("taints") or []) for d in body["spec"]["devices"]}


def claim_spec(kube: Kube, namespace: str, *, tolerate_gate: bool = False) -> dict[str, Any]:
    """The shipped mig-1g-24gb claim; ``tolerate_gate`` lets its gate request take a not-ready node's gate
    device (an admin's or a debug claim would): then the binding conditions are what holds it."""
    spec: dict[str, Any] = copy.deepcopy(kube.get(RESOURCECLAIMTEMPLATES, "mig-1g-24gb", namespace)["spec"]["spec"])
    if tolerate_gate:
        for request in spec["devices"]["requests"]:
            if request["name"] == "gate":
                request["exactly"]["tolerations"] = [{"key": domain.GATE_DEVICE_TAINT, "operator": "Exists"}]
    return spec


def claim_pod(kube: Kube, namespace: str, name: str, spec: dict[str, Any], node: str | None = None) -> None:
    """A claim of its own and a pod that tolerates every node taint; bound by hand when ``node`` is given."""
    kube.create(RESOURCECLAIMS, {"metadata": {"name": name}, "spec": spec}, namespace)
    pod_spec: dict[str, Any] = {
        "tolerations": EVERY_NODE_TAINT,
        "containers": [
            {"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "gpu"}]}}
        ],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
    }
    if node is not None:
        pod_spec["nodeName"] = node
    kube.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": pod_spec}, namespace)


def evicting(kube: Kube, namespace: str, pod: str) -> dict[str, Any] | None:
    """The pod's DisruptionTarget condition once kube-controller-manager's device-taint eviction deleted it
    (gracefully: with no kubelet here to confirm, the pod stays, marked for deletion)."""
    body = kube.get_or_none(PODS, pod, namespace)
    if body is None or not body["metadata"].get("deletionTimestamp"):
        return None
    conditions = (body.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "DisruptionTarget"), None)


def make_host_disagree(kube: Kube, world: GateWorld, gpu: GpuNode, gates: Gates) -> None:
    """nvidia-smi on the host no longer shows the layout (HostMismatch): NVIDIA's devices stay published and
    untainted, so only the gate stands between new pods and this node."""
    kube.patch(HOSTS, gpu.host, {"status": {"migDevices": ["1g.24gb"]}}, world.namespace, sub="status")
    gates.deps.wakeups.wake("gate", world.namespace, world.cluster)  # the management side changed


async def test_a_pod_on_a_ready_node_binds_without_waiting_in_prebind(
    kube: Kube, world: GateWorld, gates: Gates
) -> None:
    a = world.add_node()
    publish_complete(a)
    gates.start()
    await ready(gates, kube, a)
    assert set(gate_taints(kube, a.node).values()) == {""}

    gpu_pod(kube, world.namespace, "p")
    bound = await gates.wait("the pod bound", lambda: node_name(kube, world.namespace, "p"), within=30)
    assert bound == a.node
    results = allocation(pod_claim(kube, world.namespace, "p"))
    assert results["gate"]["pool"] == results["mig"]["pool"] == a.node
    assert not results["gate"].get("bindingConditions"), results["gate"]
    assert not pod_events(kube, world.namespace, "p", "BindingConditionsPending"), "waited in PreBind"


async def test_a_node_turning_not_ready_takes_no_new_pod_keeps_its_own_and_evicts_a_stale_one(
    kube: Kube, world: GateWorld, gates: Gates
) -> None:
    ns = world.namespace
    a = world.add_node()
    publish_complete(a)
    gates.start()
    await ready(gates, kube, a)
    gpu_pod(kube, ns, "running")
    await gates.wait("the first pod bound", lambda: node_name(kube, ns, "running"))
    held = allocation(pod_claim(kube, ns, "running"))["gate"]["device"]

    make_host_disagree(kube, world, a, gates)
    await gates.wait(
        "a GPUReady False/HostMismatch", lambda: is_(node_condition(kube, a.node), "False", "HostMismatch")
    )
    await gates.wait("a tainted", lambda: tainted(kube, a.node))
    taints = await gates.wait("the gate devices tainted", lambda: all((t := gate_taints(kube, a.node)).values()) and t)
    assert taints.pop(held) == "NoSchedule", "the running pod's device: placed on a ready GPU, not evicted"
    assert set(taints.values()) == {"NoExecute"}, taints

    # A new pod that tolerates every node taint: the gate device's taint keeps it off the node.
    claim_pod(kube, ns, "new", claim_spec(kube, ns))
    # A pod that a scheduler still seeing the ready (bare) gate slice allocated and bound: nothing vetoes
    # that bind in 1.36, so the unheld device's NoExecute taint has kube-controller-manager evict it.
    free = sorted(taints)[0]
    mig = next(d["name"] for d in a.publisher.devices if "-mig-1g24gb-" in d["name"])
    claim_pod(kube, ns, "stale", claim_spec(kube, ns), node=a.node)
    pod = kube.get(PODS, "stale", ns)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    results = [
        {"request": "mig", "driver": domain.NVIDIA_DRIVER, "pool": a.node, "device": mig},
        {"request": "gate", "driver": domain.GATE_DRIVER, "pool": a.node, "device": free},
    ]
    status = {
        "allocation": {"devices": {"results": results}, "allocationTimestamp": now},
        "reservedFor": [{"resource": "pods", "name": "stale", "uid": pod["metadata"]["uid"]}],
    }
    kube.patch(RESOURCECLAIMS, "stale", {"status": status}, ns, sub="status")
    evicted = await gates.wait("the stale pod evicted", lambda: evicting(kube, ns, "stale"), within=30)
    assert evicted["status"] == "True", evicted

    await gates.hold(
        "the new pod unbound, the running one kept",
        lambda: not node_name(kube, ns, "new") and node_name(kube, ns, "running") == a.node,
        6,  # longer than the scheduler's 5 s binding-condition poll and its retry backoff
    )
    assert evicting(kube, ns, "running") is None, "the pod placed while the node was ready is kept"
    # The namespace goes away in the background: a pending pod that tolerates every node taint would
    # otherwise be scheduled onto the next test's node once that one is ready.
    for pod in ("new", "stale", "running"):
        kube.delete(PODS, pod, ns, grace_period_seconds=0)
    assert not allocation(kube.get(RESOURCECLAIMS, "new", ns)), "allocated on a not-ready node"


async def test_one_bad_device_fails_only_its_claim_and_the_node_serves_on(
    kube: Kube, world: GateWorld, gates: Gates
) -> None:
    ns = world.namespace
    a = world.add_node()
    gates.start()  # no NVIDIA slices yet: the gate publishes the not-ready shape (binding conditions)
    await gates.wait("a GPUReady False/NoSlices", lambda: is_(node_condition(kube, a.node), "False", "NoSlices"))
    await gates.wait("the gate devices tainted", lambda: all(gate_taints(kube, a.node).values()))
    await gates.stop()
    publish_complete(a)  # the plugin comes up while nobody answers: the gate slice still has the old shape

    claim_pod(kube, ns, "p", claim_spec(kube, ns, tolerate_gate=True))
    await gates.wait("BindingConditionsPending", lambda: pod_events(kube, ns, "p", "BindingConditionsPending"))
    first = allocation(kube.get(RESOURCECLAIMS, "p", ns))
    assert first["gate"]["bindingConditions"] == [domain.GATE_BINDING_CONDITION]
    bad = a.publisher.add_xid_taint(first["mig"]["device"], code=79)  # an XID on exactly that MIG device

    gates.start()
    bound = await gates.wait("the pod bound", lambda: node_name(kube, ns, "p"), within=60)
    assert bound == a.node, "the node still serves its healthy devices"
    assert allocation(kube.get(RESOURCECLAIMS, "p", ns))["mig"]["device"] != bad
    failed = pod_events(kube, ns, "p", "FailedScheduling")
    assert any("reason=DeviceTainted" in e.get("message", "") for e in failed), [e["message"] for e in failed]
    assert not tainted(kube, a.node)
    condition = node_condition(kube, a.node)
    assert is_(condition, "True", "Ready") and condition is not None and bad in condition["message"], condition

    a.publisher.mark_gpu_lost()  # the driver's health check: the GPU is gone, every device tainted
    await gates.wait("a tainted", lambda: tainted(kube, a.node))
    await gates.wait(
        "GPUReady False/DeviceTainted", lambda: is_(node_condition(kube, a.node), "False", "DeviceTainted")
    )
