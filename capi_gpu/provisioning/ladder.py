"""The reboot ladder: SSH reboot -> Robot sw -> Robot hw -> error, as a pure function.

Shared by every step that waits for a server to come back (into rescue, into the installed OS, after a
MIG reboot). CAPH's lessons are kept: a debounce so a slow boot is not reset again, rescue re-activated
before a Robot reset if the last boot consumed it, and a key mismatch read as "not rebooted yet" when
the server still shows the key of the system it is leaving.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from capi_gpu.api.host import HetznerGPUHostStatus, Operation
from capi_gpu.provisioning.model import (
    ActionKind,
    Observations,
    PresentedKey,
    SSHOutcome,
    Timing,
)


class Target(StrEnum):
    RESCUE = "rescue"
    OS = "os"


class Verdict(StrEnum):
    ARRIVED = "arrived"
    WAIT = "wait"
    ACT = "act"
    KEY_MISMATCH = "key-mismatch"
    WRONG_HOST = "wrong-host"
    TIMEOUT = "timeout"


@dataclass(frozen=True)
class Step:
    verdict: Verdict
    action: ActionKind | None = None
    wait: float = 0.0
    message: str = ""


_LADDER = (ActionKind.SSH_REBOOT, ActionKind.RESET_SW, ActionKind.RESET_HW)


def resets_in_step(status: HetznerGPUHostStatus) -> list[Operation]:
    since = status.step_started_at
    reset_names = {a.value for a in (*_LADDER, ActionKind.MIG_REBOOT)}
    return [
        op
        for op in status.operations
        if op.name in reset_names
        and (since is None or op.requested_at >= since)
        and op.outcome not in ("Deferred", "NotSent")
    ]


def _rescue_active_in_step(status: HetznerGPUHostStatus) -> bool:
    """A rescue activation recorded in this step after the last reset (or with no reset yet)."""
    since = status.step_started_at
    last_reset = max((op.requested_at for op in resets_in_step(status)), default=None)
    for op in status.operations:
        if op.name != ActionKind.ACTIVATE_RESCUE.value or op.outcome not in ("Sent", None):
            continue
        if since is not None and op.requested_at < since:
            continue
        if last_reset is None or op.requested_at >= last_reset:
            return True
    return False


def _arrived(target: Target, obs: Observations, expect_hostname: str | None, boot_before: str | None) -> Step | None:
    ssh = obs.ssh
    if ssh is None or ssh.outcome is not SSHOutcome.OK:
        return None
    want = "rescue" if target is Target.RESCUE else expect_hostname
    if want and ssh.hostname != want:
        return Step(Verdict.WRONG_HOST, message=f"hostname is {ssh.hostname!r}, expected {want!r}")
    if boot_before and ssh.boot_id == boot_before:
        return None  # same boot as before the reset: it has not rebooted yet
    return Step(Verdict.ARRIVED)


def _mismatch(target: Target, obs: Observations) -> Step | None:
    ssh = obs.ssh
    if ssh is None or ssh.outcome is not SSHOutcome.KEY_MISMATCH:
        return None
    leaving = PresentedKey.OS if target is Target.RESCUE else PresentedKey.RESCUE
    if ssh.presented is leaving:
        return None  # still the system it is leaving
    if target is Target.RESCUE and ssh.presented is PresentedKey.UNKNOWN and obs.rescue_active is not False:
        return None  # a previous OS whose key we never knew, rescue not booted yet
    return Step(Verdict.KEY_MISMATCH, message=ssh.message or f"{target.value} host key does not match the pin")


def first_reboot(target: Target, obs: Observations, reset_types: list[str], os_reachable: bool) -> ActionKind:
    """Where the ladder starts: an SSH reboot when we can log in, else the gentlest Robot reset."""
    if target is Target.OS or os_reachable:
        return ActionKind.SSH_REBOOT
    return ActionKind.RESET_SW if "sw" in reset_types or not reset_types else ActionKind.RESET_HW


def climb(
    target: Target,
    status: HetznerGPUHostStatus,
    obs: Observations,
    now: datetime,
    timing: Timing,
    expect_hostname: str | None,
    os_reachable: bool = False,
    first: ActionKind | None = None,
) -> Step:
    """One look at a server that should come back as ``target``."""
    arrived = _arrived(target, obs, expect_hostname, status.boot_id)
    if arrived is not None:
        return arrived
    bad_key = _mismatch(target, obs)
    if bad_key is not None:
        return bad_key
    resets = resets_in_step(status)
    if not resets:
        return Step(Verdict.ACT, first or first_reboot(target, obs, status.reset_types, os_reachable))
    last = resets[-1]
    elapsed = (now - last.requested_at).total_seconds()
    if elapsed < timing.reboot_debounce:
        return Step(Verdict.WAIT, wait=timing.reboot_debounce - elapsed)
    window = {
        ActionKind.SSH_REBOOT.value: timing.ssh_reboot,
        ActionKind.MIG_REBOOT.value: timing.ssh_reboot,
        ActionKind.RESET_SW.value: timing.reset_sw,
        ActionKind.RESET_HW.value: timing.reset_hw,
    }[last.name]
    if obs.ssh is not None and obs.ssh.outcome is SSHOutcome.REFUSED:
        window = max(window, timing.refused_grace)  # sshd not up yet: the box is alive, be patient
    if elapsed < window:
        return Step(Verdict.WAIT, wait=min(timing.poll, window - elapsed))
    nxt = _escalate(last.name, status.reset_types)
    if nxt is None:
        return Step(
            Verdict.TIMEOUT,
            message=(
                f"no {target.value} after {last.name} ({elapsed:.0f}s); the ladder is exhausted. "
                "Check the server's boot order (network boot before disk) and its console."
            ),
        )
    if target is Target.RESCUE and not _rescue_active_in_step(status) and obs.rescue_active is not True:
        return Step(Verdict.ACT, ActionKind.ACTIVATE_RESCUE, message="rescue was consumed; re-activating")
    return Step(Verdict.ACT, nxt)


def _escalate(last: str, reset_types: list[str]) -> ActionKind | None:
    if last in (ActionKind.SSH_REBOOT.value, ActionKind.MIG_REBOOT.value):
        return ActionKind.RESET_SW if ("sw" in reset_types or not reset_types) else ActionKind.RESET_HW
    if last == ActionKind.RESET_SW.value:
        return ActionKind.RESET_HW
    return None
