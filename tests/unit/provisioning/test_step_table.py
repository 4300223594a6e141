"""The steps table is total and is what the code does: a row and a handler per Step, successors and resume
points that are rows, the live view's order the walk of a provisioning host, every exit and every
step-finishing action covered, and the probes, successors and ladder the modules had before the table."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from states_helpers import T0, TIMING, context, decide, host, with_keys
from test_states_table import ROWS

from capi_gpu.api.host import HostState, Step
from capi_gpu.cli import live
from capi_gpu.provisioning import outcomes, pipeline, states, steps
from capi_gpu.provisioning.model import Action, ActionKind, ActionResult, Observations, Probe
from capi_gpu.provisioning.steps import TABLE, Exit
from capi_gpu.provisioning.transitions import PIPELINE_STATES

ORDER = list(TABLE)
EDGES = [(step, way, to) for step, row in TABLE.items() for way, to in row.next.items()]


def test_every_step_has_a_row_and_a_handler() -> None:
    assert set(TABLE) == set(Step) == set(pipeline.STEPS)


@pytest.mark.parametrize(("step", "way", "to"), EDGES, ids=[f"{s.value}-{w.value}" for s, w, _ in EDGES])
def test_a_successor_is_a_step_with_a_row_or_a_state_off_the_pipeline(step: Step, way: Exit, to: Any) -> None:
    assert to in TABLE if isinstance(to, Step) else to not in PIPELINE_STATES


def test_every_step_can_be_finished_and_every_exit_leads_somewhere() -> None:
    assert all(Exit.DONE in row.next for row in TABLE.values())
    assert {way for _, way, _ in EDGES} == set(Exit)


def test_resume_points_are_rows_never_ahead_of_the_failed_step() -> None:
    for step, row in TABLE.items():
        if row.resume_at is not None:
            assert ORDER.index(row.resume_at) <= ORDER.index(step), step
    assert TABLE[Step.DONE].resume_at is None  # deprovisioning's marker: a failure there starts over


def test_the_live_order_is_the_walk_of_a_provisioning_host() -> None:
    walked, todo = set(), [steps.FIRST]
    while todo:
        step = todo.pop()
        if step not in walked:
            walked.add(step)
            todo += [to for way, to in TABLE[step].next.items() if isinstance(to, Step) and way is not Exit.INSPECTING]
    assert set(steps.LIVE) == walked
    assert list(steps.LIVE) == [s for s in ORDER if s in walked]
    back = {(s, to) for s, _, to in EDGES if isinstance(to, Step) and ORDER.index(to) <= ORDER.index(s)}
    assert back == {(Step.MIG_REBOOT, Step.CONFIGURE)}, "the one loop: configure again after the MIG reboot"


def test_the_entry_points_are_live_rows_and_standby_stops_at_the_last() -> None:
    assert {steps.FIRST, steps.RECONFIGURE, steps.JOIN} <= set(steps.LIVE)
    assert steps.LIVE[-1] is steps.JOIN


def test_each_step_finishing_action_finishes_one_step() -> None:
    finishing = [row.finished_by for row in TABLE.values() if row.finished_by is not None]
    assert len(finishing) == len(set(finishing)) == len(steps.FINISHES)


# What selects each exit of an action-finished step: (context, result) arguments.
_SELECT: dict[Exit, tuple[dict[str, Any], dict[str, Any]]] = {
    Exit.DONE: ({}, {}),
    Exit.WIPE_REQUESTED: ({"wipe_requested": True}, {}),
    Exit.REBOOT_NEEDED: ({}, {"reboot_needed": True}),
}
FINISHED = [(k, s, w) for k, s in steps.FINISHES.items() for w in TABLE[s].next]


@pytest.mark.parametrize(("kind", "step", "way"), FINISHED, ids=[f"{k.value}-{w.value}" for k, _, w in FINISHED])
def test_an_action_result_moves_on_where_the_table_says(kind: ActionKind, step: Step, way: Exit) -> None:
    state = HostState.INSPECTING if step is Step.INSPECT else HostState.PROVISIONING
    ctx_kw, result_kw = _SELECT[way]
    ctx = context(with_keys(host(state, step)), Observations(claimed=True), **ctx_kw)
    d = outcomes.apply_result(ctx, Action(kind), ActionResult.ok(**result_kw))
    to = TABLE[step].next[way]
    assert (d.status.state, d.status.step) == ((to, None) if isinstance(to, HostState) else (state, to))


@pytest.mark.parametrize("kind", sorted(set(ActionKind) - set(steps.FINISHES)))
def test_an_action_that_finishes_no_step_leaves_the_step_as_it_is(kind: ActionKind) -> None:
    for step in Step:
        d = outcomes.apply_result(context(host(HostState.PROVISIONING, step)), Action(kind), ActionResult.ok())
        assert (d.status.state, d.status.step) == (HostState.PROVISIONING, step)


def _moves(rows: list[Any]) -> set[tuple[Step, Step | HostState]]:
    """The (step, where it went) moves the handlers make in the state-machine table's rows."""
    seen: set[tuple[Step, Step | HostState]] = set()
    for _, h, obs, ctx, *_ in rows:
        before = h.status
        if before.state not in PIPELINE_STATES:
            continue
        d = decide(h, obs, **ctx)
        step = before.step or steps.FIRST
        if d.status.state is before.state and d.status.step not in (None, before.step):
            seen.add((step, d.status.step))
        elif d.status.step is None and d.status.state not in (HostState.ERROR, HostState.DEPROVISIONING):
            seen.add((step, d.status.state))
    return seen


