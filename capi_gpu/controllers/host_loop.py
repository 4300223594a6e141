"""One host's reconcile loop: load, probe, decide, record, act, record, repeat.

Runs as a kopf daemon per HetznerGPUHost. Each pass does at most one external action; the status write
that records a destructive action happens before the action is sent, and the outcome is written right
after, so a kill at any point resumes from status without repeating it. Waits are ``asyncio.wait_for``
on a wake-up event (a claim by the machine controller) or the decision's requeue time: no busy polling.

Every status write carries the resourceVersion it was derived from. Status has other writers (``capi-gpu
nodes relayout`` records the new layout; a moved host's snapshot is restored), and a whole-status merge
patch from a stale read would silently undo theirs, or they ours: an operation record lost is a destructive
step that may be sent twice. A stale write fails (409) instead: before an action nothing is sent and the
next pass decides again from a fresh read; after one, the outcome is applied again to a fresh read.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from capi_gpu import domain
from capi_gpu.api import conditions as c
from capi_gpu.api.host import HetznerGPUHost, HostState
from capi_gpu.controllers import host_actions, host_move, host_probes, host_vswitch
from capi_gpu.controllers.host_context import (
    HOSTS,
    HostEnv,
    hostname,
    load,
    recorded_cluster_paused,
    standby_cluster_paused,
)
from capi_gpu.kube import Conflict, Obj
from capi_gpu.provisioning import admission, host_conditions, move, outcomes, states, transitions, vswitch_steps
from capi_gpu.provisioning.model import BLOCK_MOVE_WHILE, Action, ActionResult, Decision, Observations, Timing
from capi_gpu.runtime import events, loops, metrics
from capi_gpu.runtime.deps import AccessError, Deps

log = logging.getLogger(__name__)
IDLE = 300.0
OUTCOME_WRITES = 3  # tries to record an action's outcome against other status writers


def _annotations(obj: Obj) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


async def _write(
    deps: Deps,
    obj: Obj,
    host: HetznerGPUHost,
    d: Decision,
    env: HostEnv | None,
    access_error: tuple[str, str] | None = None,
    pausing: bool = False,
    acting: bool = False,
) -> HetznerGPUHost:
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    now = deps.clock()
    circuit = env.robot.account.circuit_reason if env is not None and env.robot.account.circuit_open else None
    secrets = [env.ssh_private, env.os_key.private] if env else []
    status = events.redact_status(host_conditions.derive(host, d.status, now, access_error, circuit), secrets)
    if circuit is not None and host_conditions.robot_reachable(host.status):
        # This host's call tripped the 401 circuit (or is the first to see it): the HetznerGPUCluster's
        # RobotCredentialsValid must say so now, not at its next poll minutes later.
        deps.wakeups.wake_all("cluster", ns)
    host_move.paused_condition(status, pausing, deps)
    host = host_move.versioned(host, await host_move.write_annotations(deps, obj, host, status, acting))
    old_step, old_state = host.status.step, host.status.state
    if status.model_dump() != host.status.model_dump():
        body: Obj = {"status": status.model_dump(by_alias=True, mode="json")}
        if (version := host.metadata.get("resourceVersion")) is not None:
            body["metadata"] = {"resourceVersion": version}  # 409 if anyone wrote since our read
        host = host_move.versioned(host, await deps.kube.patch(HOSTS, name, body, ns, sub="status"))
    metrics.host_state(ns, name, status.state.value)
    if (old_state, old_step) != (status.state, status.step) and host.status.step_started_at is not None:
        took = (now - host.status.step_started_at).total_seconds()
        metrics.observe_step(str(old_step or old_state.value), took)
        events.emit(obj, f"{(old_step or old_state).value}Done", f"{(old_step or old_state).value} took {took:.1f}s")
    for note in d.notes:
        events.emit(obj, note.reason, note.message, note.warning, secrets)
    labels = host_conditions.labels(status)
    current = obj["metadata"].get("labels") or {}
    changed = {k: v for k, v in labels.items() if current.get(k) != v and not (v is None and k not in current)}
    if changed:
        host = host_move.versioned(host, await deps.kube.patch(HOSTS, name, {"metadata": {"labels": changed}}, ns))
    if host.spec.consumer_ref is not None and (old_state, old_step) != (status.state, status.step):
        deps.wakeups.wake("machine", host.spec.consumer_ref.namespace or ns, host.spec.consumer_ref.name)
    key = (ns, name)
    if status.state in transitions.PIPELINE_STATES:
        deps.provisioning.add(key)
    else:
        deps.provisioning.discard(key)
    return host.model_copy(update={"status": status})


def _observations(host: HetznerGPUHost, env: HostEnv) -> Observations:
    consumer = env.consumer
    claimed = consumer is not None and not consumer.standby
    return Observations(
        claimed=claimed,
        consumer_prepared=consumer.prepared if consumer is not None else None,
        consumer_image_key=consumer.image if consumer is not None else None,
        bootstrap_ready=claimed and consumer is not None and consumer.bootstrap is not None,
    )


def _wipe_list(obj: Obj) -> list[str]:
    raw = _annotations(obj).get(domain.ANNOTATION_WIPE_DISK, "")
    return [w.strip() for w in raw.split(",") if w.strip()]


async def reconcile(deps: Deps, namespace: str, name: str) -> float | None:
    """One pass; returns seconds until the next, or None when the host is gone."""
    obj = await deps.kube.get_or_none(HOSTS, name, namespace)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return None
    host = HetznerGPUHost.model_validate(obj)
    if move.status_lost(obj.get("status")):
        restored = await host_move.restore(deps, obj, host)
        if isinstance(restored, float):
            return restored
        host = restored
    if host.status.state is HostState.REGISTERING and await _held_as_duplicate(deps, obj, host):
        return 60.0
    in_flight = move.in_flight(host.status)  # a destructive step open: finish it before pausing
    paused = host_move.paused(obj) or await standby_cluster_paused(deps, obj)
    if paused and not in_flight:
        return await host_move.pause(deps, obj, host)
    try:
        env = await load(deps, host, namespace)
    except AccessError as exc:
        return await _unavailable(deps, obj, host, exc, in_flight)
    pausing = paused or (env.consumer is not None and env.consumer.paused)
    synced = await _vswitch(deps, obj, host, env, pausing, in_flight)
    if isinstance(synced, float):
        return synced
    host, env, gates = synced
    if host.status.host_keys.os != env.os_key.public:
        host.status.host_keys.os = env.os_key.public
    now, timing = deps.clock(), deps.settings.timing
    base = _observations(host, env)
    reinspect = domain.ANNOTATION_REINSPECT in _annotations(obj)
    base = dataclasses.replace(
        base,
        reinspect=reinspect,
        vswitch_before_join=gates.before_join,
        private_network_configure=gates.configure,
        vswitch_before_configure=gates.before_configure,
        vswitch_before_release=gates.before_release,
    )
    obs = await host_probes.observe(deps, host, env, states.probes_for(host, now, timing, base.claimed), base)
    key = (namespace, name)
    slot_free = key in deps.provisioning or len(deps.provisioning) < deps.settings.provisioning_limit
    annotations = _annotations(obj)
    ctx = transitions.Context(
        host,
        obs,
        now,
        timing,
        hostname(host),
        wipe_requested=bool(_wipe_list(obj)),
        slot_free=slot_free,
        permanent_cleared=host.status.error_permanent and domain.ANNOTATION_PERMANENT_ERROR not in annotations,
    )
    decision = states.decide(ctx)
    try:
        # block-move while the action runs too: a move waits for its outcome, which the next write records.
        # Except Configure, which outlasts clusterctl's wait and is handed over by the server's run marker.
        acting = decision.action is not None and decision.action.kind in BLOCK_MOVE_WHILE
        host = await _write(deps, obj, host, decision, env, pausing=pausing, acting=acting)
    except Conflict:
        return 0.5  # written by someone else since our read: nothing recorded, nothing sent; decide again
    if reinspect and decision.status.state is HostState.INSPECTING:
        done = await deps.kube.patch(
            HOSTS, name, {"metadata": {"annotations": {domain.ANNOTATION_REINSPECT: None}}}, namespace
        )
        host = host_move.versioned(host, done)
    if decision.action is None:
        return next_pass(decision, timing)
    result = await host_actions.execute(deps, host, env, decision.action, _wipe_list(obj))
    log.info(
        "host %s/%s: %s -> %s %s",
        namespace,
        name,
        decision.action.kind.value,
        result.outcome.value,
        events.redact(result.message, [env.ssh_private]),
    )
    final = await record_outcome(deps, obj, host, env, decision.action, result, ctx, pausing)
    return next_pass(final, timing)


async def _vswitch(
    deps: Deps, obj: Obj, host: HetznerGPUHost, env: HostEnv, pausing: bool, in_flight: bool
) -> tuple[HetznerGPUHost, HostEnv, vswitch_steps.Gates] | float:
    """Paused (seconds until the next pass), or the host's place on its cluster's vSwitch (``host_vswitch``);
    while pausing, a step in flight finishes but nothing new is sent to the vSwitch: gates from the record."""
    if pausing and not in_flight:
        return await host_move.pause(deps, obj, host)
    if pausing:
        return host, env, vswitch_steps.gates(host.status, None)
    try:
        return await host_vswitch.sync(deps, obj, host, env)
    except AccessError as exc:
        return await _wait_for(deps, obj, host, exc)


async def record_outcome(
    deps: Deps,
    obj: Obj,
    host: HetznerGPUHost,
    env: HostEnv | None,
    action: Action,
    result: ActionResult,
    ctx: transitions.Context,
    pausing: bool = False,
) -> Decision:
    """Write an action's outcome; when another writer got in since our record (409), apply the outcome
    to a fresh read instead of overwriting theirs (or dropping ours)."""
    for attempt in range(OUTCOME_WRITES):
        after = dataclasses.replace(ctx, host=host, now=deps.clock(), permanent_cleared=False)
        final = outcomes.apply_result(after, action, result)
        try:
            await _write(deps, obj, host, final, env, pausing=pausing)
            return final
        except Conflict:
            if attempt + 1 == OUTCOME_WRITES:
                raise
            obj = await deps.kube.get(HOSTS, obj["metadata"]["name"], obj["metadata"]["namespace"])
            host = HetznerGPUHost.model_validate(obj)
    raise AssertionError("unreachable")


async def _held_as_duplicate(deps: Deps, obj: Obj, host: HetznerGPUHost) -> bool:
    """The webhook's one-host-per-server check, for a host written while it was down: an older host of
    the same server keeps it, this one never calls Robot (Ready False, DuplicateServer)."""
    dup = admission.duplicate_server(host, await deps.kube.list(HOSTS))
    if dup is None:
        return False
    await _write(deps, obj, host, Decision(host.status), None, (dup.reason, dup.message))
    events.emit(obj, dup.reason, dup.message, warning=True)
    return True


async def _unavailable(deps: Deps, obj: Obj, host: HetznerGPUHost, exc: AccessError, in_flight: bool) -> float:
    """Mid-move, the consumer or a Secret may be missing while the Cluster recorded at the claim says paused:
    then only Paused. Asked only here: with its consumer loaded, the consumer's own Cluster answers."""
    if not in_flight and await recorded_cluster_paused(deps, obj):
        return await host_move.pause(deps, obj, host)
    return await _wait_for(deps, obj, host, exc)


