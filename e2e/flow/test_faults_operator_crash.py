"""The operator SIGKILLed (with everything it started, as a container dies) at every provisioning step of
one host, each time in the window where the step's operation is recorded in status but its outcome is not,
and restarted: inspection's Rescue (activation sent, then reset sent), Inspect, provisioning's own Rescue
(the host was power-cycled into its disk while Available; activation recorded, Robot not asked yet),
CheckDisks, Wipe (the wipe-disk annotation set; recorded, wipefs running), Install (recorded, then
installimage running), RebootOS (SSH reboot recorded), Configure (Ansible
running) and Bootstrap (recorded). Afterwards the host converged (Provisioned, node joined, nodeRef) and the
Robot log, the host's boots and installimage's own run records show nothing destructive was sent twice,
but the interrupted wipe (idempotent) ran again rather than being skipped."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fault_kit import (
    activations,
    calls,
    converged,
    host_name,
    ops,
    resets,
    robot_log,
    status,
    until,
)

from capi_gpu import domain
from capi_gpu.kube import ours
from capi_gpu_sim.hosts import targets
from capi_gpu_sim.hosts.host import Running
from capi_gpu_sim.world import World

LATENCY_S = 0.4  # every Robot answer takes this long: the "sent, not yet recorded" window is this wide
CONFIGURE_KILL_AFTER_S = 4.0  # Ansible is well into site.yml by then (a run takes ~30 s here)
# The released operator elects a leader: a restarted container is a new candidate and waits out the killed
# one's Lease. A dozen kills at controller-runtime's 15 s would add 3 min; the flags are the product's own.
SHORT_LEASE = ["--leader-elect-lease-duration=6s", "--leader-elect-renew-deadline=4s", "--leader-elect-retry-period=1s"]


@dataclass
class Look:
    """One look at the host: its status, the Robot requests about it, its installimage runs."""

    status: dict[str, Any]
    robot: list[str]  # "POST /boot/{n}/rescue" style, this server only
    installs: list[dict[str, Any]]
    now: float

    @property
    def state_step(self) -> tuple[str | None, str | None]:
        return self.status.get("state"), self.status.get("step")

    def pending(self, op: str) -> bool:
        """The step's last ``op`` is recorded and has no outcome yet."""
        found = [o for o in self.status.get("operations") or [] if o["name"] == op]
        return bool(found) and found[-1].get("outcome") is None


@dataclass
class Kill:
    name: str
    when: Callable[[Look], bool]
    seen: dict[str, Any] | None = None
    robot: list[str] | None = None  # what Robot had been asked about the host at the kill


def _kills(number: int, first_seen: dict[str, float]) -> list[Kill]:
    def configure_running(look: Look) -> bool:
        if look.state_step != ("Provisioning", "Configure"):
            return False
        first_seen.setdefault("configure", look.now)
        return look.now - first_seen["configure"] >= CONFIGURE_KILL_AFTER_S

    def installing(look: Look) -> bool:
        started = sum(1 for r in look.installs if r["event"] == "start")
        ended = sum(1 for r in look.installs if r["event"] == "end")
        return look.state_step == ("Provisioning", "Install") and started > ended

    return [
        Kill(
            "Rescue: activation sent, outcome not recorded",
            lambda k: (
                k.state_step == ("Inspecting", "Rescue")
                and k.pending("activate-rescue")
                and f"POST /boot/{number}/rescue" in k.robot
            ),
        ),
        Kill(
            "Rescue: reset sent, outcome not recorded",
            lambda k: (
                k.state_step == ("Inspecting", "Rescue")
                and k.pending("reset-sw")
                and f"POST /reset/{number}" in k.robot
            ),
        ),
        Kill("Inspect", lambda k: k.state_step == ("Inspecting", "Inspect")),
        Kill(
            "Rescue again: activation recorded, Robot not asked yet",
            lambda k: k.state_step == ("Provisioning", "Rescue") and k.pending("activate-rescue"),
        ),
        Kill("CheckDisks", lambda k: k.state_step == ("Provisioning", "CheckDisks")),
        Kill("Wipe: recorded, wipefs running", lambda k: k.state_step[1] == "Wipe" and k.pending("wipe")),
        Kill("Install: recorded, not completed", lambda k: k.state_step[1] == "Install" and k.pending("installimage")),
        Kill("Install: installimage running", installing),
        Kill("RebootOS: SSH reboot recorded, not completed", lambda k: k.pending("reset-ssh")),
        Kill("Configure: Ansible running", configure_running),
        Kill("Bootstrap: recorded, not completed", lambda k: k.pending("bootstrap")),
    ]