def test_the_handlers_move_only_along_the_table_and_take_every_edge_not_left_to_an_action() -> None:
    done = with_keys(host(HostState.PROVISIONING, Step.DONE))
    moves = _moves([*ROWS, ("done", done, Observations(claimed=True), {})])
    edges = {(s, to) for s, _, to in EDGES}
    assert moves <= edges
    by_actions = {(s, to) for s, row in TABLE.items() if row.finished_by for to in row.next.values()}
    assert edges - by_actions <= moves


# The probes, the live ladder and the SSH reboot's system as they were before the table held them.
BEFORE_PROBES = {
    Step.RESCUE: {Probe.SSH_RESCUE},
    Step.INSPECT: set(),
    Step.CHECK_DISKS: set(),
    Step.WIPE: set(),
    Step.INSTALL: {Probe.SSH_RESCUE, Probe.INSTALL},
    Step.REBOOT_OS: {Probe.SSH_OS},
    Step.CONFIGURE: set(),
    Step.MIG_REBOOT: {Probe.SSH_OS},
    Step.BOOTSTRAP: {Probe.SSH_OS, Probe.BOOTSTRAP},
    Step.DONE: set(),
}


@pytest.mark.parametrize("state", sorted(PIPELINE_STATES))
@pytest.mark.parametrize("step", [None, *Step])
def test_probes_per_step_are_unchanged(state: HostState, step: Step | None) -> None:
    h = with_keys(host(state, step))
    assert states.probes_for(h, T0, TIMING, claimed=True) == BEFORE_PROBES[step or Step.RESCUE]


def test_rescue_reads_robot_only_to_recover_an_activation_or_before_escalating() -> None:
    Ops = list[tuple[str, timedelta, str | None]]

    def probes(ops: Ops, rescue_keys: bool = True) -> frozenset[Probe]:
        h = with_keys(host(HostState.PROVISIONING, Step.RESCUE, ops=ops), rescue=rescue_keys)
        return states.probes_for(h, T0, TIMING, claimed=True)

    assert probes([], rescue_keys=False) == frozenset()
    assert probes([("activate-rescue", timedelta(seconds=5), None)]) == {Probe.SSH_RESCUE, Probe.ROBOT_RESCUE}
    assert probes([("activate-rescue", timedelta(seconds=5), "Sent")]) == {Probe.SSH_RESCUE}
    just_reset: Ops = [("activate-rescue", timedelta(minutes=2), "Sent"), ("reset-sw", timedelta(minutes=1), "Sent")]
    assert probes(just_reset) == {Probe.SSH_RESCUE}
    long_ago = timedelta(seconds=TIMING.ssh_reboot + 60)
    overdue: Ops = [("activate-rescue", long_ago + timedelta(minutes=1), "Sent"), ("reset-sw", long_ago, "Sent")]
    assert probes(overdue) == {Probe.SSH_RESCUE, Probe.ROBOT_RESCUE}


def test_the_live_ladder_and_the_ssh_reboot_system_are_unchanged() -> None:
    assert live.LADDER == (
        Step.RESCUE,
        Step.CHECK_DISKS,
        Step.WIPE,
        Step.INSTALL,
        Step.REBOOT_OS,
        Step.CONFIGURE,
        Step.MIG_REBOOT,
        Step.BOOTSTRAP,
    )
    assert [s for s, row in TABLE.items() if row.reboots_rescue] == [Step.REBOOT_OS]