async def _wait_for(deps: Deps, obj: Obj, host: HetznerGPUHost, exc: AccessError) -> float:
    """Something the pass needs is not there (a Secret, a consumer not moved here yet): say so, touch nothing."""
    before = c.get(host.status.conditions, c.Type.READY)
    await _write(deps, obj, host, Decision(host.status), None, (exc.reason, str(exc)))
    if before is None or before.reason != exc.reason:  # once per cause, not once per pass
        events.emit(obj, exc.reason, str(exc), warning=True)
    return deps.settings.timing.poll * 3 if exc.reason == move.Reason.CONSUMER_MISSING else 60.0


def next_pass(decision: Decision, timing: Timing) -> float:
    """Seconds until the next pass. The state machine says None when nothing is due (a permanent error
    waits for a human); the loop reads None as "the host is gone" and would stop, and then removing the
    permanent-error annotation would never be noticed. So keep looking, as the Error state itself does."""
    return decision.requeue_after if decision.requeue_after is not None else timing.poll * 30


async def run(deps: Deps, namespace: str, name: str, stopped: Any) -> None:
    await loops.run("host", reconcile, deps, namespace, name, stopped)


def state_of(obj: Obj) -> HostState:
    return HostState((obj.get("status") or {}).get("state") or HostState.REGISTERING)
