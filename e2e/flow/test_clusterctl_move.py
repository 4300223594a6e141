"""The real `clusterctl move`, there and back, never touches a server it should not, nor repeats a step.

Two management clusters share one Robot simulator and one simulated fleet: the world (source) and a second
control plane with CAPI core and our operator under the shipped RBAC (move_kit.Target). When the move
starts, the source holds a cluster with 2 Provisioned GPU workers serving a bound 1g.24gb claim, a third
worker's host caught mid-provisioning (Install or Configure), a standby host being prepared for the
template's pool and held mid-Configure (its Ansible run outlasts the move: the target waits for the
source's run and adopts its outcome, and the server's run marker shows Ansible ran there once), 1 Available
host, the template's MachineHealthCheck and the Secrets it references (the unowned ones labelled for move,
as docs/clusterctl.md says). clusterctl's provider inventory on both sides
is created the way `clusterctl init` would create it (cert-manager cannot run here); the move itself is the
pinned clusterctl binary, both ways. On the target the caught host finishes provisioning and the pool's
host its preparation; then the target scales the MachineDeployment up by one: it claims the standby host,
the node becomes GPU-ready, and the template refills its pool with the Available host, which the move back
catches mid-preparation.

Counted from the simulators' own logs across both moves: Robot resets and rescue activations (the Robot
simulator's request log), boots and boots into rescue, installimage runs (each simulated host's records),
SSH sessions (each host's sshd log). The workers: none of any. The hosts in motion: one install each.
Sampled every half second throughout: each worker node's GPUReady and startup taint, the claim pod's node,
and on both management clusters any change to one of our objects, or to a Machine, MachineSet or
MachineDeployment, while its Cluster is paused, attributed to its writer by the apiserver's audit log.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import flow_kit as fk
import pytest
from fault_kit import activations, resets
from move_kit import Target, clusterctl_move, label_for_move

from capi_gpu import domain
from capi_gpu.kube import (
    CAPI_CLUSTERS,
    CAPI_MACHINEDEPLOYMENTS,
    CAPI_MACHINES,
    CAPI_MACHINESETS,
    CAPI_MHCS,
    EVENTS,
    NODES,
    PODS,
    Kube,
    ours,
)
from capi_gpu.provisioning import handover
from capi_gpu_sim import audit, controlplane_object
from capi_gpu_sim.controlplane import ControlPlane
from capi_gpu_sim.hosts.host import Running
from capi_gpu_sim.identity import SA_NAME, SA_NAMESPACE
from capi_gpu_sim.world import World

POD = "moved-claim"
OUR_MOVED = ("hetznergpuhosts", "hetznergpumachines", "hetznergpuclusters", "hetznergpuremediations")
# CAPI's kinds the operator writes in the normal course (the gate's Machine condition, the claim scaler's
# MachineDeployment replicas): watched too, so none of those writes lands on a paused source.
WATCHED = tuple((ours(p), p) for p in OUR_MOVED) + tuple(
    (r, r.plural) for r in (CAPI_MACHINES, CAPI_MACHINESETS, CAPI_MACHINEDEPLOYMENTS)
)
REMEDIATION_TEMPLATES = ours("hetznergpuremediationtemplates")
OPERATOR_USER = f"system:serviceaccount:{SA_NAMESPACE}:{SA_NAME}"  # both sides run it under the shipped RBAC


def _ssh_sessions(host: Any) -> int:
    total = 0
    for boot in sorted((host.state_dir / "boots").glob("*/console.log")):
        total += boot.read_text(errors="replace").count("Accepted publickey")
    return total


# What clusterctl itself changes on the objects it moves, and what deletion does: never the operator's.
MOVE_KEYS = ("resourceVersion", "managedFields", "finalizers", "deletionTimestamp", "deletionGracePeriodSeconds")
MOVE_ANNOTATIONS = (domain.DELETE_FOR_MOVE_ANNOTATION, domain.PAUSED_ANNOTATION)


def _settled(obj: dict[str, Any]) -> dict[str, Any]:
    """The object less what a move may change without the operator acting: clusterctl's marks, the
    finalizer release that lets deletion finish, and the Paused condition (CAPI's contract: a paused object
    says so)."""
    meta = {k: v for k, v in obj["metadata"].items() if k not in MOVE_KEYS}
    meta["annotations"] = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in MOVE_ANNOTATIONS}
    status = dict(obj.get("status") or {})
    status["conditions"] = [c for c in status.get("conditions") or [] if c.get("type") != "Paused"]
    return {**obj, "metadata": meta, "status": status}


@dataclass
class Change:
    """A change seen on a paused object: between the sample that froze it (``since``) and the one that saw it;
    ``blocked`` when the object carried block-move before or after (a step finishing, as the contract lets)."""

    plural: str
    name: str
    since: float
    seen: float
    paused_at: float
    blocked: bool
    diff: str


# A pass that read the Cluster unpaused may still land its writes a moment after the pause (CAPI's own
# controllers do the same); later than this, a write by the operator is a write to a paused object.
IN_FLIGHT_S = 5.0


def _blocked(view: dict[str, Any]) -> bool:
    return domain.BLOCK_MOVE_ANNOTATION in (view["metadata"].get("annotations") or {})


class PausedWrites:
    """On one management cluster: every object of ours that existed while its Cluster was unpaused, as it was
    when the pause was first seen; any later change beyond ``_settled``'s allowance is recorded with its time
    window and attributed afterwards from the apiserver's audit log (``attributed``). Only a write by the
    operator's identity is the operator's: CAPI's MachineSet controller server-side-applies labels and
    annotations to InfraMachines, and clusterctl v1.14's delete-for-move mark is a JSON patch that adds
    ``/metadata/annotations`` whole, so every other annotation of a source object goes with it (CI saw
    kopf's marker and cloned-from-groupkind vanish from paused objects; the audit named clusterctl)."""

    def __init__(self, kube: Kube, cp: ControlPlane, namespace: str, cluster: str) -> None:
        self.kube, self.cp, self.ns, self.cluster = kube, cp, namespace, cluster
        self.frozen: dict[str, dict[str, Any]] = {}  # uid -> settled view at the pause
        self.since: dict[str, float] = {}  # uid -> when the sample that read the frozen view began
        self.paused_at: float | None = None  # when the first sample that saw the pause began
        self.changes: list[Change] = []

    def sample(self) -> None:
        began = time.time()
        obj = self.kube.get_or_none(CAPI_CLUSTERS, self.cluster, self.ns)
        paused = obj is not None and bool(obj["spec"].get("paused"))
        self.paused_at = (self.paused_at or began) if paused else None
        for res, plural in WATCHED:
            for item in self.kube.list(res, self.ns):
                uid, view = item["metadata"]["uid"], _settled(item)
                if not paused:
                    self.frozen.pop(uid, None)
                    self.frozen[uid + "?"] = view  # seen unpaused: watched from the next pause on
                elif uid + "?" in self.frozen:
                    # From the first sample that sees the pause: a write already in flight when clusterctl
                    # paused may land just before it, as with any controller.
                    if uid not in self.frozen:
                        self.frozen[uid], self.since[uid] = view, began
                    elif view != self.frozen[uid]:
                        was = self.frozen[uid]
                        assert self.paused_at is not None
                        self.changes.append(
                            Change(
                                plural,
                                item["metadata"]["name"],
                                self.since[uid],
                                time.time(),
                                self.paused_at,
                                _blocked(was) or _blocked(view),
                                _diff(was, view),
                            )
                        )
                        self.frozen[uid], self.since[uid] = view, began

    def writers(self, change: Change) -> list[audit.Write]:
        return [
            w
            for w in self.cp.audit_writes()
            if w.resource.split("/")[0] == change.plural
            and (w.namespace, w.name) == (self.ns, change.name)
            # A write's ResponseComplete is stamped after it commits: a list may see it a little earlier.
            and change.since <= w.at <= change.seen + 2.0
        ]

    def attributed(self) -> dict[str, list[str]]:
        """The changes to paused objects by kind of writer: "operator" (a write to a paused object: the
        operator's, later than IN_FLIGHT_S after the pause and not under block-move, or nobody found),
        "finishing" (the operator's, in flight at the pause or finishing a step under block-move),
        "others" (CAPI, clusterctl)."""
        out: dict[str, list[str]] = {"operator": [], "finishing": [], "others": []}
        for change in self.changes:
            who = self.writers(change)
            mine = [w for w in who if w.user == OPERATOR_USER]
            # Once clusterctl deleted the object, the operator's one write is releasing its finalizer so the
            # delete finishes (_settled ignores finalizers): in CI that patch landed 0.1 s after clusterctl's
            # delete and its annotation-replacing mark, in the same sample, and took the blame for them.
            deleted = min((w.at for w in who if w.verb == "delete" and w.user != OPERATOR_USER), default=None)
            late = [w for w in mine if w.at > change.paused_at + IN_FLIGHT_S and (deleted is None or w.at < deleted)]
            kind = "operator" if not who or (late and not change.blocked) else "finishing" if mine else "others"
            writers = sorted({(w.user, w.agent, w.verb, w.resource, round(w.at - change.paused_at, 1)) for w in who})
            out[kind].append(f"{self.kube.host} {change.plural}/{change.name}: {change.diff} by {writers}")
        return out


def _diff(a: dict[str, Any], b: dict[str, Any], path: str = "") -> str:
    keys = sorted(set(a) | set(b))
    for k in keys:
        if a.get(k) != b.get(k):
            if isinstance(a.get(k), dict) and isinstance(b.get(k), dict):
                return _diff(a[k], b[k], f"{path}.{k}")
            if k == "conditions":
                before = {x["type"]: x for x in a.get(k) or []}
                after = {x["type"]: x for x in b.get(k) or []}
                changed = [t for t in sorted(set(before) | set(after)) if before.get(t) != after.get(t)]
                return f"{path}.conditions: " + "; ".join(f"{before.get(t)} -> {after.get(t)}" for t in changed)
            return f"{path}.{k}: {str(a.get(k))[:200]} -> {str(b.get(k))[:200]}"
    return path


class Watch:
    """Samples every half second while the moves run: on the workload side what must never change (nodes
    GPUReady and untainted, the pod bound), on both management clusters writes to paused objects."""

    def __init__(self, world: World, nodes: list[str], target_kube: Kube, target_cp: ControlPlane) -> None:
        self.kube = world.cp.kube()
        self.ns = world.config.namespace
        self.nodes = nodes
        self.management = [
            PausedWrites(self.kube, world.cp, self.ns, world.config.cluster),
            PausedWrites(target_kube, target_cp, self.ns, world.config.cluster),
        ]
        self.bad: list[str] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Watch:
        for side in self.management:  # the baseline before clusterctl pauses anything (it does at once)
            side.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.kube.close()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.samples += 1
            for name in self.nodes:
                node = self.kube.get_or_none(NODES, name)
                if node is None:
                    self.bad.append(f"node {name} gone")
                elif fk.startup_tainted(node):
                    self.bad.append(f"node {name}: startup taint back")
                elif not fk.is_true(node, domain.GPU_READY_CONDITION):
                    self.bad.append(f"node {name}: GPUReady not True")
            pod = self.kube.get_or_none(PODS, POD, self.ns)
            if pod is None or not (pod.get("spec") or {}).get("nodeName"):
                self.bad.append(f"pod {POD} unbound")
            for side in self.management:
                side.sample()

    def paused_writes(self) -> dict[str, list[str]]:
        """PausedWrites.attributed, both sides together."""
        found = [side.attributed() for side in self.management]
        return {kind: [w for side in found for w in side[kind]] for kind in ("operator", "finishing", "others")}


def _adopted(kube: Kube, world: World, numbers: list[int]) -> bool:
    """On ``kube``'s management cluster: each host Provisioned, its HetznerGPUMachine provisioned, the CAPI
    Machine's nodeRef set (CAPI reads the nodes through the moved <cluster>-kubeconfig)."""
    ns = world.config.namespace
    for n in numbers:
        host = kube.get_or_none(fk.HOSTS, f"gex131-{n}", ns)
        if host is None or (host.get("status") or {}).get("state") != "Provisioned":
            return False
    machines = kube.list(CAPI_MACHINES, ns)
    if len(machines) != len(numbers):
        return False
    for m in machines:
        if not ((m.get("status") or {}).get("nodeRef") or {}).get("name"):
            return False
        infra = kube.get_or_none(fk.GPU_MACHINES, m["spec"]["infrastructureRef"]["name"], ns)
        if not (((infra or {}).get("status") or {}).get("initialization") or {}).get("provisioned"):
            return False
    return True


def _new_worker_ready(kube: Kube, world: World, number: int) -> bool:
    """On ``kube``'s management cluster: host ``number`` Provisioned, its Machine's nodeRef set and GPUReady,
    its Node (in the workload cluster) GPUReady without the startup taint."""
    ns = world.config.namespace
    host = kube.get_or_none(fk.HOSTS, f"gex131-{number}", ns)
    if ((host or {}).get("status") or {}).get("state") != "Provisioned":
        return False
    pid = f"{domain.PROVIDER_ID_PREFIX}{number}"
    node = next((x for x in world.k.list(NODES) if x["spec"].get("providerID") == pid), None)
    if node is None or fk.startup_tainted(node) or not fk.is_true(node, domain.GPU_READY_CONDITION):
        return False
    machine = next((m for m in kube.list(CAPI_MACHINES, ns) if m["spec"].get("providerID") == pid), None)
    return bool(machine and fk.is_true(machine, domain.GPU_READY_CONDITION) and machine["status"].get("nodeRef"))


def _after_move(kube: Kube, world: World, cp: Any) -> None:
    """What the control-plane provider would do on its side: clusterctl creates objects without status,
    and the sim's stand-in control plane has no controller to report itself initialized again."""
    cfg = world.config
    fk.wait(
        world,
        "the SimControlPlane moved",
        lambda: kube.get_or_none(controlplane_object.RES, cfg.cluster, cfg.namespace),
        60,
    )
    controlplane_object.mark_initialized(kube, cfg.cluster, cfg.namespace, cfg.kubernetes_version)


@pytest.fixture(scope="module")
def move_world(world_factory: Callable[..., World]) -> World:
    return world_factory(hosts=5, release=True)


@pytest.fixture
def target(move_world: World, tmp_path: Path) -> Iterator[Target]:
    t = Target(move_world, tmp_path / "target").start()
    yield t
    t.stop()


MIDWAY = (("Provisioning", "Install"), ("Provisioning", "Configure"), ("StandbyPreparing", "Install"), ("StandbyPreparing", "Configure"))  # fmt: skip


def _step(kube: Kube, world: World, number: int) -> tuple[str | None, str | None]:
    status = (kube.get_or_none(fk.HOSTS, f"gex131-{number}", world.config.namespace) or {}).get("status") or {}
    return status.get("state"), status.get("step")


def _claimed(kube: Kube, world: World, among: set[int]) -> int | None:
    for n in sorted(among):
        host = kube.get_or_none(fk.HOSTS, f"gex131-{n}", world.config.namespace) or {}
        if (host.get("spec") or {}).get("consumerRef"):
            return n
    return None


def _standby(kube: Kube, world: World, among: set[int], state: str | None = None) -> int | None:
    for n in sorted(among):
        host = kube.get_or_none(fk.HOSTS, f"gex131-{n}", world.config.namespace) or {}
        spec = host.get("spec") or {}
        if spec.get("standby") and not spec.get("consumerRef") and state in (None, fk.host_state(host)):
            return n
    return None


def _remediation(kube: Kube, ns: str, machine: str, phase: str | None = None) -> dict[str, Any] | None:
    """The HetznerGPURemediation MachineHealthCheck created for ``machine`` (in ``phase``, any when None)."""
    for rem in kube.list(fk.REMEDIATIONS, ns):
        owned = any(o.get("name") == machine for o in rem["metadata"].get("ownerReferences") or [])
        if owned and phase in (None, (rem.get("status") or {}).get("phase")):
            return rem
    return None


class _LastSeen:
    """The last version of one remediation (by name) that carried a status, polled every 0.25 s in a thread
    of its own (its own client) until ``stop``, at most 10 minutes."""

    def __init__(self, kube: Kube, ns: str, machine: str, name: str) -> None:
        self.kube, self.ns, self.machine, self.name = kube, ns, machine, name
        self.last: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="moved-remediation", daemon=True)

    def start(self) -> _LastSeen:
        self._thread.start()
        return self

    def _run(self) -> None:
        deadline = time.monotonic() + 600
        while not self._stop.wait(0.25) and time.monotonic() < deadline:
            try:
                rem = _remediation(self.kube, self.ns, self.machine)
            except Exception:  # the target's apiserver may be briefly busy: the next poll reads again
                continue
            if rem is not None and rem["metadata"]["name"] == self.name and rem.get("status"):
                self.last = rem

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.kube.close()


