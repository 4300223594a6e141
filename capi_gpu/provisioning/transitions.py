"""Shared vocabulary of the host state machine's handlers: the decision context and the few ways a
handler answers (go to a step, leave one where the ``steps`` table says, wait, act with the operation
recorded first, fail typed and backed off).

``states`` (lifecycle states) and ``pipeline`` (provisioning steps) both build their decisions from these,
so the record-before-send rule and the error policy live in exactly one place. Pure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from capi_gpu.api.host import ErrorType, HetznerGPUHost, HetznerGPUHostStatus, HostState, Operation, Step
from capi_gpu.provisioning import steps
from capi_gpu.provisioning.model import (
    RECORDED,
    Action,
    ActionKind,
    Decision,
    Note,
    Observations,
    Timing,
)

SENT = "Sent"
DEFERRED = "Deferred"
NOT_SENT = "NotSent"  # recorded, then proven never to have left: a crash came between the record and the send
INTERRUPTED = "Interrupted"  # recorded, outcome unknown after a crash, and safe to repeat (wipefs)
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


def copy_status(ctx: Context, **changes: Any) -> HetznerGPUHostStatus:
    return ctx.status.model_copy(update=changes, deep=True)


def goto(
    ctx: Context,
    state: HostState,
    step: Step | None = None,
    *,
    note: Note | None = None,
    requeue: float = 0.5,
    **extra: Any,
) -> Decision:
    status = copy_status(ctx, state=state, step=step, step_started_at=ctx.now if step else None, **extra)
    return Decision(status, requeue_after=requeue, notes=(note,) if note else ())


def leave(
    ctx: Context, step: Step, way: steps.Exit = steps.Exit.DONE, *, note: Note | None = None, **extra: Any
) -> Decision:
    """Finish ``step`` by ``way``: on to the step the table names, or out of the pipeline to its state."""
    to = steps.successor(step, way)
    if isinstance(to, HostState):
        return goto(ctx, to, note=note, **extra)
    return goto(ctx, ctx.status.state, to, note=note, **extra)


def wait(ctx: Context, seconds: float, note: Note | None = None) -> Decision:
    return Decision(ctx.status.model_copy(deep=True), requeue_after=max(0.2, seconds), notes=(note,) if note else ())


MAX_OPERATIONS = 32  # the CRD's bound on status.operations


def _bounded(ops: list[Operation]) -> list[Operation]:
    """At most ``MAX_OPERATIONS``, dropping the oldest deferred ones first (nothing was sent for them), then
    the oldest: a host waiting out a moved Configure run defers every minute, and must not push the source's
    recorded run (the one it adopts) out of its status."""
    ops = list(ops)
    while len(ops) > MAX_OPERATIONS:
        drop = next((i for i, op in enumerate(ops[:-1]) if op.outcome == DEFERRED), 0)
        del ops[drop]
    return ops


def act(ctx: Context, kind: ActionKind, standby: bool = False, note: Note | None = None, **extra: Any) -> Decision:
    status = copy_status(ctx, **extra)
    if kind in RECORDED:
        attempt = 1 + sum(
            1
            for op in status.operations
            if op.name == kind.value and (status.step_started_at is None or op.requested_at >= status.step_started_at)
        )
        ops = _bounded([*status.operations, Operation(name=kind.value, attempt=attempt, requested_at=ctx.now)])
        status = status.model_copy(update={"operations": ops})
    return Decision(status, Action(kind, standby=standby), requeue_after=0.2, notes=(note,) if note else ())


def fail(ctx: Context, error: ErrorType, message: str, permanent: bool = False) -> Decision:
    permanent = permanent or error in PERMANENT_ERRORS
    count = ctx.status.error_count + 1
    if not permanent and count > ctx.timing.max_retries:
        permanent, message = True, f"{message} (gave up after {ctx.timing.max_retries} retries)"
    resume_step = steps.TABLE[ctx.status.step].resume_at if ctx.status.step else None
    status = copy_status(
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


def op_in_step(ctx: Context, kind: ActionKind) -> Operation | None:
    since = ctx.status.step_started_at
    ops = [
        op
        for op in ctx.status.operations
        if op.name == kind.value
        and op.outcome not in (DEFERRED, NOT_SENT, INTERRUPTED)
        and (since is None or op.requested_at >= since)
    ]
    return ops[-1] if ops else None


def settle(ctx: Context, op: Operation, outcome: str) -> Context:
    """``ctx`` with the recorded-but-open ``op`` given ``outcome`` (found by name and request time)."""
    status = copy_status(ctx)
    for candidate in reversed(status.operations):
        if candidate.name == op.name and candidate.requested_at == op.requested_at and candidate.outcome is None:
            candidate.outcome = outcome
            break
    return replace(ctx, host=ctx.host.model_copy(update={"status": status}))


def elapsed(ctx: Context) -> float:
    started = ctx.status.step_started_at or ctx.now
    return (ctx.now - started).total_seconds()
