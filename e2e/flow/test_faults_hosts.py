"""Hosts misbehaving during a MachineDeployment's provisioning, in one world, one fault at a time: SSH sessions
killed while installimage runs (it keeps running under nohup, one run, the host converges); the DRA plugin's
pool going incomplete, disappearing, or carrying a stale old generation (re-tainted with the reason where the
pool can't be trusted, left alone where the DRA contract says the old slice is ignored); an Ansible task
failing (an error condition and Event naming the role and task, nothing reset, a fixed host converges); a host
that never boots back after install (the ladder SSH reboot -> sw -> hw ends in a permanent RebootTimeout, no
false "provisioned", exactly one sw and one hw reset).

The dev cluster's MachineHealthCheck is removed first: its external remediation (a Robot hw reset) would act
on the hosts these faults break, and its own tests live with the whole flow."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fault_kit import (
    GPU_MACHINES,
    calls,
    claimed_host,
    condition,
    converged,
    gpu_machines,
    host_name,
    ops,
    resets,
    robot_log,
    status,
    until,
    wait_event,
)

from capi_gpu import domain
from capi_gpu.kube import CAPI_MACHINES, CAPI_MHCS, NODES
from capi_gpu_sim.world import World

INSTALL_SECONDS = 6.0  # each installimage run, so there is time to cut SSH under it


@pytest.fixture(scope="module")
def hosts_world(world_factory: Callable[..., World]) -> Iterator[World]:
    world = world_factory(hosts=3)
    world.k.delete(CAPI_MHCS, f"{world.config.cluster}-gpu", world.config.namespace)
    assert world.fleet is not None
    numbers = list(world.fleet.hosts)
    for host in world.fleet.hosts.values():
        host.set_hardware(dataclasses.replace(host.hw, installimage_seconds=INSTALL_SECONDS))
    until(
        "every host inspected", lambda: all(status(world, n).get("state") == "Available" for n in numbers), 120, world
    )
    yield world


def _new_claim(world: World, replicas: int) -> int:
    """Scale to ``replicas``; the server number of the host the new Machine claimed."""
    before = {claimed_host(world, m["metadata"]["name"]) for m in gpu_machines(world)}
    world.scale(replicas)

    def fresh() -> int | None:
        for m in gpu_machines(world):
            n = claimed_host(world, m["metadata"]["name"])
            if n is not None and n not in before:
                return n
        return None

    return until(f"a new Machine to claim a host (replicas={replicas})", fresh, 90, world)


def _node(world: World, number: int) -> dict[str, Any] | None:
    return world.k.get_or_none(NODES, host_name(number))


def _gpu_ready(world: World, number: int) -> tuple[str, str] | None:
    node = _node(world, number)
    cond = condition(node, domain.GPU_READY_CONDITION) if node else None
    if node is None or cond is None:
        return None
    tainted = any(t.get("key") == domain.NODE_STARTUP_TAINT for t in node["spec"].get("taints") or [])
    return (cond["status"] if cond["status"] == "True" and not tainted else f"{cond['status']}+tainted"), cond["reason"]


def _machine_gpu_ready(world: World, number: int) -> str | None:
    capi = next(
        (m for m in world.k.list(CAPI_MACHINES, world.config.namespace)
         if ((m.get("status") or {}).get("nodeRef") or {}).get("name") == host_name(number)),
        None,
    )  # fmt: skip
    cond = condition(capi, domain.GPU_READY_CONDITION) if capi else None
    return cond["status"] if cond else None


def test_ssh_dropped_while_installimage_runs_it_keeps_running_once_and_the_host_converges(hosts_world: World) -> None:
    world = hosts_world
    assert world.fleet is not None
    number = _new_claim(world, 1)
    host = world.fleet.host(number)

    def running() -> bool:
        runs = host.installimage_runs()
        return bool(runs) and runs[-1]["event"] == "start"

    until("installimage to start", running, 90, world, every=0.05)
    killed, cut_until = 0, time.monotonic() + INSTALL_SECONDS / 2
    while time.monotonic() < cut_until:  # every SSH session the operator opens meanwhile dies too
        killed += host.drop_ssh(listener=False)
        time.sleep(0.05)
    assert killed >= 1, "no SSH session was open to cut while installimage ran"
    assert running(), "installimage did not outlive its SSH sessions"

    until("the host to converge", lambda: converged(world, number), 180, world)
    runs = host.installimage_runs()
    assert [r["event"] for r in runs] == ["start", "end"] and runs[-1]["rc"] == 0, runs
    started = [o for o in ops(world, number, "installimage") if o.get("outcome") == "Sent"]
    assert len(started) == 1, ops(world, number, "installimage")


def test_an_untrustworthy_dra_pool_retaints_the_node_and_an_old_generation_beside_a_new_one_does_not(
    hosts_world: World,
) -> None:
    world = hosts_world
    assert world.fleet is not None
    number = next(n for n in world.fleet.hosts if converged(world, n))
    until("GPUReady=True and the startup taint lifted", lambda: _gpu_ready(world, number) == ("True", "Ready"), 60)
    until("the CAPI Machine's GPUReady=True", lambda: _machine_gpu_ready(world, number) == "True", 60)
    kubelet = world.fleet.kubelets[number]
    publisher = until("the DRA publisher", lambda: kubelet.publisher, 30)

    publisher.publish_incomplete()  # a new generation announced as two slices, one published
    until(
        "the node re-tainted for an incomplete pool",
        lambda: _gpu_ready(world, number) == ("False+tainted", "PoolIncomplete"),
        30,
        world,
    )
    until("the CAPI Machine's GPUReady=False", lambda: _machine_gpu_ready(world, number) == "False", 30, world)
    node = _node(world, number)
    assert node is not None
    message = (condition(node, domain.GPU_READY_CONDITION) or {}).get("message", "")
    assert "resourceSliceCount" in message or "slices" in message, message

    publisher.clear_faults()
    until("ready again once the pool is complete", lambda: _gpu_ready(world, number) == ("True", "Ready"), 30, world)

    publisher.stop()  # its slices deleted while its pod runs on (a plugin that went would be PluginNotRunning)
    until("re-tainted with no slices", lambda: _gpu_ready(world, number) == ("False+tainted", "NoSlices"), 30, world)
    publisher.clear_faults()
    until("ready again once republished", lambda: _gpu_ready(world, number) == ("True", "Ready"), 30, world)

    # A republish leaves the previous generation's slice beside the new, complete one: consumers read only the
    # newest generation (DRA contract), so the node must not flap.
    publisher.publish_stale()
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        assert _gpu_ready(world, number) == ("True", "Ready"), "an old generation beside a complete one re-tainted"
        time.sleep(0.2)


def test_an_ansible_task_failure_names_the_role_and_task_and_resets_nothing(hosts_world: World) -> None:
    world = hosts_world
    assert world.fleet is not None
    waiting = [h for n, h in world.fleet.hosts.items() if status(world, n).get("state") == "Available"]
    for host in waiting:  # whichever is claimed: its GPU answers with a driver older than the branch asked for
        host.set_gpu_shim(driver_version="550.163.01")
    try:
        number = _new_claim(world, 2)
        failed = until(
            "an AnsibleFailed error on the host",
            lambda: (st := status(world, number)).get("errorType") == "AnsibleFailed" and st,
            240,
            world,
        )
        at_failure, reboots_before = len(robot_log(world)), len(ops(world, number))
    finally:
        for host in waiting:
            host.set_gpu_shim(driver_version=None)
    message = failed["errorMessage"]
    assert "nvidia_driver: Check the loaded driver branch" in message and "550.163.01" in message, message
    ready = condition({"status": failed}, "Ready")
    assert ready is not None and ready["reason"] == "HostError" and "Check the loaded driver branch" in ready["message"]
    warned = wait_event(world, host_name(number), "AnsibleFailed")
    assert "nvidia_driver: Check the loaded driver branch" in warned[0]["message"], warned
    assert warned[0]["type"] == "Warning"
    assert not failed.get("errorPermanent"), "a retryable failure was made permanent at once"
    hgm = next(m for m in gpu_machines(world) if claimed_host(world, m["metadata"]["name"]) == number)
    assert not ((hgm.get("status") or {}).get("initialization") or {}).get("provisioned")

    # Fixed (the driver answers with its branch again): the retry resumes at Configure and converges, and the
    # failure never caused a reset, a reboot or a reinstall.
    until("the host to converge after the fix", lambda: converged(world, number), 240, world)
    assert resets(world, number, at_failure) == []
    later = ops(world, number)[reboots_before:]
    assert not [o for o in later if o["name"] in ("reset-ssh", "reset-sw", "reset-hw", "installimage", "wipe")], later


def test_a_host_that_never_boots_back_ends_the_ladder_in_a_permanent_reboot_timeout(hosts_world: World) -> None:
    world = hosts_world
    assert world.fleet is not None and world.robot is not None
    number = _new_claim(world, 3)
    host = world.fleet.host(number)
    until(
        "installimage running on the new host",
        lambda: (runs := host.installimage_runs()) and runs[-1]["event"] == "start",
        120,
        world,
        every=0.05,
    )
    since = len(robot_log(world))
    host.never_boot_again = True  # the SSH reboot after the install: it goes down and stays down
    world.robot.set_faults(never_boot=[number])  # and Robot's resets don't bring it back either
    try:
        failed = until(
            "the ladder to end in RebootTimeout",
            lambda: (st := status(world, number)).get("errorType") == "RebootTimeout" and st,
            120,
            world,
        )
    finally:
        world.robot.set_faults(never_boot=[])
    assert failed["state"] == "Error" and failed["errorPermanent"], failed
    assert "ladder is exhausted" in failed["errorMessage"], failed["errorMessage"]
    assert [e.detail for e in resets(world, number, since)] == ["sw", "hw"], calls(world, number, "POST", "/reset")
    ladder = [o["name"] for o in ops(world, number) if o["name"] in ("reset-ssh", "reset-sw", "reset-hw")][-3:]
    assert ladder == ["reset-ssh", "reset-sw", "reset-hw"], ops(world, number)
    time.sleep(2)  # nothing after the verdict: no further reset, no false "provisioned"
    assert [e.detail for e in resets(world, number, since)] == ["sw", "hw"]
    machine = next(m for m in gpu_machines(world) if claimed_host(world, m["metadata"]["name"]) == number)

    def host_ready_says_why() -> dict[str, Any] | None:
        got = world.k.get(GPU_MACHINES, machine["metadata"]["name"], world.config.namespace)
        c = condition(got, "HostReady")
        return got if c and c["status"] == "False" and "RebootTimeout" in c["message"] else None

    # The machine's own reconcile copies the host's error, after the host's status write.
    hgm = until("HostReady False/RebootTimeout on the HetznerGPUMachine", host_ready_says_why, 30, world)
    assert not ((hgm.get("status") or {}).get("initialization") or {}).get("provisioned"), hgm.get("status")
    assert not (hgm.get("spec") or {}).get("providerID")
    assert _node(world, number) is None
    assert world.k.get_or_none(NODES, host_name(number)) is None
