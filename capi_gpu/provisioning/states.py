"""The host state machine: (state, observations, now) -> (next state, action, requeue-after). No I/O.

A state map from state to handler (CAPH's good half) over a closed set of actions and results. The
controller probes what ``probes_for`` names, calls ``decide``, writes the returned status (destructive
operations are recorded *before* they are sent), performs the one action, then writes what
``outcomes.apply_result`` returns. Because status is the only memory, a restarted controller resumes exactly where
the last write left it, and an operation recorded without an outcome is treated as sent: it is never
sent twice (the reboot ladder, not a resend, recovers one that never left).

Flow: Registering -> Inspecting[Rescue, Inspect] -> Available -> Provisioning|StandbyPreparing
[Rescue, CheckDisks, Wipe, Install, RebootOS, Configure, MIGReboot, Bootstrap] -> Provisioned|Standby
-> Deprovisioning -> Available|Standby. Error (typed, counted, backed off) and Maintenance from anywhere.
The lifecycle states are here, the pipeline's steps in ``pipeline`` (their successors, resume points and
probes in the ``steps`` table), the shared helpers in ``transitions``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from capi_gpu.api.host import ErrorType, HetznerGPUHost, HostState, Step
from capi_gpu.provisioning import pipeline, steps
from capi_gpu.provisioning.model import (
    ActionKind,
    Decision,
    Note,
    Probe,
    SSHOutcome,
    Timing,
)
from capi_gpu.provisioning.transitions import (
    PIPELINE_STATES,
    Context,
    Handler,
    act,
    copy_status,
    fail,
    goto,
    op_in_step,
    wait,
)

# --- states -------------------------------------------------------------------------------------------


def registering(ctx: Context) -> Decision:
    obs = ctx.obs
    if obs.server_missing:
        return fail(
            ctx,
            ErrorType.REGISTRATION,
            f"server {ctx.host.spec.server_number} is not in this Robot account",
            permanent=True,
        )
    if obs.server is None:
        return wait(ctx, ctx.timing.poll)
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
        return Decision(copy_status(ctx, **facts), requeue_after=ctx.timing.poll * 6)
    if ctx.host.spec.maintenance_mode:
        return goto(ctx, HostState.MAINTENANCE, **facts)
    adopted = obs.claimed and ctx.status.host_keys.os and obs.ssh is not None and obs.ssh.outcome is SSHOutcome.OK
    if adopted and obs.ssh is not None and obs.ssh.hostname == ctx.hostname:
        # Status was lost (clusterctl move): the installed OS answers with our pinned key, so adopt it.
        return goto(
            ctx,
            HostState.PROVISIONED,
            note=Note("Adopted", "installed OS answered with the pinned key"),
            boot_id=obs.ssh.boot_id,
            **facts,
        )
    if obs.claimed and ctx.status.host_keys.os:
        # A claimed host with a pinned OS key may be a live node whose status was lost: inspecting it would
        # boot it into rescue. Machines claim only Available hosts, so wait for the OS to answer (or a human).
        why = obs.ssh.message or obs.ssh.outcome.value if obs.ssh is not None else "not probed"
        return Decision(
            copy_status(ctx, **facts),
            requeue_after=ctx.timing.poll * 6,
            notes=(Note("AdoptionWaiting", f"claimed host: its installed OS did not answer as itself ({why})", True),),
        )
    if not ctx.slot_free:
        return Decision(
            copy_status(ctx, **facts), requeue_after=ctx.timing.poll, notes=(Note("Delayed", "provisioning limit"),)
        )
    return goto(ctx, HostState.INSPECTING, steps.FIRST, **facts)


def _reinspect(ctx: Context) -> Decision | None:
    if ctx.obs.reinspect and not ctx.obs.claimed and ctx.slot_free:
        return goto(ctx, HostState.INSPECTING, steps.FIRST, note=Note("Reinspecting", "inspection requested"))
    return None


def available(ctx: Context) -> Decision:
    spec, obs = ctx.host.spec, ctx.obs
    if (again := _reinspect(ctx)) is not None:
        return again
    if obs.claimed:
        if not ctx.slot_free:
            return wait(ctx, ctx.timing.poll, Note("Delayed", "provisioning limit reached"))
        return goto(ctx, HostState.PROVISIONING, steps.FIRST, reboot_attempts=0)
    if spec.maintenance_mode:
        return goto(ctx, HostState.MAINTENANCE)
    if spec.standby is not None and ctx.slot_free:
        return goto(ctx, HostState.STANDBY_PREPARING, steps.FIRST, reboot_attempts=0)
    return wait(ctx, ctx.timing.poll * 30)


def standby(ctx: Context) -> Decision:
    spec, obs = ctx.host.spec, ctx.obs
    if (again := _reinspect(ctx)) is not None:
        return again
    if obs.claimed:
        if obs.consumer_prepared == ctx.status.prepared and obs.private_network_configure:
            # Prepared without a cluster, so without its VLAN interface: Configure writes it, then the join.
            note = Note("StandbyClaimed", "prepared host claimed; Configure runs again for the private network")
            return goto(ctx, HostState.PROVISIONING, steps.RECONFIGURE, reboot_attempts=0, note=note)
        if obs.consumer_prepared == ctx.status.prepared:
            return goto(ctx, HostState.PROVISIONING, steps.JOIN, note=Note("StandbyClaimed", "prepared host claimed"))
        same_image = obs.consumer_image_key is not None and obs.consumer_image_key == _image_key(ctx.status.prepared)
        step = steps.RECONFIGURE if same_image else steps.FIRST
        return goto(
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
        return goto(ctx, HostState.AVAILABLE if not spec.maintenance_mode else HostState.MAINTENANCE)
    return wait(ctx, ctx.timing.poll * 30)


def _image_key(prepared: str | None) -> str | None:
    return prepared.split("/", 1)[0] if prepared and "/" in prepared else None


def provisioned(ctx: Context) -> Decision:
    if ctx.obs.deprovision or not ctx.obs.claimed:
        return goto(ctx, HostState.DEPROVISIONING, Step.DONE)
    return wait(ctx, ctx.timing.poll * 30)


def deprovisioning(ctx: Context) -> Decision:
    if op_in_step(ctx, ActionKind.KUBEADM_RESET) is None and ctx.status.step is Step.DONE:
        return act(ctx, ActionKind.KUBEADM_RESET, step=Step.DONE)
    if ctx.obs.vswitch_before_release is not None:  # its address is free only once the server left the vSwitch
        return wait(ctx, ctx.timing.poll, Note("LeavingVSwitch", ctx.obs.vswitch_before_release))
    spec = ctx.host.spec
    keep = spec.standby is not None and ctx.status.prepared is not None and not ctx.host.spec.maintenance_mode
    state = HostState.STANDBY if keep else (HostState.MAINTENANCE if spec.maintenance_mode else HostState.AVAILABLE)
    return goto(ctx, state, note=Note("Deprovisioned", f"returned to {state.value}"), error_count=0)


def maintenance(ctx: Context) -> Decision:
    if not ctx.host.spec.maintenance_mode:
        return goto(ctx, HostState.REGISTERING)
    return wait(ctx, ctx.timing.poll * 30)


def error(ctx: Context) -> Decision:
    st = ctx.status
    if st.error_permanent:
        if not ctx.permanent_cleared:
            return wait(ctx, ctx.timing.poll * 30)
        return goto(
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
        return wait(ctx, (due - ctx.now).total_seconds())
    if st.resume_state in PIPELINE_STATES and st.resume_step is not None:
        if (
            st.resume_state is not HostState.INSPECTING
            and not ctx.obs.claimed
            and st.resume_state is HostState.PROVISIONING
        ):
            return goto(ctx, HostState.AVAILABLE)
        return goto(ctx, st.resume_state, st.resume_step, note=Note("Retrying", f"resuming at {st.resume_step.value}"))
    return goto(ctx, HostState.REGISTERING)


def deleting(ctx: Context) -> Decision:
    return wait(ctx, ctx.timing.poll)


STATES: dict[HostState, Handler] = {
    HostState.REGISTERING: registering,
    HostState.INSPECTING: pipeline.pipeline,
    HostState.AVAILABLE: available,
    HostState.STANDBY_PREPARING: pipeline.pipeline,
    HostState.STANDBY: standby,
    HostState.PROVISIONING: pipeline.pipeline,
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
    return steps.TABLE[st.step or steps.FIRST].probes(st, now, timing)
