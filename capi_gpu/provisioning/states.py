"""The host state machine: (state, observations, now) -> (next state, action, requeue-after). No I/O.

A state map from state to handler (CAPH's good half) over a closed set of actions and results. The
controller probes what ``probes_for`` names, calls ``decide``, writes the returned status (destructive
operations are recorded *before* they are sent), performs the one action, then writes what
``on_result`` returns. Because status is the only memory, a restarted controller resumes exactly where
the last write left it, and an operation recorded without an outcome is treated as sent: it is never
sent twice (the reboot ladder, not a resend, recovers one that never left).

Flow: Registering -> Inspecting[Rescue, Inspect] -> Available -> Provisioning|StandbyPreparing
[Rescue, CheckDisks, Wipe, Install, RebootOS, Configure, MIGReboot, Bootstrap] -> Provisioned|Standby
-> Deprovisioning -> Available|Standby. Error (typed, counted, backed off) and Maintenance from anywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, assert_never

from capi_gpu.api.host import ErrorType, HetznerGPUHost, HetznerGPUHostStatus, HostState, Operation, Step
from capi_gpu.provisioning import ladder
from capi_gpu.provisioning.model import (
    RECORDED,
    Action,
    ActionKind,
    Decision,
    InstallProgress,
    Note,
    Observations,
    PresentedKey,
    Probe,
    SSHOutcome,
    Timing,
)

SENT = "Sent"
DEFERRED = "Deferred"
PIPELINE_STATES = (HostState.INSPECTING, HostState.PROVISIONING, HostState.STANDBY_PREPARING)
# Errors a retry cannot fix without a human.
PERMANENT_ERRORS = frozenset(
    {
        ErrorType.HOST_KEY_MISMATCH,
        ErrorType.DISK_CHECK_FAILED,
        ErrorType.OTHER_LINUX_FOUND,
        ErrorType.REBOOT_TIMEOUT,
        ErrorType.REGISTRATION,
        ErrorType.BOOTSTRAP_FAILED,
    }
)
# Where a retryable failure resumes: installimage can't rerun without a fresh rescue boot (CAPH: "target is busy").
RESUME_AT = {
    Step.INSTALL: Step.RESCUE,
    Step.CHECK_DISKS: Step.RESCUE,
    Step.WIPE: Step.RESCUE,
    Step.INSPECT: Step.RESCUE,
    Step.REBOOT_OS: Step.REBOOT_OS,
    Step.CONFIGURE: Step.CONFIGURE,
    Step.MIG_REBOOT: Step.CONFIGURE,
    Step.RESCUE: Step.RESCUE,
    Step.BOOTSTRAP: Step.BOOTSTRAP,
}


@dataclass(frozen=True)
class Context:
    host: HetznerGPUHost
    obs: Observations
    now: datetime
    timing: Timing
    hostname: str  # the installed OS's hostname, derived by the controller
    wipe_requested: bool = False
    slot_free: bool = True  # the global provisioning limit has room
    permanent_cleared: bool = False  # the permanent-error annotation was removed by a human

    @property
    def status(self) -> HetznerGPUHostStatus:
        return self.host.status


Handler = Callable[[Context], Decision]


def _st(ctx: Context, **changes: Any) -> HetznerGPUHostStatus:
    return ctx.status.model_copy(update=changes, deep=True)


def _goto(
    ctx: Context,
    state: HostState,
    step: Step | None = None,
    *,
    note: Note | None = None,
    requeue: float = 0.5,
    **extra: Any,
) -> Decision:
    status = _st(ctx, state=state, step=step, step_started_at=ctx.now if step else None, **extra)
    return Decision(status, requeue_after=requeue, notes=(note,) if note else ())


def _wait(ctx: Context, seconds: float, note: Note | None = None) -> Decision:
    return Decision(ctx.status.model_copy(deep=True), requeue_after=max(0.2, seconds), notes=(note,) if note else ())


def _act(ctx: Context, kind: ActionKind, standby: bool = False, note: Note | None = None, **extra: Any) -> Decision:
    status = _st(ctx, **extra)
    if kind in RECORDED:
        attempt = 1 + sum(
            1
            for op in status.operations
            if op.name == kind.value and (status.step_started_at is None or op.requested_at >= status.step_started_at)
        )
        ops = [*status.operations, Operation(name=kind.value, attempt=attempt, requested_at=ctx.now)][-32:]
        status = status.model_copy(update={"operations": ops})
    return Decision(status, Action(kind, standby=standby), requeue_after=0.2, notes=(note,) if note else ())


def _fail(ctx: Context, error: ErrorType, message: str, permanent: bool = False) -> Decision:
    permanent = permanent or error in PERMANENT_ERRORS
    count = ctx.status.error_count + 1
    if not permanent and count > ctx.timing.max_retries:
        permanent, message = True, f"{message} (gave up after {ctx.timing.max_retries} retries)"
    resume_step = RESUME_AT.get(ctx.status.step) if ctx.status.step else None
    status = _st(
        ctx,
        state=HostState.ERROR,
        error_type=error,
        error_count=count,
        error_message=message[:2000],
        last_error_at=ctx.now,
        error_permanent=permanent,
        resume_state=ctx.status.state if ctx.status.state in PIPELINE_STATES else None,
        resume_step=resume_step,
    )
    wait = None if permanent else ctx.timing.backoff(count).total_seconds()
    return Decision(status, requeue_after=wait, notes=(Note(error.value, message, warning=True),))


def _op_in_step(ctx: Context, kind: ActionKind) -> Operation | None:
    since = ctx.status.step_started_at
    ops = [
        op
        for op in ctx.status.operations
        if op.name == kind.value and op.outcome != DEFERRED and (since is None or op.requested_at >= since)
    ]
    return ops[-1] if ops else None


def _elapsed(ctx: Context) -> float:
    started = ctx.status.step_started_at or ctx.now
    return (ctx.now - started).total_seconds()


# --- states -------------------------------------------------------------------------------------------


def registering(ctx: Context) -> Decision:
    obs = ctx.obs
    if obs.server_missing:
        return _fail(
            ctx,
            ErrorType.REGISTRATION,
            f"server {ctx.host.spec.server_number} is not in this Robot account",
            permanent=True,
        )
    if obs.server is None:
        return _wait(ctx, ctx.timing.poll)
    facts: dict[str, Any] = {
        "server_name": obs.server.name,
        "ipv4": obs.server.ipv4,
        "ipv6": obs.server.ipv6,
        "datacenter": obs.server.datacenter,
        "product": obs.server.product,
    }
    if obs.reset_types:
        facts["reset_types"] = list(obs.reset_types)
    if obs.server.status != "ready":
        return Decision(_st(ctx, **facts), requeue_after=ctx.timing.poll * 6)
    if ctx.host.spec.maintenance_mode:
        return _goto(ctx, HostState.MAINTENANCE, **facts)
    adopted = obs.claimed and ctx.status.host_keys.os and obs.ssh is not None and obs.ssh.outcome is SSHOutcome.OK
    if adopted and obs.ssh is not None and obs.ssh.hostname == ctx.hostname:
        # Status was lost (clusterctl move): the installed OS answers with our pinned key, so adopt it.
        return _goto(
            ctx,
            HostState.PROVISIONED,
            note=Note("Adopted", "installed OS answered with the pinned key"),
            boot_id=obs.ssh.boot_id,
            **facts,
        )
    if not ctx.slot_free:
        return Decision(
            _st(ctx, **facts), requeue_after=ctx.timing.poll, notes=(Note("Delayed", "provisioning limit"),)
        )
    return _goto(ctx, HostState.INSPECTING, Step.RESCUE, **facts)


def _reinspect(ctx: Context) -> Decision | None:
    if ctx.obs.reinspect and not ctx.obs.claimed and ctx.slot_free:
        return _goto(ctx, HostState.INSPECTING, Step.RESCUE, note=Note("Reinspecting", "inspection requested"))
    return None


def available(ctx: Context) -> Decision:
    spec, obs = ctx.host.spec, ctx.obs
    if (again := _reinspect(ctx)) is not None:
        return again
    if obs.claimed:
        if not ctx.slot_free:
            return _wait(ctx, ctx.timing.poll, Note("Delayed", "provisioning limit reached"))
        return _goto(ctx, HostState.PROVISIONING, Step.RESCUE, reboot_attempts=0)
    if spec.maintenance_mode:
        return _goto(ctx, HostState.MAINTENANCE)
    if spec.standby is not None and ctx.slot_free:
        return _goto(ctx, HostState.STANDBY_PREPARING, Step.RESCUE, reboot_attempts=0)
    return _wait(ctx, ctx.timing.poll * 30)


def standby(ctx: Context) -> Decision:
    spec, obs = ctx.host.spec, ctx.obs
    if (again := _reinspect(ctx)) is not None:
        return again
    if obs.claimed:
        if obs.consumer_prepared == ctx.status.prepared:
            return _goto(
                ctx, HostState.PROVISIONING, Step.BOOTSTRAP, note=Note("StandbyClaimed", "prepared host claimed")
            )
        same_image = obs.consumer_image_key is not None and obs.consumer_image_key == _image_key(ctx.status.prepared)
        step = Step.CONFIGURE if same_image else Step.RESCUE
        return _goto(
            ctx,
            HostState.PROVISIONING,
            step,
            reboot_attempts=0,
            note=Note(
                "StandbyMismatch",
                f"prepared {ctx.status.prepared} differs from the claim; re-preparing from {step.value}",
            ),
        )
    if spec.maintenance_mode or spec.standby is None:
        return _goto(ctx, HostState.AVAILABLE if not spec.maintenance_mode else HostState.MAINTENANCE)
    return _wait(ctx, ctx.timing.poll * 30)


def _image_key(prepared: str | None) -> str | None:
    return prepared.split("/", 1)[0] if prepared and "/" in prepared else None


def provisioned(ctx: Context) -> Decision:
    if ctx.obs.deprovision or not ctx.obs.claimed:
        return _goto(ctx, HostState.DEPROVISIONING, Step.DONE)
    return _wait(ctx, ctx.timing.poll * 30)


def deprovisioning(ctx: Context) -> Decision:
    if _op_in_step(ctx, ActionKind.KUBEADM_RESET) is None and ctx.status.step is Step.DONE:
        return _act(ctx, ActionKind.KUBEADM_RESET, step=Step.DONE)
    spec = ctx.host.spec
    keep = spec.standby is not None and ctx.status.prepared is not None and not ctx.host.spec.maintenance_mode
    state = HostState.STANDBY if keep else (HostState.MAINTENANCE if spec.maintenance_mode else HostState.AVAILABLE)
    return _goto(ctx, state, note=Note("Deprovisioned", f"returned to {state.value}"), error_count=0)


def maintenance(ctx: Context) -> Decision:
    if not ctx.host.spec.maintenance_mode:
        return _goto(ctx, HostState.REGISTERING)
    return _wait(ctx, ctx.timing.poll * 30)


def error(ctx: Context) -> Decision:
    st = ctx.status
    if st.error_permanent:
        if not ctx.permanent_cleared:
            return _wait(ctx, ctx.timing.poll * 30)
        return _goto(
            ctx,
            HostState.REGISTERING,
            note=Note("ErrorCleared", "permanent error cleared by an operator"),
            error_permanent=False,
            error_count=0,
            error_type=None,
            error_message=None,
        )
    due = (st.last_error_at or ctx.now) + ctx.timing.backoff(st.error_count)
    if ctx.now < due:
        return _wait(ctx, (due - ctx.now).total_seconds())
    if st.resume_state in PIPELINE_STATES and st.resume_step is not None:
        if (
            st.resume_state is not HostState.INSPECTING
            and not ctx.obs.claimed
            and st.resume_state is HostState.PROVISIONING
        ):
            return _goto(ctx, HostState.AVAILABLE)
        return _goto(ctx, st.resume_state, st.resume_step, note=Note("Retrying", f"resuming at {st.resume_step.value}"))
    return _goto(ctx, HostState.REGISTERING)


def deleting(ctx: Context) -> Decision:
    return _wait(ctx, ctx.timing.poll)


# --- the pipeline ---------------------------------------------------------------------------------------


def pipeline(ctx: Context) -> Decision:
    if ctx.status.state is HostState.PROVISIONING and not ctx.obs.claimed and ctx.status.step is not Step.BOOTSTRAP:
        return _goto(
            ctx, HostState.DEPROVISIONING, Step.DONE, note=Note("Released", "claim withdrawn during provisioning")
        )
    step = ctx.status.step or Step.RESCUE
    return STEPS[step](ctx)


def step_rescue(ctx: Context) -> Decision:
    obs, st = ctx.obs, ctx.status
    resets = ladder.resets_in_step(st)
    in_rescue = obs.ssh is not None and obs.ssh.outcome is SSHOutcome.OK and obs.ssh.hostname == "rescue"
    if in_rescue and not resets:
        # Still in the rescue system from an earlier step (e.g. inspection): no Robot call needed.
        return _next_after_rescue(ctx, obs.ssh.boot_id if obs.ssh else None)
    activation = _op_in_step(ctx, ActionKind.ACTIVATE_RESCUE)
    if activation is None:
        return _act(ctx, ActionKind.ACTIVATE_RESCUE)
    if activation.outcome is None and not st.host_keys.rescue:
        # Crashed between sending and recording: read the activation back instead of re-sending it.
        if obs.rescue_active and obs.rescue_keys:
            status = _st(ctx)
            status.host_keys.rescue = list(obs.rescue_keys)
            status.operations[-1 - [o.name for o in reversed(status.operations)].index(activation.name)].outcome = SENT
            return Decision(
                status, requeue_after=0.2, notes=(Note("RescueRecovered", "read rescue keys back from Robot"),)
            )
        return _wait(ctx, ctx.timing.poll)
    verdict = ladder.climb(ladder.Target.RESCUE, st, obs, ctx.now, ctx.timing, None, os_reachable=_os_reachable(ctx))
    return _ladder_decision(
        ctx, verdict, on_arrival=lambda: _next_after_rescue(ctx, obs.ssh.boot_id if obs.ssh else None)
    )


def _os_reachable(ctx: Context) -> bool:
    """The rescue pin was refused with our OS key: the installed OS is up and we can log in to reboot it."""
    ssh = ctx.obs.ssh
    return ssh is not None and ssh.outcome is SSHOutcome.KEY_MISMATCH and ssh.presented is PresentedKey.OS


def _next_after_rescue(ctx: Context, boot_id: str | None) -> Decision:
    nxt = Step.INSPECT if ctx.status.state is HostState.INSPECTING else Step.CHECK_DISKS
    return _goto(ctx, ctx.status.state, nxt, boot_id=boot_id)


def _ladder_decision(ctx: Context, v: ladder.Step, on_arrival: Callable[[], Decision]) -> Decision:
    match v.verdict:
        case ladder.Verdict.ARRIVED:
            return on_arrival()
        case ladder.Verdict.WAIT:
            return _wait(ctx, v.wait)
        case ladder.Verdict.ACT:
            assert v.action is not None
            note = (
                Note("Rebooting", f"{v.action.value}: {v.message}".rstrip(": "))
                if v.action is not ActionKind.ACTIVATE_RESCUE
                else None
            )
            return _act(ctx, v.action, note=note)
        case ladder.Verdict.KEY_MISMATCH:
            return _fail(ctx, ErrorType.HOST_KEY_MISMATCH, v.message, permanent=True)
        case ladder.Verdict.WRONG_HOST:
            return _fail(ctx, ErrorType.PROVISIONING, f"unexpected host: {v.message}")
        case ladder.Verdict.TIMEOUT:
            return _fail(ctx, ErrorType.REBOOT_TIMEOUT, v.message, permanent=True)
        case _:
            assert_never(v.verdict)


def step_inspect(ctx: Context) -> Decision:
    return _act(ctx, ActionKind.INSPECT)


def step_check_disks(ctx: Context) -> Decision:
    return _act(ctx, ActionKind.CHECK_DISKS)


def step_wipe(ctx: Context) -> Decision:
    if _op_in_step(ctx, ActionKind.WIPE) is not None:
        return _goto(ctx, ctx.status.state, Step.INSTALL)
    return _act(ctx, ActionKind.WIPE)


def step_install(ctx: Context) -> Decision:
    obs = ctx.obs
    if obs.ssh is None or obs.ssh.outcome is not SSHOutcome.OK or obs.install is None:
        if _elapsed(ctx) > ctx.timing.install:
            return _fail(ctx, ErrorType.INSTALL_FAILED, f"rescue unreachable during installimage: {obs.ssh}")
        return _wait(ctx, ctx.timing.poll)
    match obs.install:
        case InstallProgress.NOT_STARTED:
            # Nothing on the server says it ran, so starting it is not a repeat (the start itself refuses
            # to run twice, and the step's record tells an audit what happened).
            return _act(ctx, ActionKind.START_INSTALL, standby=ctx.status.state is HostState.STANDBY_PREPARING)
        case InstallProgress.RUNNING:
            if _elapsed(ctx) > ctx.timing.install:
                return _fail(
                    ctx, ErrorType.INSTALL_FAILED, f"installimage still running after {ctx.timing.install:.0f}s"
                )
            return _wait(ctx, ctx.timing.poll)
        case InstallProgress.SUCCEEDED:
            return _goto(ctx, ctx.status.state, Step.REBOOT_OS, note=Note("Installed", "installimage finished"))
        case InstallProgress.FAILED:
            return _fail(ctx, ErrorType.INSTALL_FAILED, f"installimage failed: {obs.install_log[-1500:]}")
        case _:
            assert_never(obs.install)


def step_reboot_os(ctx: Context) -> Decision:
    v = ladder.climb(
        ladder.Target.OS, ctx.status, ctx.obs, ctx.now, ctx.timing, ctx.hostname, first=ActionKind.SSH_REBOOT
    )
    return _ladder_decision(
        ctx,
        v,
        on_arrival=lambda: _goto(
            ctx, ctx.status.state, Step.CONFIGURE, boot_id=ctx.obs.ssh.boot_id if ctx.obs.ssh else None
        ),
    )


def step_configure(ctx: Context) -> Decision:
    return _act(ctx, ActionKind.CONFIGURE, standby=ctx.status.state is HostState.STANDBY_PREPARING)


def step_mig_reboot(ctx: Context) -> Decision:
    if not ladder.resets_in_step(ctx.status):
        if ctx.status.reboot_attempts >= ctx.timing.max_mig_reboots:
            return _fail(
                ctx,
                ErrorType.ANSIBLE_FAILED,
                f"MIG mode still needs a reboot after {ctx.status.reboot_attempts} "
                "reboot(s); the GPU does not switch MIG mode",
                permanent=True,
            )
        return _act(
            ctx,
            ActionKind.MIG_REBOOT,
            reboot_attempts=ctx.status.reboot_attempts + 1,
            note=Note("MIGReboot", "MIG mode change needs a reboot"),
        )
    v = ladder.climb(ladder.Target.OS, ctx.status, ctx.obs, ctx.now, ctx.timing, ctx.hostname)
    return _ladder_decision(
        ctx,
        v,
        on_arrival=lambda: _goto(
            ctx, ctx.status.state, Step.CONFIGURE, boot_id=ctx.obs.ssh.boot_id if ctx.obs.ssh else None
        ),
    )


def step_bootstrap(ctx: Context) -> Decision:
    obs = ctx.obs
    if ctx.status.state is HostState.STANDBY_PREPARING:
        return _goto(ctx, HostState.STANDBY, note=Note("StandbyReady", "prepared up to the join"))
    if obs.sentinel:
        return _goto(ctx, HostState.PROVISIONED, note=Note("Bootstrapped", "bootstrap sentinel present"), error_count=0)
    if _op_in_step(ctx, ActionKind.BOOTSTRAP) is None:
        if not obs.bootstrap_ready:
            return _wait(ctx, ctx.timing.poll, Note("WaitingForBootstrapData", "bootstrap data not ready"))
        return _act(ctx, ActionKind.BOOTSTRAP)
    if obs.cloud_init is not None and obs.cloud_init.value == "error":
        return _fail(ctx, ErrorType.BOOTSTRAP_FAILED, "cloud-init reported an error running the bootstrap data")
    if _elapsed(ctx) > ctx.timing.bootstrap:
        return _fail(ctx, ErrorType.BOOTSTRAP_FAILED, f"no bootstrap sentinel after {ctx.timing.bootstrap:.0f}s")
    return _wait(ctx, ctx.timing.poll)


def step_done(ctx: Context) -> Decision:
    return _goto(ctx, HostState.PROVISIONED)


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

STATES: dict[HostState, Handler] = {
    HostState.REGISTERING: registering,
    HostState.INSPECTING: pipeline,
    HostState.AVAILABLE: available,
    HostState.STANDBY_PREPARING: pipeline,
    HostState.STANDBY: standby,
    HostState.PROVISIONING: pipeline,
    HostState.PROVISIONED: provisioned,
    HostState.DEPROVISIONING: deprovisioning,
    HostState.ERROR: error,
    HostState.MAINTENANCE: maintenance,
    HostState.DELETING: deleting,
}


def decide(ctx: Context) -> Decision:
    """The next move from the current status and what was just observed."""
    return STATES[ctx.status.state](ctx)


def probes_for(host: HetznerGPUHost, now: datetime, timing: Timing, claimed: bool) -> frozenset[Probe]:
    """What to look at before deciding; Robot reads only when the decision can use them (budget)."""
    st = host.status
    if st.state is HostState.REGISTERING:
        return frozenset({Probe.ROBOT_SERVER, *([Probe.SSH_OS] if claimed and st.host_keys.os else [])})
    if st.state not in PIPELINE_STATES:
        return frozenset()
    match st.step or Step.RESCUE:
        case Step.RESCUE:
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
        case Step.INSTALL:
            return frozenset({Probe.SSH_RESCUE, Probe.INSTALL})
        case Step.REBOOT_OS | Step.MIG_REBOOT:
            return frozenset({Probe.SSH_OS})
        case Step.BOOTSTRAP:
            return frozenset({Probe.SSH_OS, Probe.BOOTSTRAP})
        case Step.INSPECT | Step.CHECK_DISKS | Step.WIPE | Step.CONFIGURE | Step.DONE:
            return frozenset()
        case _:
            assert_never(st.step)
