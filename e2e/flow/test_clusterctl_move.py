"""The real `clusterctl move`, there and back, never touches a server.

Two management clusters share one Robot simulator and one simulated fleet: the world (source) and a second
control plane with CAPI core and our operator under the shipped RBAC (move_kit.Target). The source holds a
cluster with 2 Provisioned GPU workers serving a bound 1g.24gb claim, 1 Available host, the template's
MachineHealthCheck and the Secrets it references (the unowned ones labelled for move, as docs/clusterctl.md
says). clusterctl's provider inventory on both sides is created the way `clusterctl init` would create it
(cert-manager cannot run here); the move itself is the pinned clusterctl binary, both ways.

Counted from the simulators' own logs across both moves: Robot resets and rescue activations (the Robot
simulator's request log), boots and boots into rescue, where alone installimage can run (each simulated
host's boot records), SSH sessions (each host's sshd log). Sampled every half second throughout: each
node's GPUReady and startup taint, the claim pod's node.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import flow_kit as fk
import pytest
from fault_kit import activations, resets
from move_kit import Target, clusterctl_move, label_for_move

from capi_gpu import domain
from capi_gpu.kube import CAPI_CLUSTERS, CAPI_MACHINES, NODES, PODS, Kube
from capi_gpu.sim import controlplane_object
from capi_gpu.sim.hosts.host import Running
from capi_gpu.sim.world import World

POD = "moved-claim"
OUR_MOVED = ("hetznergpuhosts", "hetznergpumachines", "hetznergpuclusters")


def _ssh_sessions(host: Any) -> int:
    total = 0
    for boot in sorted((host.state_dir / "boots").glob("*/console.log")):
        total += boot.read_text(errors="replace").count("Accepted publickey")
    return total


class Watch:
    """Samples the workload side every half second while the moves run: what must never change."""

    def __init__(self, world: World, nodes: list[str]) -> None:
        self.kube = world.cp.kube()
        self.ns = world.config.namespace
        self.nodes = nodes
        self.bad: list[str] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Watch:
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
    return world_factory(hosts=3, operator_rbac=True)


@pytest.fixture
def target(move_world: World, tmp_path: Path) -> Iterator[Target]:
    t = Target(move_world, tmp_path / "target").start()
    yield t
    t.stop()


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
    (spare,) = set(world.fleet.hosts) - set(workers)
    fk.wait(
        world, "the third host Available", lambda: fk.host_state(fk.hosts(world)[f"gex131-{spare}"]) == "Available", 180
    )
    label_for_move(world.k, ns, ["robot-credentials", "robot-ssh"])
    hosts = {n: world.fleet.host(n) for n in world.fleet.hosts}
    before = {n: (h.boot_count(), h.boot_id, _ssh_sessions(h)) for n, h in hosts.items()}
    robot_from = len(world.robot.log)
    claim_before = fk.allocation(fk.pod_claim(world, POD))
    log_from = len(world.operator_logs())
    ready_at = time.monotonic()

    with Watch(world, [g.name for g in gpu]) as watch:
        out, took_there = clusterctl_move(world.cp.kubeconfig, target.cp.kubeconfig, ns, tmp_path / "cc")
        assert world.k.get_or_none(CAPI_CLUSTERS, world.config.cluster, ns) is None, out
        _after_move(target.kube, world, target.cp)
        fk.wait(world, "the target adopted both workers", lambda: _adopted(target.kube, world, workers), 240)
        there = time.monotonic()
        sessions_there = {n: _ssh_sessions(h) - before[n][2] for n, h in hosts.items()}
        out_back, took_back = clusterctl_move(target.cp.kubeconfig, world.cp.kubeconfig, ns, tmp_path / "cc")
        assert target.kube.get_or_none(CAPI_CLUSTERS, world.config.cluster, ns) is None, out_back
        _after_move(world.k, world, world.cp)
        fk.wait(world, "the source adopted both workers again", lambda: _adopted(world.k, world, workers), 240)
        back = time.monotonic()

    figures = {
        n: {
            "resets": len(resets(world, n, robot_from)),
            "rescue activations": len(activations(world, n, robot_from)),
            "reboots": h.boot_count() - before[n][0],
            "rescue boots (installimage)": sum(1 for b in h.boots[before[n][0] :] if b.running is Running.RESCUE),
            "ssh sessions": _ssh_sessions(h) - before[n][2],
        }
        for n, h in hosts.items()
    }
    print(f"\nmove figures: {figures}; clusterctl move there {took_there:.1f}s, back {took_back:.1f}s; "
          f"adopted there after {there - ready_at:.1f}s, back after {back - there:.1f}s; "
          f"whole test {time.monotonic() - started:.1f}s; {watch.samples} samples")  # fmt: skip
    for n, f in figures.items():
        assert (f["resets"], f["rescue activations"], f["reboots"], f["rescue boots (installimage)"]) == (0, 0, 0, 0), (
            n,
            f,
        )
        # One adoption probe per move at most, and only for a host with a consumer (the spare needs none).
        limit = 1 if n in workers else 0
        assert sessions_there[n] <= limit and f["ssh sessions"] - sessions_there[n] <= limit, (n, f, sessions_there)
        assert hosts[n].boot_id == before[n][1]
    assert not watch.bad, watch.bad[:20]
    assert watch.samples > 10
    assert fk.pod_node(world, POD) == bound.node
    assert fk.allocation(fk.pod_claim(world, POD)) == claim_before
    spare_host = world.k.get(fk.HOSTS, f"gex131-{spare}", ns)
    assert (spare_host.get("status") or {}).get("state") in ("Available", None), spare_host.get("status")
    steps = ("activate-rescue", "reset-sw", "reset-hw", "reset-ssh", "installimage", "kubeadm-reset")
    logs = world.operator_logs()[log_from:] + target.operator_log()
    assert not [line for line in logs.splitlines() if any(s in line for s in steps)], logs[-3000:]
