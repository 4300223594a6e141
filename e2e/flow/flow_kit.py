"""What the happy-path whole-flow tests read and wait for, so each test states only its scenario.

Every wait is bounded and, when it runs out, dumps the world (Events, statuses) and names the dump and
the operator logs in the failure, which is where a post-mortem starts. ``provisioned``/``scaled_to_zero``
are idempotent, so a test can be run alone (``-k``) and still finds the state it needs.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from capi_gpu import domain
from capi_gpu.gpu import catalog, layout, migparted, nvidia_smi
from capi_gpu.kube import (
    CAPI_MACHINEDEPLOYMENTS,
    CAPI_MACHINES,
    EVENTS,
    NODES,
    PODS,
    RESOURCECLAIMS,
    RESOURCESLICES,
    ours,
)
from capi_gpu_sim import devflow
from capi_gpu_sim.hosts.host import Host
from capi_gpu_sim.world import World

T = TypeVar("T")
HOSTS = ours("hetznergpuhosts")
GPU_MACHINES = ours("hetznergpumachines")
TEMPLATES = ours("hetznergpumachinetemplates")
REMEDIATIONS = ours("hetznergpuremediations")
MODEL = catalog.builtin_catalog().model("2bb5")
MD_NAME = "dev-gpu"
PROVISION_TIMEOUT_S = 420.0  # three cold hosts on a shared 2-core machine took ~100 s


class FlowTimeout(AssertionError):
    pass


def where(world: World) -> str:
    dump = world.dump()
    logs = sorted(str(p) for p in world.config.state_dir.glob("operator-*.log"))
    return f"dump: {dump}; operator logs: {', '.join(logs)}"


def wait(world: World, what: str, fn: Callable[[], T | None], timeout: float, interval: float = 0.5) -> T:
    """Poll ``fn`` until it returns something truthy; on timeout fail with the post-mortem's paths."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if world.operator is not None and world.operator.poll() is not None:
            raise FlowTimeout(
                f"the operator exited ({world.operator.returncode}) while waiting for {what}; {where(world)}"
            )
        if time.monotonic() > deadline:
            raise FlowTimeout(f"timed out after {timeout:.0f}s waiting for {what}; {where(world)}")
        time.sleep(interval)


# -- reading the world ----------------------------------------------------------------------------------


def ns(world: World) -> str:
    return world.config.namespace


def expected_layout(world: World) -> Counter[str]:
    return Counter(dict(migparted.resolve(MODEL, world.config.layout).counts))


def expected_device_names(world: World) -> set[str]:
    return {d.name for d in layout.expected_devices(MODEL, migparted.resolve(MODEL, world.config.layout))}


def hosts(world: World) -> dict[str, dict[str, Any]]:
    return {h["metadata"]["name"]: h for h in world.hosts()}


def host_state(h: dict[str, Any]) -> str:
    return str((h.get("status") or {}).get("state", ""))


def sim_host(world: World, server_number: int) -> Host:
    assert world.fleet is not None
    return world.fleet.hosts[server_number]


def machines(world: World) -> list[dict[str, Any]]:
    return [
        m
        for m in world.k.list(CAPI_MACHINES, ns(world))
        if (m["metadata"].get("labels") or {}).get(domain.CAPI_DEPLOYMENT_NAME_LABEL) == MD_NAME
    ]


def gpu_nodes(world: World) -> list[dict[str, Any]]:
    """The workload's Nodes: every Node but the management node the pod runner registers (release worlds)."""
    return world.k.list(NODES, label_selector="!node-role.kubernetes.io/control-plane")


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    conds = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c.get("type") == type_), None)


def is_true(obj: dict[str, Any] | None, type_: str) -> bool:
    cond = condition(obj, type_)
    return cond is not None and cond.get("status") == "True"


def startup_tainted(node: dict[str, Any]) -> bool:
    return any(t.get("key") == domain.NODE_STARTUP_TAINT for t in node["spec"].get("taints") or [])


def creation_time(obj: dict[str, Any]) -> dt.datetime:
    return dt.datetime.fromisoformat(obj["metadata"]["creationTimestamp"].replace("Z", "+00:00"))


def mig_instances(host: Host) -> list[nvidia_smi.GpuInstanceRow]:
    """The GPU shim's instances, as ``nvidia-smi mig -lgi`` prints them (exit 6: none)."""
    res = host.exec(["nvidia-smi", "mig", "-lgi"], timeout=30)
    text = res.stdout.decode(errors="replace")
    if res.returncode == 6:
        return []
    assert res.returncode == 0, f"{host.name}: nvidia-smi mig -lgi exited {res.returncode}: {text}"
    return nvidia_smi.parse_lgi(text)