def _look(world: World, number: int) -> Look:
    entries = [e for e in robot_log(world) if e.path.split("?")[0].rstrip("/").split("/")[2:3] == [str(number)]]
    robot = [f"{e.method} {e.path.split('?')[0]}" for e in entries]
    host = world.fleet.host(number) if world.fleet is not None else None
    return Look(status(world, number), robot, host.installimage_runs() if host else [], time.monotonic())


def test_killed_at_every_step_then_restarted_converges_without_repeating_a_destructive_call(
    world_factory: Callable[..., World],
) -> None:
    world = world_factory(hosts=1, robot_faults={"latency_s": LATENCY_S}, operator_args=SHORT_LEASE)
    assert world.fleet is not None
    number = next(iter(world.fleet.hosts))
    host = world.fleet.host(number)
    # Room to kill installimage and wipefs mid-run.
    host.set_hardware(dataclasses.replace(host.hw, installimage_seconds=4.0, wipefs_seconds=3.0))
    hosts = ours("hetznergpuhosts")
    annotation = {"metadata": {"annotations": {domain.ANNOTATION_WIPE_DISK: "all"}}}
    world.k.patch(hosts, host_name(number), annotation, world.config.namespace)
    first_seen: dict[str, float] = {}
    pending = _kills(number, first_seen)
    done: list[Kill] = []
    scaled = False
    deadline = time.monotonic() + 420
    while pending:
        look = _look(world, number)
        if look.state_step == ("Available", None) and not scaled:
            # A power blip while it waited: it boots its disk, so provisioning needs its own rescue boot.
            host.reset("hw", targets.DiskBoot())
            until("the host back in its previous OS", lambda: host.running is Running.PREVIOUS and host.boot_id, 60)
            world.scale(1)
            scaled = True
        if pending[0].when(look):
            kill = pending.pop(0)
            kill.robot = look.robot
            world.kill_operator(9)
            kill.seen = look.status
            done.append(kill)
            world.start_operator()
        assert world.operator_failure() is None, world.operator_failure()
        assert look.status.get("state") != "Error", f"host failed after kills {[k.name for k in done]}: {look.status}"
        assert time.monotonic() < deadline, (
            f"kill point {pending[0].name!r} never came; after {[k.name for k in done]} the host is at "
            f"{look.state_step}; dump: {world.dump()}"
        )
        time.sleep(0.05)

    node = until("the host to converge after the last restart", lambda: converged(world, number), 180, world)
    assert node["spec"]["providerID"] == f"hrobot://{number}"
    assert world.operator_starts == 1 + len(done)

    # Robot: one activation per Rescue step (inspection's, in flight at a kill; provisioning's, recorded but
    # not yet sent at a kill, then sent once), never a second for the same step.
    assert len(activations(world, number)) == 2, calls(world, number, "POST", "/boot")
    # Resets: one sw per Rescue step, and in RebootOS at most the ladder's next rung: an SSH reboot recorded but
    # cut off by the kill counts as sent and is never re-sent; when the host stays in rescue the ladder goes on
    # to Robot sw, once. Every reset Robot performed is one the status records.
    robot_resets = [e.detail for e in resets(world, number)]
    recorded = [
        o for o in ops(world, number) if o["name"] in ("reset-sw", "reset-hw") and o.get("outcome") != "Deferred"
    ]
    assert len(recorded) == len(robot_resets), (recorded, calls(world, number, "POST", "/reset"))
    ssh_reboots = ops(world, number, "reset-ssh")
    assert len(ssh_reboots) == 1, ssh_reboots
    if ssh_reboots[0].get("outcome") is None:  # cut off before its outcome: the ladder's rung, not a resend
        assert robot_resets in (["sw", "sw"], ["sw", "sw", "sw"]), robot_resets
    else:
        assert robot_resets == ["sw", "sw"], robot_resets
    # The wipe cut off by the kill ran again (wipefs is idempotent; skipping it would install beside the OS it
    # was asked to clear, with the other-OS check already skipped): the open record Interrupted, then one Sent.
    assert [o.get("outcome") for o in ops(world, number, "wipe")] == ["Interrupted", "Sent"], ops(world, number)
    # installimage started once and finished once, though the operator died while it ran.
    runs = host.installimage_runs()
    assert [r["event"] for r in runs] == ["start", "end"] and runs[-1]["rc"] == 0, runs
    # Boots: previous OS, rescue, previous OS (the blip), rescue, installed OS. No MIG reboot with this GPU.
    assert host.boot_count() == 5, f"{host.boot_count()} boots: {host.boots}"
    # One bootstrap started (kubeadm refuses a second join, which would have failed cloud-init).
    started = [o for o in ops(world, number, "bootstrap") if o.get("outcome") != "NotSent"]
    assert len(started) == 1, ops(world, number, "bootstrap")
    print(f"\nkills (Robot asked so far): {[(k.name, len(k.robot or [])) for k in done]}")