def _remediated_event(kube: Kube, ns: str, rem: str) -> bool:
    return any(
        e.get("reason") == "Remediated" and e["involvedObject"].get("name") == rem for e in kube.list(EVENTS, ns)
    )


def _marker(host: Any, state: str | None = None) -> handover.Marker | None:
    """The server's Configure run marker (``handover.MARKER``), if it is in ``state`` (any when None)."""
    raw = host.read_file(handover.MARKER)
    found = handover.parse(raw.decode() if raw else None)
    return found if found is not None and state in (None, found.state.value) else None


def _deferred_configure(kube: Kube, world: World, number: int) -> bool:
    """On ``kube``'s side, host ``number`` recorded a Configure it deferred (it found another's run going)."""
    host = kube.get_or_none(fk.HOSTS, f"gex131-{number}", world.config.namespace) or {}
    ops = (host.get("status") or {}).get("operations") or []
    return any(op.get("name") == "configure" and op.get("outcome") == "Deferred" for op in ops)


def _all_ready(kube: Kube, world: World, numbers: list[int]) -> bool:
    """Every one of ``numbers`` adopted (no other Machine) and GPU-ready."""
    return _adopted(kube, world, numbers) and all(_new_worker_ready(kube, world, n) for n in numbers)


def test_clusterctl_move_there_and_back_never_touches_a_server(
    move_world: World, target: Target, tmp_path: Path
) -> None:
    world = move_world
    assert world.fleet is not None and world.robot is not None
    ns, started = world.config.namespace, time.monotonic()
    gpu = fk.provisioned(world, 2)
    workers = sorted(g.server_number for g in gpu)
    fk.submit(world, POD, "mig-1g-24gb")
    bound = fk.bound(world, POD)
    others = set(world.fleet.hosts) - set(workers)
    fk.wait_available(world, 3)
    # The sim's static bootstrap Secret stands in for CABPK's (owned by a KubeadmConfig, moved with it); its
    # name has no purpose suffix clusterctl knows, so it needs the move label like the other unowned ones.
    label_for_move(world.k, ns, ["robot-credentials", "robot-ssh", f"{world.config.cluster}-gpu-bootstrap"])
    hosts = {n: world.fleet.host(n) for n in world.fleet.hosts}
    before = {n: (h.boot_count(), h.boot_id, _ssh_sessions(h), len(h.installimage_runs())) for n, h in hosts.items()}
    robot_from = len(world.robot.log)
    claim_before = fk.allocation(fk.pod_claim(world, POD))

    # A scale-up caught mid-provisioning: the real clusterctl refuses to move while a Machine has no nodeRef
    # (checkProvisioningCompleted), before it pauses or marks anything; the host provisions on untouched.
    world.scale(3)
    mid = fk.wait(world, "a third host claimed", lambda: _claimed(world.k, world, others), 60)
    fk.wait(world, "the claimed host in Install or Configure", lambda: _step(world.k, world, mid) in MIDWAY, 300)
    caught = {mid: _step(world.k, world, mid)}
    refusal, _ = clusterctl_move(world.cp.kubeconfig, target.cp.kubeconfig, ns, tmp_path / "cc", refused=True)
    assert "is still provisioning the node" in refusal, refusal
    assert not world.k.get(CAPI_CLUSTERS, world.config.cluster, ns)["spec"].get("paused"), refusal
    assert target.kube.get_or_none(CAPI_CLUSTERS, world.config.cluster, ns) is None
    fk.wait(world, "the third worker GPU-ready", lambda: _all_ready(world.k, world, [*workers, mid]), 480)
    # A standby pool of one: its host is caught mid-preparation (Install or Configure, no Machine, so
    # clusterctl moves it), paused there and finished on the target.
    world.k.patch(fk.TEMPLATES, fk.MD_NAME, {"spec": {"standby": {"size": 1}}}, ns)
    pool = fk.wait(world, "a standby host chosen", lambda: _standby(world.k, world, others - {mid}), 60)
    (spare,) = others - {mid, pool}
    # Held mid-Configure (the GPU shim's hold stands in for a DKMS build that outlasts clusterctl's ~6 min
    # block-move wait): Configure holds no block-move, the move goes on at once, and the server's run marker
    # hands the run over: the target waits for it, then adopts its outcome instead of running it again.
    fk.wait(world, "the pool's host in Configure", lambda: _step(world.k, world, pool)[1] == "Configure", 300)
    hold = hosts[pool].guest_path("/var/lib/gpu-shim/hold")
    hold.write_text("held by test_clusterctl_move\n")
    held_run = fk.wait(world, "the pool's Ansible run marked as running", lambda: _marker(hosts[pool], "running"), 120)
    caught[pool] = _step(world.k, world, pool)
    # A remediation in flight at the move: the worker that does not serve the pod loses its GPU until its next
    # boot; the source's MachineHealthCheck (5 s) and remediation reset it, and the move comes while it
    # reboots. Its status snapshot tells the target to wait for that reset, not to send another or replace the
    # Machine. The remediation template (moved by its CRD's label) has no cooldown here, so a second loss on
    # the target is remediated there by the target's MachineHealthCheck.
    victim = next(g for g in gpu if g.name != bound.node)
    # Templates are immutable: a new one without cooldown, and the MachineHealthCheck pointed at it.
    template = world.k.get(REMEDIATION_TEMPLATES, fk.MD_NAME, ns)
    template["spec"]["template"]["spec"]["strategy"]["cooldownSeconds"] = 0
    meta = {"name": f"{fk.MD_NAME}-no-cooldown", "namespace": ns}
    world.k.create(REMEDIATION_TEMPLATES, {**template, "metadata": meta}, ns)
    mhc_spec = world.k.get(CAPI_MHCS, fk.MD_NAME, ns)["spec"]
    ref = {**mhc_spec["remediation"]["templateRef"], "name": meta["name"]}
    short = [{"type": domain.GPU_READY_CONDITION, "status": "False", "timeoutSeconds": 5}]
    fast = {"checks": {"unhealthyMachineConditions": short}, "remediation": {"templateRef": ref}}
    world.k.patch(CAPI_MHCS, fk.MD_NAME, {"spec": fast}, ns)
    victim_machine = str(victim.machine["metadata"]["name"])
    hosts[victim.server_number].gpu_fall_off_bus(until_reboot=True)
    in_flight = fk.wait(world, "the source's reset sent", lambda: _remediation(world.k, ns, victim_machine, "Waiting"), 120)  # fmt: skip
    serving = [n for n in workers if n != victim.server_number] + [mid]  # nothing may touch these servers
    at_move = {n: (hosts[n].boot_count(), hosts[n].boot_id, _ssh_sessions(hosts[n])) for n in serving}
    robot_at_move = len(world.robot.log)
    log_from = len(world.operator_logs())
    ready_at = time.monotonic()

    with Watch(world, [bound.node], Kube.from_kubeconfig(str(target.cp.kubeconfig)), target.cp) as watch:
        out, took_there = clusterctl_move(world.cp.kubeconfig, target.cp.kubeconfig, ns, tmp_path / "cc")
        # The moved remediation's status as the target has it, sampled from now on: on a slow machine it can be
        # restored, finished and deleted by the MachineHealthCheck while the waits below still run.
        rem_name = str(in_flight["metadata"]["name"])
        moved_rem = _LastSeen(Kube.from_kubeconfig(str(target.cp.kubeconfig)), ns, victim_machine, rem_name).start()
        assert world.k.get_or_none(CAPI_CLUSTERS, world.config.cluster, ns) is None, out
        assert "Move blocked" not in out and _marker(hosts[pool], "running") == held_run, (out, _marker(hosts[pool]))
        _after_move(target.kube, world, target.cp)
        fk.wait(world, "the target waiting on the held run", lambda: _deferred_configure(target.kube, world, pool), 120)  # fmt: skip
        held_for = time.monotonic() - ready_at
        hold.unlink()
        fk.wait(world, "the target adopted the workers", lambda: _all_ready(target.kube, world, [*workers, mid]), 240)
        fk.wait(world, "the pool's host Standby on the target", lambda: _standby(target.kube, world, {pool}, "Standby"), 300)  # fmt: skip
        fk.wait(world, "the target finishing the moved remediation", lambda: _remediated_event(target.kube, ns, rem_name), 120)  # fmt: skip
        moved_rem.stop()
        # A loss on the target: its MachineHealthCheck remediates through the moved template.
        fk.wait(world, "the finished remediation removed", lambda: _remediation(target.kube, ns, victim_machine) is None, 120)  # fmt: skip
        hosts[victim.server_number].gpu_fall_off_bus(until_reboot=True)
        second = fk.wait(world, "the target's own remediation", lambda: _remediation(target.kube, ns, victim_machine), 120)  # fmt: skip
        fk.wait(world, "the target's remediation done", lambda: _remediated_event(target.kube, ns, second["metadata"]["name"]), 180)  # fmt: skip
        fk.wait(world, "the victim GPU-ready again", lambda: _all_ready(target.kube, world, [*workers, mid]), 180)
        there = time.monotonic()
        sessions_there = {n: _ssh_sessions(hosts[n]) - at_move[n][2] for n in serving}
        # Scale up by one on the target: its operator claims the standby host (one bootstrap), the gate there
        # makes the new node GPU-ready, and the template refills its pool with the spare, which the move back
        # then catches mid-preparation.
        target.kube.patch(CAPI_MACHINEDEPLOYMENTS, fk.MD_NAME, {"spec": {"replicas": 4}}, ns)
        fk.wait(
            world,
            "the target's new worker GPU-ready",
            lambda: _all_ready(target.kube, world, [*workers, mid, pool]),
            480,
        )
        fk.wait(
            world, "the spare being prepared", lambda: _step(target.kube, world, spare)[0] == "StandbyPreparing", 60
        )
        scaled = time.monotonic()
        caught[spare] = _step(target.kube, world, spare)
        out_back, took_back = clusterctl_move(target.cp.kubeconfig, world.cp.kubeconfig, ns, tmp_path / "cc")
        assert target.kube.get_or_none(CAPI_CLUSTERS, world.config.cluster, ns) is None, out_back
        _after_move(world.k, world, world.cp)
        fk.wait(world, "the source adopted all four", lambda: _all_ready(world.k, world, [*workers, mid, pool]), 240)
        fk.wait(world, "the spare Standby on the source", lambda: _standby(world.k, world, {spare}, "Standby"), 300)
        back = time.monotonic()

    # The serving workers from the first move on; the hosts in motion from before the scale-up.
    since = {n: (at_move[n][0], robot_at_move, at_move[n][2], 0) if n in serving else (before[n][0], robot_from, before[n][2], before[n][3]) for n in hosts}  # fmt: skip
    figures = {
        n: {
            "resets": len(resets(world, n, since[n][1])),
            "rescue activations": len(activations(world, n, since[n][1])),
            "reboots": h.boot_count() - since[n][0],
            "rescue boots (installimage)": sum(1 for b in h.boots[since[n][0] :] if b.running is Running.RESCUE),
            "installimage runs": [r["event"] for r in h.installimage_runs()[before[n][3] :]],
            "ssh sessions": _ssh_sessions(h) - since[n][2],
        }
        for n, h in hosts.items()
    }
    print(f"\nmove figures: {figures}; caught mid-way: {caught}; clusterctl move there {took_there:.1f}s, "
          f"back {took_back:.1f}s; adopted there (with the caught host GPU-ready, the pool Standby) after "
          f"{there - ready_at:.1f}s, scale-up on the target {scaled - there:.1f}s, back after {back - scaled:.1f}s; "
          f"whole test {time.monotonic() - started:.1f}s; {watch.samples} samples; "
          f"paused objects watched: {[len([k for k in m.frozen if not k.endswith('?')]) for m in watch.management]}")  # fmt: skip
    for n in serving:
        f = figures[n]
        assert (f["resets"], f["rescue activations"], f["reboots"], f["rescue boots (installimage)"]) == (0, 0, 0, 0), (
            n,
            f,
        )
        # One adoption probe per move at most.
        assert sessions_there[n] <= 1 and f["ssh sessions"] - sessions_there[n] <= 1, (n, f, sessions_there)
        assert hosts[n].boot_id == at_move[n][1]
    # The hosts in motion: each installed exactly once over the whole test (the refused move's caught
    # host's provisioning, the pool's preparation, the spare's refill), one rescue each, nothing repeated on
    # either side of a move.
    # An Available host waits in the rescue system its inspection booted, so its provisioning is one
    # installimage and one reboot into the OS (a rescue boot first, with its activation and reset, only if
    # it had left rescue).
    for n in (mid, pool, spare):
        h = hosts[n]
        rescue = sum(1 for b in h.boots[before[n][0] :] if b.running is Running.RESCUE)
        f = {
            "installimage runs": [r["event"] for r in h.installimage_runs()[before[n][3] :]],
            "rescue activations": len(activations(world, n, robot_from)),
            "resets": len(resets(world, n, robot_from)),
            "rescue boots": rescue,
            "reboots": h.boot_count() - before[n][0],
        }
        assert f["installimage runs"] == ["start", "end"], (n, f)
        assert rescue <= 1 and (f["rescue activations"], f["resets"], f["reboots"]) == (rescue, rescue, 1 + rescue), (
            n,
            f,
        )
    # The held run: the source's, finished and adopted on the target; the target never ran Ansible there (any
    # run of its own would have marked the server first, with its own run id and uid).
    assert held_run is not None
    assert _marker(hosts[pool], "done") == dataclasses.replace(held_run, state=handover.RunState.DONE, message="Succeeded"), _marker(hosts[pool])  # fmt: skip
    print(f"held Configure across the move: {held_for:.1f}s after the move began, clusterctl took {took_there:.1f}s")
    # The remediated worker: one reset from the source before the move, one from the target after it; the
    # moved remediation finished on the target from its snapshot (Waiting, 1 reset) and the Machine is the
    # same one (a replacement would be a new Machine, a new host, a new install).
    n = victim.server_number
    assert len(resets(world, n, robot_from)) == 2, resets(world, n, robot_from)
    assert (moved_rem.last.get("status") or {}).get("retryCount") == 1, moved_rem.last
    assert len(hosts[n].installimage_runs()) == before[n][3], "remediated in place, never reinstalled"
    final = {m["metadata"]["name"] for m in world.k.list(CAPI_MACHINES, ns)}
    assert victim_machine in final, final
    checks, remediation = mhc_spec["checks"]["unhealthyMachineConditions"], mhc_spec["remediation"]
    world.k.patch(CAPI_MHCS, fk.MD_NAME, {"spec": {"checks": {"unhealthyMachineConditions": checks}, "remediation": remediation}}, ns)  # fmt: skip
    assert not watch.bad, watch.bad[:20]
    writes = watch.paused_writes()
    for kind, found in writes.items():
        for write in found:
            print(f"paused write ({kind}): {write[:3000]}")
    operators = writes["operator"]
    # Hosts included: a claimed host finds its pause through the Cluster recorded at the claim, a standby
    # host through its template's, so one whose machine or template clusterctl already deleted stays silent
    # instead of writing Ready=False ConsumerMissing. A change the audit log can't attribute counts as the
    # operator's.
    assert not operators, operators[:20]
    watched = [sorted(k for k in m.frozen if not k.endswith("?")) for m in watch.management]
    assert all(len(w) >= 3 for w in watched), watched
    assert watch.samples > 10
    assert fk.pod_node(world, POD) == bound.node
    assert fk.allocation(fk.pod_claim(world, POD)) == claim_before
    steps = ("activate-rescue", "reset-sw", "reset-hw", "reset-ssh", "installimage", "kubeadm-reset")
    # From the first move on, only the hosts in motion had destructive steps, on either side.
    moving = tuple(f"host {ns}/gex131-{n}:" for n in (pool, spare))
    logs = world.operator_logs()[log_from:] + target.operator_log()
    assert not [ln for ln in logs.splitlines() if any(s in ln for s in steps) and not any(m in ln for m in moving)], logs[-3000:]  # fmt: skip
