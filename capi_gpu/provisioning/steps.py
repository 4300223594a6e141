"""The provisioning steps in one table: for each ``Step``, where each way of finishing it leads, where a
retryable failure in it resumes, what the controller looks at before deciding in it, and whether the live
view's progress bar counts it.

These facts used to live in separate lists that nothing checked against each other: successors in the
``pipeline`` handlers and again in ``outcomes``, ``RESUME_AT`` in ``transitions``, the probes in
``states.probes_for``, the live view's ladder. Adding a step meant finding them all. Now those modules read
this table, and a unit test checks it is total. The handlers stay in ``pipeline.STEPS``: they are code and
decide *when* a step is finished and *which* way (an ``Exit``); this table says *where* that leads. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from capi_gpu.api.host import HetznerGPUHostStatus, HostState, Step
from capi_gpu.provisioning import ladder
from capi_gpu.provisioning.model import ActionKind, Probe, Timing


class Exit(StrEnum):
    """The ways a step is finished; each row maps the ones it can take to where they lead."""

    DONE = "done"  # its work is done: the action succeeded, the server arrived, the install exited cleanly
    INSPECTING = "inspecting"  # reached rescue while inspecting: the hardware read is all that follows
    WIPE_REQUESTED = "wipe-requested"  # the disks passed their check and a wipe was asked for
    REBOOT_NEEDED = "reboot-needed"  # configured, but the MIG mode change takes a reboot
    STANDBY = "standby"  # reached while preparing a standby host, which stops short of the join


ProbeRule = Callable[[HetznerGPUHostStatus, datetime, Timing], frozenset[Probe]]


def looks(*probes: Probe) -> ProbeRule:
    """A step that always takes the same looks, whatever its status."""
    fixed = frozenset(probes)
    return lambda _status, _now, _timing: fixed


def rescue_probes(st: HetznerGPUHostStatus, now: datetime, timing: Timing) -> frozenset[Probe]:
    """Rescue reads Robot only when a decision can use it: Robot calls come out of the account's budget."""
    probes = {Probe.SSH_RESCUE} if st.host_keys.rescue else set()
    activation = [
        op
        for op in st.operations
        if op.name == ActionKind.ACTIVATE_RESCUE.value
        and (st.step_started_at is None or op.requested_at >= st.step_started_at)
    ]
    if activation and activation[-1].outcome is None:
        probes.add(Probe.ROBOT_RESCUE)  # crash recovery: read the activation back
    resets = ladder.resets_in_step(st)
    if resets and (now - resets[-1].requested_at).total_seconds() >= timing.ssh_reboot:
        probes.add(Probe.ROBOT_RESCUE)  # about to escalate: is rescue still armed?
    return frozenset(probes)


@dataclass(frozen=True, kw_only=True)
class Row:
    next: Mapping[Exit, Step | HostState]
    """Where each exit leads: a Step is the next step in the same state; a HostState leaves the pipeline."""
    resume_at: Step | None
    """Where a retryable failure in this step resumes after its backoff (None: the host starts over, registering)."""
    probes: ProbeRule
    """The looks the controller takes before deciding in this step."""
    live: bool
    """Counted by the live view's progress bar (the steps a cold host walks to a node)."""
    finished_by: ActionKind | None = None
    """The action whose successful result finishes the step (``outcomes`` moves on when it returns); None
    where the handler sees the step finished on the server (an arrival, installimage's exit, the sentinel)."""
    reboots_rescue: bool = False
    """An SSH reboot sent in this step goes to the rescue system (with its pin), not the installed OS."""


# Rows in the order a cold host walks them; the live view's bar takes its order from here.
TABLE: Mapping[Step, Row] = {
    Step.RESCUE: Row(
        next={Exit.DONE: Step.CHECK_DISKS, Exit.INSPECTING: Step.INSPECT},
        resume_at=Step.RESCUE,
        probes=rescue_probes,
        live=True,
    ),
    Step.INSPECT: Row(
        next={Exit.DONE: HostState.AVAILABLE},
        resume_at=Step.RESCUE,
        probes=looks(),
        live=False,
        finished_by=ActionKind.INSPECT,
    ),
    Step.CHECK_DISKS: Row(
        next={Exit.DONE: Step.INSTALL, Exit.WIPE_REQUESTED: Step.WIPE},
        resume_at=Step.RESCUE,
        probes=looks(),
        live=True,
        finished_by=ActionKind.CHECK_DISKS,
    ),
    Step.WIPE: Row(
        next={Exit.DONE: Step.INSTALL},
        resume_at=Step.RESCUE,
        probes=looks(),
        live=True,
        finished_by=ActionKind.WIPE,
    ),
    # installimage can't rerun without a fresh rescue boot (CAPH: "target is busy"), so its steps resume there.
    Step.INSTALL: Row(
        next={Exit.DONE: Step.REBOOT_OS},
        resume_at=Step.RESCUE,
        probes=looks(Probe.SSH_RESCUE, Probe.INSTALL),
        live=True,
    ),
    Step.REBOOT_OS: Row(
        next={Exit.DONE: Step.CONFIGURE},
        resume_at=Step.REBOOT_OS,
        probes=looks(Probe.SSH_OS),
        live=True,
        reboots_rescue=True,
    ),
    Step.CONFIGURE: Row(
        next={Exit.DONE: Step.BOOTSTRAP, Exit.REBOOT_NEEDED: Step.MIG_REBOOT},
        resume_at=Step.CONFIGURE,
        probes=looks(),
        live=True,
        finished_by=ActionKind.CONFIGURE,
    ),
    Step.MIG_REBOOT: Row(
        next={Exit.DONE: Step.CONFIGURE},
        resume_at=Step.CONFIGURE,
        probes=looks(Probe.SSH_OS),
        live=True,
    ),
    Step.BOOTSTRAP: Row(
        next={Exit.DONE: HostState.PROVISIONED, Exit.STANDBY: HostState.STANDBY},
        resume_at=Step.BOOTSTRAP,
        probes=looks(Probe.SSH_OS, Probe.BOOTSTRAP),
        live=True,
    ),
    Step.DONE: Row(
        next={Exit.DONE: HostState.PROVISIONED},
        resume_at=None,
        probes=looks(),
        live=False,
    ),
}

# Where the pipeline is entered other than as a successor.
FIRST = Step.RESCUE  # inspection and provisioning start here; a pipeline state without a step is here
RECONFIGURE = Step.CONFIGURE  # a standby host claimed with the same image but other GPU settings re-prepares here
JOIN = Step.BOOTSTRAP  # a standby host is prepared up to, not including, this step; claimed, it resumes here

LIVE: tuple[Step, ...] = tuple(step for step, row in TABLE.items() if row.live)
FINISHES: Mapping[ActionKind, Step] = {row.finished_by: step for step, row in TABLE.items() if row.finished_by}


def successor(step: Step, way: Exit = Exit.DONE) -> Step | HostState:
    """Where finishing ``step`` by ``way`` leads; a KeyError names an exit the table does not give that step."""
    return TABLE[step].next[way]