def mig_uuids(host: Host) -> set[str]:
    res = host.exec(["nvidia-smi", "-L"], timeout=30)
    assert res.returncode == 0, f"{host.name}: nvidia-smi -L exited {res.returncode}"
    return set(re.findall(r"UUID: (MIG-[^)]+)", res.stdout.decode(errors="replace")))


def nvidia_slices(world: World, node: str) -> list[dict[str, Any]]:
    return [
        s
        for s in world.k.list(RESOURCESLICES, field_selector=f"spec.nodeName={node}")
        if s["spec"]["driver"] == domain.NVIDIA_DRIVER
    ]


def published_devices(world: World, node: str) -> dict[str, dict[str, Any]]:
    """The devices of the node's newest NVIDIA pool generation, by name."""
    slices = nvidia_slices(world, node)
    if not slices:
        return {}
    top = max(s["spec"]["pool"]["generation"] for s in slices)
    return {d["name"]: d for s in slices if s["spec"]["pool"]["generation"] == top for d in s["spec"]["devices"]}


def robot_posts(world: World, prefix: str, since: int = 0) -> list[str]:
    """Paths of Robot POSTs under ``prefix`` (``/reset/<n>``, ``/boot/<n>/rescue``) after log index ``since``."""
    assert world.robot is not None
    return [e.path for e in world.robot.log[since:] if e.method == "POST" and e.path.startswith(prefix)]


def robot_refusals(world: World) -> list[str]:
    assert world.robot is not None
    return [f"{e.method} {e.path} {e.status} {e.code}" for e in world.robot.log if e.status in (401, 403)]


def host_events(world: World, host: str) -> list[str]:
    return [
        f"{e.get('reason')}: {e.get('message')}"
        for e in world.k.list(EVENTS, ns(world))
        if e["involvedObject"].get("kind") == "HetznerGPUHost" and e["involvedObject"].get("name") == host
    ]


# -- pods and claims ------------------------------------------------------------------------------------


def submit(world: World, name: str, template: str) -> None:
    world.k.create(PODS, devflow.claim_pod(name, template), ns(world))


def pod_node(world: World, name: str) -> str | None:
    node: str | None = (world.k.get(PODS, name, ns(world)).get("spec") or {}).get("nodeName")
    return node


def pod_claim(world: World, pod: str) -> dict[str, Any] | None:
    statuses = (world.k.get(PODS, pod, ns(world)).get("status") or {}).get("resourceClaimStatuses") or []
    name = next((s.get("resourceClaimName") for s in statuses if s.get("name") == "mig"), None)
    return world.k.get_or_none(RESOURCECLAIMS, name, ns(world)) if name else None


def allocation(claim: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Allocation results by request (``mig`` or ``mig/<subrequest>``, ``gate``); empty while unallocated."""
    results = (((claim or {}).get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
    return {r["request"]: r for r in results}


def gate_conditions(claim: dict[str, Any] | None) -> dict[str, str]:
    for entry in ((claim or {}).get("status") or {}).get("devices") or []:
        if entry.get("driver") == domain.GATE_DRIVER:
            return {c["type"]: c["status"] for c in entry.get("conditions") or []}
    return {}


def pod_event_reasons(world: World, pod: str) -> set[str]:
    return {
        str(e.get("reason"))
        for e in world.k.list(EVENTS, ns(world))
        if e["involvedObject"].get("kind") == "Pod" and e["involvedObject"].get("name") == pod
    }


def unschedulable(world: World, pod: str) -> bool:
    cond = condition(world.k.get(PODS, pod, ns(world)), "PodScheduled")
    return cond is not None and cond.get("status") == "False" and cond.get("reason") == "Unschedulable"


@dataclass(frozen=True)
class Bound:
    pod: str
    node: str
    request: str  # "mig" or "mig/<subrequest>" for a prioritized list
    device: str
    pool: str
    gate_device: str
    gate_pool: str
    gate_conditions: dict[str, str]
    gate_binding_conditions: tuple[str, ...] = ()


def bound(world: World, pod: str, timeout: float = 120.0) -> Bound:
    """Wait until ``pod`` is bound and its gate condition written; return what it was given."""
    node = wait(world, f"pod {pod} bound", lambda: pod_node(world, pod), timeout)
    claim = pod_claim(world, pod)
    results = allocation(claim)
    mig = [r for k, r in results.items() if k == "mig" or k.startswith("mig/")]
    assert len(mig) == 1 and "gate" in results, f"{pod}: allocation {results}; {where(world)}"
    ((request, result),) = [(k, r) for k, r in results.items() if k == "mig" or k.startswith("mig/")]
    gate = results["gate"]
    return Bound(
        pod,
        node,
        request,
        result["device"],
        result["pool"],
        gate["device"],
        gate["pool"],
        gate_conditions(claim),
        tuple(gate.get("bindingConditions") or ()),
    )


def check_bound(world: World, b: Bound, profile: str) -> None:
    """Both devices from the pod's node and a published untainted device of ``profile``. The shipped
    templates are only ever allocated a GPU-ready node's bare gate device (a not-ready node's is tainted),
    so the pod bound without waiting in PreBind and nobody wrote a condition (issue 15: no 5 s poll)."""
    slug = profile.replace(".", "")
    assert b.pool == b.node == b.gate_pool, b
    assert b.device in expected_device_names(world) and f"-mig-{slug}-" in b.device, b
    assert b.gate_device.startswith(f"{domain.GATE_DEVICE_NAME}-"), b
    assert not b.gate_binding_conditions and not b.gate_conditions, b
    device = published_devices(world, b.node).get(b.device)
    assert device is not None and not device.get("taints"), f"{b.device} is not a free published device: {device}"
    assert "BindingConditionsPending" not in pod_event_reasons(world, b.pod), f"{b.pod} waited in PreBind"


def delete_pods(world: World) -> None:
    """Force-delete the test's pods: the simulated kubelet runs no containers, so nothing would confirm a
    graceful deletion (and CAPI's drain would wait for it)."""
    for pod in world.k.list(PODS, ns(world)):
        world.k.delete(PODS, pod["metadata"]["name"], ns(world), grace_period_seconds=0)
    wait(world, "the test pods gone", lambda: not world.k.list(PODS, ns(world)), 60)


# -- scaling ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuNode:
    machine: dict[str, Any]
    gpu_machine: dict[str, Any]
    node: dict[str, Any]
    host: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.node["metadata"]["name"])

    @property
    def server_number(self) -> int:
        return int(self.host["spec"]["serverNumber"])


