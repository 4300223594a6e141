"""What an action's result does to the host status: the second half of the pure state machine.

``states.decide`` records an operation before it is sent; ``apply_result`` records how it ended and
moves to the next step. Split from ``states`` so each stays one screenful per concern, and so table
tests can feed results without building observations. Which way an action's result finishes its step is
decided here; where that leads is the ``steps`` table's.
"""

from __future__ import annotations

from typing import assert_never

from capi_gpu.api.host import HetznerGPUHostStatus, HostState
from capi_gpu.provisioning import steps, transitions
from capi_gpu.provisioning.model import RECORDED, Action, ActionKind, ActionResult, Decision, Note, Outcome


def _mark(status: HetznerGPUHostStatus, kind: ActionKind, outcome: str, ctx: transitions.Context) -> None:
    for op in reversed(status.operations):
        if op.name == kind.value and op.outcome is None:
            op.outcome = outcome[:200]
            op.completed_at = ctx.now
            return


def apply_result(ctx: transitions.Context, action: Action, result: ActionResult) -> Decision:
    """``ctx.host.status`` is the status written before the action (with the operation recorded)."""
    status = ctx.status.model_copy(deep=True)
    kind = action.kind
    if result.outcome is Outcome.DEFERRED:
        if kind in RECORDED:
            _mark(status, kind, transitions.DEFERRED, ctx)
        wait = result.retry_after if result.retry_after is not None else ctx.timing.poll
        note = Note("Delayed", f"{kind.value} deferred: {result.message}") if result.message else None
        return Decision(status, requeue_after=max(0.2, wait), notes=(note,) if note else ())
    if result.outcome is Outcome.FAILED:
        if kind in RECORDED:
            _mark(status, kind, f"Failed: {result.message}", ctx)
        if kind is ActionKind.KUBEADM_RESET:
            # Best effort: a host we can't reach is reset by its next install anyway.
            return Decision(status, requeue_after=0.2, notes=(Note("KubeadmResetFailed", result.message, True),))
        assert result.error_type is not None, "a failed result names its error type"
        failed_ctx = transitions.Context(
            ctx.host.model_copy(update={"status": status}),
            ctx.obs,
            ctx.now,
            ctx.timing,
            ctx.hostname,
            ctx.wipe_requested,
            ctx.slot_free,
            ctx.permanent_cleared,
        )
        return transitions.fail(failed_ctx, result.error_type, result.message, result.permanent)
    if kind in RECORDED:
        _mark(status, kind, transitions.SENT, ctx)
    return _advance(ctx, status, action, result)


def _finish(
    ctx: transitions.Context, status: HetznerGPUHostStatus, kind: ActionKind, way: steps.Exit, note: Note | None
) -> Decision:
    """Leave the step ``kind`` finishes by ``way``, to where the ``steps`` table says."""
    to = steps.successor(steps.FINISHES[kind], way)
    if isinstance(to, HostState):
        status.state, status.step = to, None
    else:
        status.step = to
    status.step_started_at = ctx.now if status.step else None
    return Decision(status, requeue_after=0.2, notes=(note,) if note else ())


def _advance(ctx: transitions.Context, status: HetznerGPUHostStatus, action: Action, result: ActionResult) -> Decision:
    kind = action.kind

    def finish(way: steps.Exit = steps.Exit.DONE, note: Note | None = None) -> Decision:
        return _finish(ctx, status, kind, way, note)

    match kind:
        case ActionKind.ACTIVATE_RESCUE:
            status.host_keys.rescue = list(result.rescue_keys)
            return Decision(status, requeue_after=0.2)
        case ActionKind.RESET_SW | ActionKind.RESET_HW | ActionKind.SSH_REBOOT | ActionKind.MIG_REBOOT:
            return Decision(status, requeue_after=ctx.timing.reboot_debounce)
        case ActionKind.INSPECT:
            status.hardware = result.hardware
            status.error_count = 0
            return finish(note=Note("Inspected", result.message or "hardware inspected"))
        case ActionKind.CHECK_DISKS:
            return finish(steps.Exit.WIPE_REQUESTED if ctx.wipe_requested else steps.Exit.DONE)
        case ActionKind.WIPE:
            return finish(note=Note("Wiped", result.message or "disks wiped"))
        case ActionKind.START_INSTALL:
            note = Note("Installing", result.message or "installimage started")  # says which image, and why
            return Decision(status, requeue_after=ctx.timing.poll, notes=(note,))
        case ActionKind.CONFIGURE:
            if result.reboot_needed:
                return finish(steps.Exit.REBOOT_NEEDED, Note("RebootNeeded", "MIG mode change needs a reboot"))
            status.mig_devices = sorted(result.mig_devices)
            status.mig_instances = list(result.mig_instances)
            status.layout = result.layout
            status.prepared = result.prepared
            status.error_count = 0
            return finish(note=Note("Configured", result.message or "GPU stack configured"))
        case ActionKind.BOOTSTRAP:
            return Decision(status, requeue_after=ctx.timing.poll, notes=(Note("Bootstrapping", "cloud-init started"),))
        case ActionKind.KUBEADM_RESET:
            return Decision(status, requeue_after=0.2)
        case _:
            assert_never(kind)
