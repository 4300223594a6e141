"""The provisioning pipeline's steps: Rescue, Inspect, CheckDisks, Wipe, Install, RebootOS, Configure,
MIGReboot, Bootstrap. One pure handler per step; reboots go through ``ladder``. Pure.

A handler decides when its step is finished and which way (a ``steps.Exit``); where that leads is the
``steps`` table's, so no successor is decided here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import assert_never

from capi_gpu.api.host import ErrorType, HostState, Step
from capi_gpu.provisioning import ladder, steps
from capi_gpu.provisioning.model import (
    ActionKind,
    CloudInitState,
    Decision,
    InstallProgress,
    Note,
    PresentedKey,
    SSHOutcome,
)
from capi_gpu.provisioning.transitions import (
    INTERRUPTED,
    NOT_SENT,
    SENT,
    Context,
    Handler,
    act,
    copy_status,
    elapsed,
    fail,
    goto,
    leave,
    op_in_step,
    settle,
    wait,
)

# --- the pipeline ---------------------------------------------------------------------------------------


def pipeline(ctx: Context) -> Decision:
    if ctx.status.state is HostState.PROVISIONING and not ctx.obs.claimed and ctx.status.step is not steps.JOIN:
        return goto(
            ctx, HostState.DEPROVISIONING, Step.DONE, note=Note("Released", "claim withdrawn during provisioning")
        )
    step = ctx.status.step or steps.FIRST
    return STEPS[step](ctx)


def step_rescue(ctx: Context) -> Decision:
    obs, st = ctx.obs, ctx.status
    resets = ladder.resets_in_step(st)
    in_rescue = obs.ssh is not None and obs.ssh.outcome is SSHOutcome.OK and obs.ssh.hostname == "rescue"
    if in_rescue and not resets:
        # Still in the rescue system from an earlier step (e.g. inspection): no Robot call needed.
        return _next_after_rescue(ctx, obs.ssh.boot_id if obs.ssh else None)
    activation = op_in_step(ctx, ActionKind.ACTIVATE_RESCUE)
    if activation is None:
        return act(ctx, ActionKind.ACTIVATE_RESCUE)
    if activation.outcome is None:
        # Crashed after recording it, before recording how it went: ask Robot, never re-send blind. Any rescue
        # keys in status are an earlier activation's (inspection's): this one's are recorded with its outcome.
        if obs.rescue_active and obs.rescue_keys:
            status = copy_status(settle(ctx, activation, SENT))
            status.host_keys.rescue = list(obs.rescue_keys)
            return Decision(
                status, requeue_after=0.2, notes=(Note("RescueRecovered", "read rescue keys back from Robot"),)
            )
        if obs.rescue_active is False and not resets:
            # Nothing pending at Robot and no reset sent in this step, so no boot can have consumed it: the
            # crash came before the request left, and this activation is the first, not a second.
            return act(
                settle(ctx, activation, NOT_SENT),
                ActionKind.ACTIVATE_RESCUE,
                note=Note("RescueNotSent", "Robot has no activation pending: the recorded one never left"),
            )
        if obs.rescue_active is None or not resets:
            return wait(ctx, ctx.timing.poll)  # not read back yet, or pending without its keys yet
        # A re-activation on the way up the ladder, which a late boot may have consumed: the ladder counts it
        # as sent and climbs on.
    verdict = ladder.climb(ladder.Target.RESCUE, st, obs, ctx.now, ctx.timing, None, os_reachable=_os_reachable(ctx))
    return _ladder_decision(
        ctx, verdict, on_arrival=lambda: _next_after_rescue(ctx, obs.ssh.boot_id if obs.ssh else None)
    )


def _os_reachable(ctx: Context) -> bool:
    """The rescue pin was refused with our OS key: the installed OS is up and we can log in to reboot it."""
    ssh = ctx.obs.ssh
    return ssh is not None and ssh.outcome is SSHOutcome.KEY_MISMATCH and ssh.presented is PresentedKey.OS


def _next_after_rescue(ctx: Context, boot_id: str | None) -> Decision:
    way = steps.Exit.INSPECTING if ctx.status.state is HostState.INSPECTING else steps.Exit.DONE
    return leave(ctx, Step.RESCUE, way, boot_id=boot_id)


def _ladder_decision(ctx: Context, v: ladder.Step, on_arrival: Callable[[], Decision]) -> Decision:
    match v.verdict:
        case ladder.Verdict.ARRIVED:
            return on_arrival()
        case ladder.Verdict.WAIT:
            return wait(ctx, v.wait)
        case ladder.Verdict.ACT:
            assert v.action is not None
            note = (
                Note("Rebooting", f"{v.action.value}: {v.message}".rstrip(": "))
                if v.action is not ActionKind.ACTIVATE_RESCUE
                else None
            )
            return act(ctx, v.action, note=note)
        case ladder.Verdict.KEY_MISMATCH:
            return fail(ctx, ErrorType.HOST_KEY_MISMATCH, v.message, permanent=True)
        case ladder.Verdict.WRONG_HOST:
            return fail(ctx, ErrorType.PROVISIONING, f"unexpected host: {v.message}")
        case ladder.Verdict.TIMEOUT:
            return fail(ctx, ErrorType.REBOOT_TIMEOUT, v.message, permanent=True)
        case _:
            assert_never(v.verdict)


def step_inspect(ctx: Context) -> Decision:
    return act(ctx, ActionKind.INSPECT)


def step_check_disks(ctx: Context) -> Decision:
    return act(ctx, ActionKind.CHECK_DISKS)


def step_wipe(ctx: Context) -> Decision:
    op = op_in_step(ctx, ActionKind.WIPE)
    if op is None:
        return act(ctx, ActionKind.WIPE)
    if op.outcome is None:
        # Recorded, outcome never written: a crash between the record and the result. CheckDisks skipped the
        # other-OS check because a wipe was asked, so going on would install beside what the wipe was for;
        # wipefs is idempotent, so run it again rather than skip it.
        return act(
            settle(ctx, op, INTERRUPTED),
            ActionKind.WIPE,
            note=Note("WipeRepeated", "a wipe was recorded but its outcome never was; wiping again"),
        )
    return leave(ctx, Step.WIPE)


def step_install(ctx: Context) -> Decision:
    obs = ctx.obs
    if obs.ssh is None or obs.ssh.outcome is not SSHOutcome.OK or obs.install is None:
        if elapsed(ctx) > ctx.timing.install:
            return fail(ctx, ErrorType.INSTALL_FAILED, f"rescue unreachable during installimage: {obs.ssh}")
        return wait(ctx, ctx.timing.poll)
    standby = ctx.status.state is HostState.STANDBY_PREPARING
    finished = obs.install in (InstallProgress.SUCCEEDED, InstallProgress.FAILED)
    if finished and op_in_step(ctx, ActionKind.START_INSTALL) is None:
        # An exit record this step never started: an earlier attempt's, left in the same rescue session (a
        # retry after a failure resumes in rescue without a reboot). Read as ours it would fail every retry
        # with the old error, or pass an install that never ran; the start clears it and runs afresh.
        note = Note("InstallRestarted", f"ignoring the exit record of an earlier installimage ({obs.install.value})")
        return act(ctx, ActionKind.START_INSTALL, standby=standby, note=note)
    match obs.install:
        case InstallProgress.NOT_STARTED:
            # Nothing on the server says it ran, so starting it is not a repeat (the start itself refuses
            # to run twice, and the step's record tells an audit what happened).
            return act(ctx, ActionKind.START_INSTALL, standby=standby)
        case InstallProgress.RUNNING:
            if elapsed(ctx) > ctx.timing.install:
                return fail(
                    ctx, ErrorType.INSTALL_FAILED, f"installimage still running after {ctx.timing.install:.0f}s"
                )
            return wait(ctx, ctx.timing.poll)
        case InstallProgress.SUCCEEDED:
            return leave(ctx, Step.INSTALL, note=Note("Installed", "installimage finished"))
        case InstallProgress.FAILED:
            return fail(ctx, ErrorType.INSTALL_FAILED, f"installimage failed: {obs.install_log[-1500:]}")
        case _:
            assert_never(obs.install)


def step_reboot_os(ctx: Context) -> Decision:
    v = ladder.climb(
        ladder.Target.OS, ctx.status, ctx.obs, ctx.now, ctx.timing, ctx.hostname, first=ActionKind.SSH_REBOOT
    )
    return _ladder_decision(
        ctx, v, on_arrival=lambda: leave(ctx, Step.REBOOT_OS, boot_id=ctx.obs.ssh.boot_id if ctx.obs.ssh else None)
    )


def step_configure(ctx: Context) -> Decision:
    standby = ctx.status.state is HostState.STANDBY_PREPARING
    if not standby and ctx.obs.vswitch_before_configure is not None:
        # The claim's cluster has a private network: without its VLAN interface and --node-ip the node would
        # join with its public IP as InternalIP, so Configure waits until the interface can be built.
        return wait(ctx, ctx.timing.poll, Note("JoiningVSwitch", ctx.obs.vswitch_before_configure))
    return act(ctx, ActionKind.CONFIGURE, standby=standby)


def step_mig_reboot(ctx: Context) -> Decision:
    if not ladder.resets_in_step(ctx.status):
        if ctx.status.reboot_attempts >= ctx.timing.max_mig_reboots:
            return fail(
                ctx,
                ErrorType.ANSIBLE_FAILED,
                f"MIG mode still needs a reboot after {ctx.status.reboot_attempts} "
                "reboot(s); the GPU does not switch MIG mode",
                permanent=True,
            )
        return act(
            ctx,
            ActionKind.MIG_REBOOT,
            reboot_attempts=ctx.status.reboot_attempts + 1,
            note=Note("MIGReboot", "MIG mode change needs a reboot"),
        )
    v = ladder.climb(ladder.Target.OS, ctx.status, ctx.obs, ctx.now, ctx.timing, ctx.hostname)
    return _ladder_decision(
        ctx, v, on_arrival=lambda: leave(ctx, Step.MIG_REBOOT, boot_id=ctx.obs.ssh.boot_id if ctx.obs.ssh else None)
    )


def step_bootstrap(ctx: Context) -> Decision:
    obs = ctx.obs
    if ctx.status.state is HostState.STANDBY_PREPARING:
        return leave(ctx, Step.BOOTSTRAP, steps.Exit.STANDBY, note=Note("StandbyReady", "prepared up to the join"))
    if obs.sentinel:
        return leave(ctx, Step.BOOTSTRAP, note=Note("Bootstrapped", "bootstrap sentinel present"), error_count=0)
    sent = op_in_step(ctx, ActionKind.BOOTSTRAP)
    if sent is not None and sent.outcome is None and obs.cloud_init is CloudInitState.DISABLED:
        # Recorded, and cloud-init is still disabled: the start, whose first command removes the marker the
        # post-install left, never ran (a crash came before it), so starting it now is not a repeat.
        ctx, sent = settle(ctx, sent, NOT_SENT), None
    if sent is None:
        if not obs.bootstrap_ready:
            return wait(ctx, ctx.timing.poll, Note("WaitingForBootstrapData", "bootstrap data not ready"))
        if obs.vswitch_before_join is not None:  # the node registers its private address: join the vSwitch first
            return wait(ctx, ctx.timing.poll, Note("JoiningVSwitch", obs.vswitch_before_join))
        return act(ctx, ActionKind.BOOTSTRAP)
    if obs.cloud_init is not None and obs.cloud_init.value == "error":
        return fail(ctx, ErrorType.BOOTSTRAP_FAILED, "cloud-init reported an error running the bootstrap data")
    if elapsed(ctx) > ctx.timing.bootstrap:
        return fail(ctx, ErrorType.BOOTSTRAP_FAILED, f"no bootstrap sentinel after {ctx.timing.bootstrap:.0f}s")
    return wait(ctx, ctx.timing.poll)


def step_done(ctx: Context) -> Decision:
    return leave(ctx, Step.DONE)


# The code half of each ``steps.TABLE`` row, keyed by the same steps (a unit test keeps the keys equal).
STEPS: dict[Step, Handler] = {
    Step.RESCUE: step_rescue,
    Step.INSPECT: step_inspect,
    Step.CHECK_DISKS: step_check_disks,
    Step.WIPE: step_wipe,
    Step.INSTALL: step_install,
    Step.REBOOT_OS: step_reboot_os,
    Step.CONFIGURE: step_configure,
    Step.MIG_REBOOT: step_mig_reboot,
    Step.BOOTSTRAP: step_bootstrap,
    Step.DONE: step_done,
}