def ready_nodes(world: World) -> list[GpuNode] | None:
    """The MachineDeployment's Machines, when each has a nodeRef to an untainted GPUReady Node and its own
    GPUReady True; None while any is not there yet."""
    out = []
    for m in machines(world):
        ref = ((m.get("status") or {}).get("nodeRef") or {}).get("name")
        node = world.k.get_or_none(NODES, ref) if ref else None
        if node is None or startup_tainted(node) or not is_true(node, domain.GPU_READY_CONDITION):
            return None
        if not is_true(m, domain.GPU_READY_CONDITION):
            return None
        infra = m["spec"]["infrastructureRef"]["name"]
        hgm = world.k.get_or_none(GPU_MACHINES, infra, ns(world))
        host_name = ((hgm or {}).get("metadata", {}).get("annotations") or {}).get(domain.ANNOTATION_HOST)
        host = world.k.get_or_none(HOSTS, host_name, ns(world)) if host_name else None
        if hgm is None or host is None:
            return None
        out.append(GpuNode(m, hgm, node, host))
    return out


def provisioned(world: World, replicas: int, timeout: float = PROVISION_TIMEOUT_S) -> list[GpuNode]:
    """Scale the GPU MachineDeployment to ``replicas`` (if it isn't) and wait until all are gated ready."""
    md = world.k.get(CAPI_MACHINEDEPLOYMENTS, MD_NAME, ns(world))
    if md["spec"].get("replicas") != replicas:
        world.scale(replicas)

    def done() -> list[GpuNode] | None:
        got = ready_nodes(world)
        return got if got is not None and len(got) == replicas and len(machines(world)) == replicas else None

    return wait(world, f"{replicas} GPU Machines with gated-ready Nodes", done, timeout, interval=1.0)


def scaled_to_zero(world: World, timeout: float = 180.0) -> None:
    """Delete the test pods, scale to 0, wait until Machines and Nodes are gone and no host is consumed."""
    delete_pods(world)
    world.scale(0)
    wait(world, "no GPU Machines", lambda: not machines(world), timeout, interval=1.0)
    wait(world, "no Nodes", lambda: not gpu_nodes(world), timeout)
    wait(
        world,
        "every host back in the pool (Available or Standby, no consumer)",
        lambda: all(
            host_state(h) in ("Available", "Standby") and not h["spec"].get("consumerRef") for h in world.hosts()
        ),
        timeout,
    )


def wait_available(world: World, count: int, timeout: float = 180.0) -> dict[str, dict[str, Any]]:
    """``count`` hosts Available and labelled: the labels are a second write after the status one."""

    def labelled(h: dict[str, Any]) -> bool:
        return domain.LABEL_GPU_PRESENT in (h["metadata"].get("labels") or {})

    def done() -> dict[str, dict[str, Any]] | None:
        hs = hosts(world)
        return hs if sum(host_state(h) == "Available" and labelled(h) for h in hs.values()) == count else None

    return wait(world, f"{count} hosts Available and labelled", done, timeout)


def layout_counts(rows: Iterable[nvidia_smi.GpuInstanceRow]) -> Counter[str]:
    return Counter(r.profile for r in rows)
